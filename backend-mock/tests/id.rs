//! Joining by a unique id in one process: threads as ranks; rank 0 joins where the id was
//! made, once; bytes that are not an id are refused.
#![cfg(target_os = "linux")]

use std::time::Duration;

use unicomm_core::{Comm, DeviceStream, Error, ReduceOp};
use unicomm_mock::{init_rank, unique_id, MockConfig};

fn config() -> MockConfig {
    MockConfig {
        timeout: Duration::from_secs(10),
        ..MockConfig::default()
    }
}

#[test]
fn threads_join_by_id_and_reduce() {
    let id = unique_id().unwrap();
    let out: Vec<Vec<f32>> = std::thread::scope(|s| {
        let joins: Vec<_> = (0..3)
            .map(|r| {
                s.spawn(move || {
                    let c = Comm::from_backend(init_rank(&id, r, 3, config()).unwrap());
                    let st = c.create_stream().unwrap();
                    let mut b = c.alloc::<f32>(2).unwrap();
                    b.copy_from_host(&[r as f32; 2], &st).unwrap();
                    c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
                    let v = b.copy_to_host(&st).unwrap();
                    st.synchronize().unwrap();
                    c.finalize().unwrap();
                    v
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    assert!(out.iter().all(|v| v == &vec![3.0, 3.0]), "{out:?}");
}

// The maker's process serves the world (as NCCL's id maker runs its bootstrap root): a
// second rank 0, or rank 0 of an id made elsewhere, is refused at once, not a hang.
#[test]
fn rank_zero_joins_once_where_the_id_was_made() {
    let id = unique_id().unwrap();
    let first = init_rank(&id, 0, 1, config()).unwrap();
    match init_rank(&id, 0, 1, config()) {
        Err(Error::InvalidArgument { argument, reason }) => {
            assert_eq!(argument, "rank");
            assert!(reason.contains("process that made the id"), "{reason}");
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    drop(first);
    let mut garbage = [7u8; 128];
    garbage[..8].copy_from_slice(b"notmock!");
    assert!(matches!(
        init_rank(&garbage, 1, 2, config()),
        Err(Error::Bootstrap { .. })
    ));
    assert!(matches!(
        init_rank(&id, 2, 2, config()),
        Err(Error::InvalidArgument { .. })
    ));
}
