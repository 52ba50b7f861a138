//! Collectives of one communicator from several threads at once pair up across the ranks by
//! arrival, not in program order; with `UNICOMM_CHECK_COLLECTIVES=1` a call that overlaps
//! another on its communicator is refused. Alone in its binary: it sets the variable.

use std::time::Duration;

use unicomm_core::{Error, ReduceOp};
use unicomm_mock::local_comms;

#[test]
fn a_collective_overlapping_another_on_its_communicator_is_refused_under_the_check() {
    std::env::set_var("UNICOMM_CHECK_COLLECTIVES", "1");
    let comms = local_comms(2).unwrap();
    let (c0, c1) = (&comms[0], &comms[1]);
    std::thread::scope(|s| {
        // Rank 0's first thread is in a split (collective, it waits for rank 1).
        let split = s.spawn(|| c0.split(Some(0), 0).map(|c| c.is_some()));
        std::thread::sleep(Duration::from_millis(150));
        // Its second thread calls an all-reduce meanwhile: refused, nothing enqueued.
        let st = c0.create_stream().unwrap();
        let mut b = c0.alloc::<f32>(4).unwrap();
        match c0.all_reduce_in_place(&mut b, ReduceOp::Sum, &st) {
            Err(Error::InvalidArgument { argument, reason }) => {
                assert_eq!(argument, "comm");
                assert!(reason.contains("several threads"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        std::thread::sleep(Duration::from_millis(300));
        assert!(c1.split(Some(0), 0).unwrap().is_some());
        assert!(split.join().unwrap().unwrap());
    });
    // One at a time is fine.
    let out = unicomm_core::each_rank(comms, |c| {
        let st = c.create_stream()?;
        let mut b = c.alloc::<f32>(4)?;
        b.copy_from_host(&[1.0; 4], &st)?;
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)?;
        b.copy_to_host(&st)
    })
    .unwrap();
    assert!(out.iter().all(|v| v == &[2.0; 4]));
}
