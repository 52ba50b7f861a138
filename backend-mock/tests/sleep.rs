//! An engine's sleep mode and a communicator's self-description on the mock, with NCCL's
//! rules: suspend (NCCL 2.29.7) refuses every call until resume, which gives the
//! communicator back; properties (NCCL 2.29.2); both `Unsupported` naming the release where
//! the target predates it.

use unicomm_core::{Comm, DeviceStream, Error, ReduceOp, Result};
use unicomm_mock::{local_comms_with, MockComm, MockConfig};

fn comms(world: usize, target: &str) -> Vec<Comm<MockComm>> {
    local_comms_with(world, MockConfig::standing_for(target).unwrap()).unwrap()
}

/// Every rank's sum of `rank + 1` (an all-reduce on every rank, on threads).
fn sums(cs: &[Comm<MockComm>]) -> Vec<Result<f32>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = cs
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let st = c.create_stream()?;
                    let mut b = c.alloc::<f32>(2)?;
                    b.copy_from_host(&[(c.rank() + 1) as f32; 2], &st)?;
                    c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)?;
                    st.synchronize()?;
                    Ok(b.copy_to_host(&st)?[0])
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// NCCL's rule: a suspended communicator is not used. Every call but resume, the memory
/// statistics, finalize and abort is refused naming the suspension, and after resume the
/// world reduces as before.
#[test]
fn a_suspended_communicator_refuses_calls_until_it_is_resumed() {
    let cs = comms(2, "nccl-2.32.3");
    assert_eq!(summed(&cs), [3.0, 3.0]);
    for c in &cs {
        c.suspend().unwrap();
        assert!(c.mem_stats().unwrap().suspended);
    }
    match c_call(&cs[0]) {
        Err(Error::InvalidArgument { reason, .. }) => {
            assert!(reason.contains("suspended"), "{reason}")
        }
        other => panic!("a call on a suspended communicator: {other:?}"),
    }
    assert!(matches!(
        cs[0].suspend(),
        Err(Error::InvalidArgument { .. })
    ));
    for c in &cs {
        c.resume().unwrap();
        assert!(!c.mem_stats().unwrap().suspended);
    }
    match cs[0].resume() {
        Err(Error::InvalidArgument { reason, .. }) => {
            assert!(reason.contains("not suspended"), "{reason}")
        }
        other => panic!("resuming a live communicator: {other:?}"),
    }
    assert_eq!(summed(&cs), [3.0, 3.0]);
}

/// Every rank's all-reduce, each expected to succeed.
fn summed(cs: &[Comm<MockComm>]) -> Vec<f32> {
    sums(cs).into_iter().map(Result::unwrap).collect()
}

/// A call on one rank that needs no peer: an allocation.
fn c_call(c: &Comm<MockComm>) -> Result<()> {
    c.alloc::<f32>(4).map(drop)
}

/// A suspended communicator can still be finalized (dropped) and aborted.
#[test]
fn a_suspended_communicator_can_be_ended() {
    let mut cs = comms(2, "nccl-2.32.3");
    for c in &cs {
        c.suspend().unwrap();
    }
    cs[1].abort().unwrap();
    drop(cs.pop());
    // Rank 0 finalizes a world whose rank 1 aborted: it ends either way, never refused
    // for being suspended.
    let first = cs.pop().unwrap();
    if let Err(e) = first.finalize() {
        assert!(!e.to_string().contains("suspended"), "{e}");
    }
}

#[test]
fn properties_name_each_rank_and_world() {
    let cs = comms(3, "nccl-2.32.3");
    for (r, c) in cs.iter().enumerate() {
        let p = c.properties().unwrap();
        assert_eq!((p.rank, p.world), (r, 3));
        assert!(!p.device_api && !p.multimem);
    }
}

/// Where the target predates them: `Unsupported` naming the release, in the NCCL-API
/// backends' words.
#[test]
fn before_their_release_the_calls_are_unsupported_naming_it() {
    let cs = comms(1, "nccl-2.28.9");
    for r in [cs[0].suspend(), cs[0].resume(), cs[0].mem_stats().map(drop)] {
        match r {
            Err(Error::Unsupported { what, needs, .. }) => {
                assert!(
                    what.contains("ncclCommSuspend") && needs.contains("2.29.7"),
                    "{what} {needs}"
                )
            }
            other => panic!("{other:?}"),
        }
    }
    match cs[0].properties() {
        Err(Error::Unsupported { what, needs, .. }) => {
            assert!(
                what.contains("ncclCommQueryProperties") && needs.contains("2.29.2"),
                "{what} {needs}"
            )
        }
        other => panic!("{other:?}"),
    }
    // From the release on, the same calls run.
    let c = &comms(1, "nccl-2.29.7")[0];
    c.suspend().unwrap();
    c.resume().unwrap();
    assert!(c.properties().is_ok());
}

/// The conformance suite's sleep-mode case, the same the GPU backends pass: the full mode on
/// a 2.32.3 target, `Unsupported` on 2.28.9; worlds of 1 and 3.
#[test]
fn the_suites_sleep_mode_case_passes_on_both_sides_of_the_release() {
    for w in [1, 3] {
        let seen =
            unicomm_conformance::sleep_mode_and_properties(&comms(w, "nccl-2.32.3")).unwrap();
        assert!(seen.iter().all(|&s| s == (true, true)), "{seen:?}");
        let seen =
            unicomm_conformance::sleep_mode_and_properties(&comms(w, "nccl-2.28.9")).unwrap();
        assert!(seen.iter().all(|&s| s == (false, false)), "{seen:?}");
    }
}
