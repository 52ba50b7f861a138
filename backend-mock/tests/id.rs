//! Joining by a unique id in one process: threads as ranks; rank 0 joins where the id was
//! made, once; bytes that are not an id are refused.
#![cfg(target_os = "linux")]

use std::time::Duration;

use unicomm_core::{Comm, DeviceStream, Error, ReduceOp};
use unicomm_mock::{init_rank, unique_id, MockConfig};

/// The tests of this binary one at a time: the test that makes 300 ids gives up the oldest
/// unjoined ones, which are another test's while they run beside it.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn config() -> MockConfig {
    MockConfig {
        timeout: Duration::from_secs(10),
        ..MockConfig::default()
    }
}

#[test]
fn threads_join_by_id_and_reduce() {
    let _serial = serial();
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
    let _serial = serial();
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
    // Rank 2 of 2 is refused by the rank's rule, not the world's bounds.
    match init_rank(&id, 2, 2, config()) {
        Err(Error::InvalidArgument { argument, reason }) => {
            assert_eq!(argument, "rank");
            assert!(reason.contains("below the world size"), "{reason}");
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
}

/// Ranks told different world sizes (rank 0 and 1 a world of 3, rank 2 one of 4) do not
/// all return `Ok`: the rank told another size is refused at once naming both sizes, and
/// the ranks of rank 0's world fail at their next collective naming it, well before their
/// deadline (20 s here), not a `Timeout` and never a panic of a stream worker.
#[test]
fn ranks_told_different_world_sizes_are_refused_at_once_naming_both() {
    let _serial = serial();
    let config = MockConfig {
        timeout: Duration::from_secs(20),
        ..MockConfig::default()
    };
    let id = unique_id().unwrap();
    let t = std::time::Instant::now();
    let out: Vec<Result<(), Error>> = std::thread::scope(|s| {
        let joins: Vec<_> = [(0, 3), (1, 3), (2, 4)]
            .into_iter()
            .map(|(r, w)| {
                let config = config.clone();
                s.spawn(move || {
                    let c = Comm::from_backend(init_rank(&id, r, w, config)?);
                    let st = c.create_stream()?;
                    let mut b = c.alloc::<f32>(2)?;
                    c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)?;
                    st.synchronize()
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "{:?}: {out:?}",
        t.elapsed()
    );
    match &out[2] {
        Err(Error::InvalidArgument { reason, .. }) => {
            assert!(
                reason.contains("world of 4") && reason.contains("one of 3"),
                "{reason}"
            )
        }
        other => panic!("rank 2: {other:?}"),
    }
    // Rank 0's world fails: rank 0 names the sizes (its hub saw the refused hello); rank 1
    // names them too, or, where rank 0's process side went first, the hub it lost.
    let errs: Vec<String> = out[..2]
        .iter()
        .map(|o| {
            o.as_ref()
                .expect_err("a world that cannot complete")
                .to_string()
        })
        .collect();
    assert!(errs[0].contains("world of 4"), "rank 0: {}", errs[0]);
    assert!(
        errs[1].contains("world of 4") || errs[1].contains("hub"),
        "rank 1: {}",
        errs[1]
    );
}

/// A rank claimed twice, or outside rank 0's world, is refused at once naming the rule,
/// not "cannot reach the hub" after the deadline.
#[test]
fn a_rank_claimed_twice_or_outside_the_world_is_refused_naming_the_rule() {
    let _serial = serial();
    let id = unique_id().unwrap();
    let zero = Comm::from_backend(init_rank(&id, 0, 3, config()).unwrap());
    let one = Comm::from_backend(init_rank(&id, 1, 3, config()).unwrap());
    let t = std::time::Instant::now();
    match init_rank(&id, 1, 3, config()) {
        Err(Error::InvalidArgument { reason, .. }) => {
            assert!(reason.contains("claimed"), "{reason}")
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // Rank 2 never joins: the world is aborted rather than waited for at the drops.
    let _ = (zero.abort(), one.abort());
}

/// Ids made and never joined hold at most `MAX_UNJOINED_IDS` listening sockets (300 ids
/// made in a loop once held 300 descriptors): the oldest beyond that is given up, and its
/// rank 0 is refused naming why; the newest still works.
#[test]
fn ids_made_and_never_joined_hold_a_bounded_number_of_sockets() {
    let _serial = serial();
    let fds = || {
        std::fs::read_dir("/proc/self/fd")
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let before = fds();
    let ids: Vec<_> = (0..300).map(|_| unique_id().unwrap()).collect();
    let grew = fds().saturating_sub(before);
    assert!(
        // The other tests of this binary open some descriptors meanwhile.
        grew <= unicomm_mock::MAX_UNJOINED_IDS + 64,
        "{grew} descriptors for 300 ids never joined"
    );
    match init_rank(&ids[0], 0, 1, config()) {
        Err(Error::InvalidArgument { reason, .. }) => {
            assert!(reason.contains("given up"), "{reason}")
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    let last = Comm::from_backend(init_rank(&ids[299], 0, 1, config()).unwrap());
    last.finalize().unwrap();
}
