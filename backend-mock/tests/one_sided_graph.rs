//! One-sided operations captured in a graph on the mock, with NCCL's rules: from 2.30.3
//! (its copy-engine path gives graphs signals of their own), exact over many replays in
//! worlds 1-4; refused naming 2.30.3 by a target before it; a graph's signals and an
//! eager call's never counted by the other kind's wait (refused naming the rule, where
//! NCCL would hang).

use std::time::Duration;

use unicomm_core::graph::Graph;
use unicomm_core::{Comm, DeviceStream, Error, SignalWait};
use unicomm_mock::{local_comms_with, MockComm, MockConfig};

fn comms(world: usize, target: &str) -> Vec<Comm<MockComm>> {
    let config = MockConfig::standing_for(target).unwrap();
    local_comms_with(world, config.within(Duration::from_secs(5))).unwrap()
}

#[test]
fn a_captured_ring_moves_each_replays_block_exactly_from_2_30_3_on() {
    for (w, replays) in [(1, 20), (2, 300), (3, 100), (4, 50)] {
        for target in ["nccl-2.32.3", "nccl-2.30.3"] {
            let seen = unicomm_conformance::one_sided_in_graph(&comms(w, target), replays);
            assert_eq!(seen.unwrap(), vec![true; w], "world {w} on {target}");
        }
    }
}

/// NCCL 2.29 bakes the host's running signal count into a captured wait, so a replay's
/// wait would not wait: refused there, naming the release that captures them.
#[test]
fn before_2_30_3_a_capture_is_unsupported_naming_it() {
    let seen = unicomm_conformance::one_sided_in_graph(&comms(2, "nccl-2.29.7"), 1).unwrap();
    assert_eq!(seen, vec![false, false]);
    let cs = comms(1, "nccl-2.29.7");
    let c = &cs[0];
    let st = c.create_stream().unwrap();
    match Graph::capture(&st, |g| g.signal(c, 0)).map(drop) {
        Err(Error::Unsupported { needs, .. }) => assert!(needs.contains("2.30.3"), "{needs}"),
        other => panic!("{other:?}"),
    }
}

/// Rank 0's graph signals rank 1 (its warm-up pass signals eagerly, taken by rank 1's first
/// eager wait); the replay's signal is a graph's, which rank 1's second eager wait must not
/// count.
#[test]
fn an_eager_wait_never_counts_a_graphs_signal() {
    let cs = comms(2, "nccl-2.32.3");
    let (r0, r1) = std::thread::scope(|s| {
        let a = s.spawn(|| {
            let c = &cs[0];
            let st = c.create_stream().unwrap();
            let g = Graph::capture(&st, |g| g.signal(c, 1)).unwrap();
            g.launch(&st).unwrap();
            st.synchronize()
        });
        let b = s.spawn(|| {
            let c = &cs[1];
            let st = c.create_stream().unwrap();
            c.wait_signal(&[SignalWait::new(0, 1)], &st).unwrap();
            st.synchronize().unwrap();
            c.wait_signal(&[SignalWait::new(0, 1)], &st).unwrap();
            st.synchronize()
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    r0.unwrap();
    match r1 {
        Err(Error::InvalidArgument { reason, .. }) => {
            assert!(reason.contains("only in graphs' waits"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}
