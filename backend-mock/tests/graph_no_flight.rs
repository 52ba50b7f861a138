//! What a graph holds is the capture's own record, not the flight recorder's: with the
//! recorder off (`UNICOMM_FLIGHT_ENTRIES=0`) a graph of six collectives still reports six
//! (it reported 0, a public answer that depended on a diagnostics setting). Alone in its
//! binary: the variable is read when each communicator is made.

use unicomm_core::graph::Graph;
use unicomm_core::{Collective, DeviceStream, ReduceOp};

#[test]
fn a_capture_counts_its_collectives_with_the_flight_recorder_off() {
    // SAFETY of the edition-2021 call: set before any thread of this test binary reads the
    // environment (one test in the binary).
    std::env::set_var("UNICOMM_FLIGHT_ENTRIES", "0");
    let cs = unicomm_mock::local_comms(2).unwrap();
    std::thread::scope(|s| {
        for c in &cs {
            s.spawn(move || {
                assert!(!c.backend().flight().is_some_and(|f| f.on()));
                let st = c.create_stream().unwrap();
                let a = c.upload(&[1.0f32; 8], &st).unwrap();
                let b = c.alloc::<f32>(8).unwrap();
                let graph = Graph::capture(&st, |g| {
                    for _ in 0..6 {
                        g.all_reduce(c, &a, &b, ReduceOp::Sum)?;
                    }
                    Ok(())
                })
                .unwrap();
                graph.launch(&st).unwrap();
                st.synchronize().unwrap();
                assert_eq!(graph.collectives(), vec![(c.id(), 6)]);
            });
        }
    });
}
