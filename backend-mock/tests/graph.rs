//! Graph capture and replay on the mock: what an engine's decode step does with CUDA graphs
//! (capture once, replay every step), run without a GPU.

use unicomm_core::graph;
use unicomm_core::Collective;
use unicomm_mock::MockComm;

type Graph<'a> = graph::Graph<'a, MockComm>;
use unicomm_core::{each_rank, DeviceStream, Error, ReduceOp};

/// Every collective of a captured step runs at each launch and only then, data exact
/// over the replays, with buffers registered, in windows and registered for the automatic
/// policy too (the conformance crate's check, which the GPU backends pass too).
#[test]
fn a_captured_step_runs_every_collective_at_each_launch_and_only_then() {
    use unicomm_conformance::Reg;
    for w in [1, 3] {
        let comms = unicomm_mock::local_comms(w).unwrap();
        unicomm_conformance::captured_step_replays(&comms, 5, Reg::None).unwrap();
        for reg in [Reg::Buffer, Reg::Window, Reg::Auto] {
            unicomm_conformance::captured_step_replays(&comms, 3, reg).unwrap();
        }
    }
}

/// NCCL cannot register memory, nor CUDA allocate it, while a stream captures: inside the
/// closure both are `InvalidArgument` naming the rule, in the warm-up pass already, and
/// after the capture both work again.
#[test]
fn registration_and_allocation_inside_a_capture_are_refused_naming_the_rule() {
    let comms = unicomm_mock::local_comms(1).unwrap();
    let c = &comms[0];
    let st = c.create_stream().unwrap();
    let buf = c.alloc::<f32>(4).unwrap();
    let spare = std::cell::RefCell::new(Some(c.alloc::<f32>(4).unwrap()));
    let r = Graph::capture(&st, |g| {
        g.all_reduce_in_place(c, &buf, ReduceOp::Sum)?;
        let b = spare
            .borrow_mut()
            .take()
            .expect("the warm-up pass fails first");
        match c.register(b) {
            Ok(_) => Ok(()),
            Err(e) => Err(e.error),
        }
    });
    let Err(Error::InvalidArgument { argument, reason }) = r else {
        panic!("registration inside a capture: {r:?}", r = r.map(|_| ()));
    };
    assert_eq!(argument, "register");
    assert!(reason.contains("graph capture"), "{reason}");
    let r = Graph::capture(&st, |_| c.alloc::<f32>(4).map(drop));
    assert!(
        matches!(&r, Err(Error::InvalidArgument { argument, .. }) if *argument == "alloc"),
        "{:?}",
        r.map(|_| ())
    );
    // Outside a capture again.
    let reg = c.register(c.alloc::<f32>(4).unwrap()).unwrap();
    c.deregister(reg).unwrap();
}

/// A collective or copy called on the communicator inside the capture's closure, not through
/// its step, would be replayed into buffers the graph does not borrow (freed and reused
/// while it lives: on the GPUs a write into freed device memory at the next launch): refused
/// naming the step, already in the warm-up pass; through the step the same call captures.
#[test]
fn a_call_made_beside_the_step_inside_a_capture_is_refused() {
    let comms = unicomm_mock::local_comms(1).unwrap();
    let c = &comms[0];
    let st = c.create_stream().unwrap();
    let x = c.upload(&[1.0f32; 4], &st).unwrap();
    let mut y = c.alloc::<f32>(4).unwrap();
    let direct = [
        Graph::capture(&st, |_| c.all_reduce(&x, &mut y, ReduceOp::Sum, &st)).map(drop),
        Graph::capture(&st, |_| c.copy(&x, &mut y, &st)).map(drop),
    ];
    for r in direct {
        assert!(
            matches!(&r, Err(Error::InvalidArgument { reason, .. }) if reason.contains("Step")),
            "{r:?}"
        );
    }
    // Outside a capture, and through the step, the same calls run.
    c.all_reduce(&x, &mut y, ReduceOp::Sum, &st).unwrap();
    let g = Graph::capture(&st, |g| g.all_reduce(c, &x, &y, ReduceOp::Sum)).unwrap();
    g.launch(&st).unwrap();
    st.synchronize().unwrap();
}

/// A host function runs once, so it cannot be part of a graph replayed many times: refused
/// while the stream captures (on the GPUs its box would be freed after the first replay).
#[test]
fn a_host_function_is_refused_while_the_stream_captures() {
    let comms = unicomm_mock::local_comms(1).unwrap();
    let c = &comms[0];
    let st = c.create_stream().unwrap();
    let r = Graph::capture(&st, |g| {
        if g.is_warm_up() {
            return Ok(());
        }
        g.stream().launch_host_fn(Box::new(|| ()))
    });
    assert!(
        matches!(&r, Err(Error::InvalidArgument { argument, .. }) if *argument == "stream"),
        "{:?}",
        r.map(|_| ())
    );
    assert!(!st.capturing().unwrap(), "the capture ended with the error");
    st.launch_host_fn(Box::new(|| ())).unwrap();
    st.synchronize().unwrap();
}

/// Each launch records the graph's collectives in the communicator's flight recorder with
/// the graph's id and the replay's number; the capture itself records nothing as a call.
#[test]
fn each_launch_is_recorded_in_the_flight_recorder_with_its_graph_and_replay() {
    let comms = unicomm_mock::local_comms(2).unwrap();
    each_rank(&comms, |c| {
        let st = c.create_stream()?;
        let (a, half) = (c.upload(&[1.0f32; 8], &st)?, c.upload(&[1.0f32; 4], &st)?);
        let b = c.alloc::<f32>(8)?;
        let graph = Graph::capture(&st, |g| {
            g.all_reduce(c, &a, &b, ReduceOp::Sum)?;
            g.all_gather(c, &half, &b)
        })?;
        let flight = c
            .backend()
            .flight()
            .expect("the mock keeps a recorder")
            .clone();
        let before = flight.to_json("test");
        // The warm-up pass's two calls, and nothing else: the capture pass is not a call.
        assert_eq!(before.matches("\"graph\":null").count(), 2, "{before}");
        for _ in 0..3 {
            graph.launch(&st)?;
        }
        st.synchronize()?;
        let after = flight.to_json("test");
        let id = graph.id();
        for k in 0..3 {
            let tag = format!("\"graph\":{id},\"replay\":{k}");
            assert_eq!(after.matches(&tag).count(), 2, "replay {k}: {after}");
        }
        assert_eq!(graph.collectives(), vec![(c.id(), 2)]);
        Ok::<_, Error>(())
    })
    .unwrap();
}

/// A communication stream of high priority is accepted on the mock (its streams are
/// threads: no effect) and carries collectives, so an engine's code that asks for one runs
/// in CI unchanged.
#[test]
fn a_high_priority_stream_is_accepted_and_carries_collectives() {
    let comms = unicomm_mock::local_comms(2).unwrap();
    each_rank(&comms, |c| {
        let st = c.create_stream_with(unicomm_core::StreamPriority::High)?;
        let mut x = c.upload(&[1.0f32; 16], &st)?;
        c.all_reduce_in_place(&mut x, ReduceOp::Sum, &st)?;
        assert_eq!(x.copy_to_host(&st)?, vec![2.0; 16]);
        Ok::<_, Error>(())
    })
    .unwrap();
}

/// A rank that stops replaying (dead, or diverged) leaves its peer's replay to end at the
/// deadline with `Timeout`, never a hang, and the peer's flight record names the graph and
/// the replay (what its dump holds).
#[test]
fn a_replay_a_peer_never_joins_ends_at_the_deadline_and_the_record_names_it() {
    let config = unicomm_mock::MockConfig {
        timeout: std::time::Duration::from_millis(300),
        ..unicomm_mock::MockConfig::default()
    };
    let comms = unicomm_mock::local_comms_with(2, config).unwrap();
    each_rank(&comms, |c| {
        let st = c.create_stream()?;
        let x = c.upload(&[1.0f32; 8], &st)?;
        let graph = Graph::capture(&st, |g| g.all_reduce_in_place(c, &x, ReduceOp::Sum))?;
        graph.launch(&st)?;
        st.synchronize()?;
        if c.rank() == 0 {
            // Rank 1 replays once only: rank 0's second replay waits for it.
            graph.launch(&st)?;
            let t = std::time::Instant::now();
            let r = st.synchronize();
            assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
            assert!(t.elapsed() < std::time::Duration::from_secs(5));
            let dump = c.backend().flight().expect("a recorder").to_json("test");
            let tag = format!("\"graph\":{},\"replay\":1", graph.id());
            assert!(dump.contains(&tag), "{dump}");
        }
        Ok::<_, Error>(())
    })
    .unwrap();
}

/// An engine recaptures its graphs (a new batch size, a new sequence bucket): 200 captures,
/// each launched, checked and destroyed, stay exact; the mock has no device memory figures,
/// and says so rather than report a growth of zero.
#[test]
fn two_hundred_captures_each_destroyed_stay_exact() {
    for w in [1, 2] {
        let comms = unicomm_mock::local_comms(w).unwrap();
        let growth = unicomm_conformance::capture_cycles(&comms, 200).unwrap();
        assert_eq!(growth, None, "the mock reports no device memory");
    }
}

/// A communicator counts the live graphs that captured its work (NCCL's abort of it
/// returns only once none is left; the last one's drop tells the backend): a graph
/// that failed to capture, or that captured another communicator's work only, is not one.
#[test]
fn a_communicator_counts_the_live_graphs_that_captured_its_work() {
    let comms = unicomm_mock::local_comms(1).unwrap();
    let other = unicomm_mock::local_comms(1).unwrap();
    let (c, o) = (&comms[0], &other[0]);
    let st = c.create_stream().unwrap();
    let buf = c.alloc::<f32>(4).unwrap();
    let obuf = o.alloc::<f32>(4).unwrap();
    let a = Graph::capture(&st, |g| g.all_reduce_in_place(c, &buf, ReduceOp::Sum)).unwrap();
    let b = Graph::capture(&st, |g| g.all_reduce_in_place(c, &buf, ReduceOp::Sum)).unwrap();
    assert!(Graph::capture(&st, |_| Err(Error::invalid("test", "fails"))).is_err());
    let ost = o.create_stream().unwrap();
    let only_other =
        Graph::capture(&ost, |g| g.all_reduce_in_place(o, &obuf, ReduceOp::Sum)).unwrap();
    assert_eq!((c.live_graphs(), o.live_graphs()), (2, 1));
    drop(a);
    assert_eq!(c.live_graphs(), 1);
    drop(b);
    drop(only_other);
    assert_eq!((c.live_graphs(), o.live_graphs()), (0, 0));
}

/// A panic in the closure's capturing pass, caught by the caller, ends the capture: an
/// eager all-reduce on the same stream afterwards runs and is exact (not recorded into a
/// capture that never ends).
#[test]
fn a_caught_panic_in_the_capture_leaves_the_stream_eager_and_exact() {
    for w in [1, 3] {
        let comms = unicomm_mock::local_comms(w).unwrap();
        unicomm_conformance::capture_panic_leaves_the_stream_eager(&comms).unwrap();
    }
}

/// A decode loop writes its graph's input between replays while the graph borrows it
/// (`write_from`, a device copy in stream order through a shared borrow; `write_from_host`
/// from host memory): each replay reduces that step's input, exactly. Inside the capture's
/// closure the same write is refused (it would be captured without the graph borrowing its
/// source).
#[test]
fn a_decode_loop_writes_its_graphs_input_between_replays() {
    let comms = unicomm_mock::local_comms(2).unwrap();
    each_rank(comms, |c| -> unicomm_core::Result<()> {
        let st = c.create_stream()?;
        let input = c.alloc::<f32>(8)?;
        let out = c.alloc::<f32>(8)?;
        let step = Graph::capture(&st, |g| {
            if !g.is_warm_up() {
                let r = input.write_from_host(&[0.0; 8], &st);
                assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
            }
            g.all_reduce(&c, &input, &out, ReduceOp::Sum)
        })?;
        let r = c.rank() as f32;
        for token in 0..5 {
            let next = c.upload(&[token as f32 + r; 8], &st)?;
            if token % 2 == 0 {
                input.write_from(&next, &st)?;
            } else {
                input.write_from_host(&[token as f32 + r; 8], &st)?;
            }
            step.launch(&st)?;
            let want = 2.0 * token as f32 + 1.0;
            assert_eq!(out.copy_to_host(&st)?, vec![want; 8], "token {token}");
        }
        Ok(())
    })
    .unwrap();
}

/// The conformance suite's decode loop with new inputs per replay, at worlds 1 and 3.
#[test]
fn graph_inputs_written_between_replays_at_several_worlds() {
    for w in [1, 3] {
        let comms = unicomm_mock::local_comms(w).unwrap();
        unicomm_conformance::graph_inputs_written_between_replays(&comms).unwrap();
    }
}

/// The one door: each kind of work (a collective, each symmetric algorithm, a symmetric
/// barrier, a signal and its wait) is recorded once under its own name and path, and a
/// graph of three symmetric all-reduces and one all-reduce counts four and records four
/// at its replay (the symmetric kernels and the one-sided calls once went around the
/// recorder: an eager symmetric all-reduce left the ring empty, that graph counted one).
#[test]
fn every_kind_of_work_is_recorded_once_through_the_one_door() {
    // The default target predates one-sided calls (refused, and recorded as refused);
    // NCCL 2.32.3's has them.
    for (target, one_sided) in [(None, false), (Some("nccl-2.32.3"), true)] {
        for w in [1, 2, 3] {
            let mut config = unicomm_mock::MockConfig::default();
            if let Some(t) = target {
                config.target = unicomm_mock::Target::parse(t).unwrap();
            }
            let cs = unicomm_mock::local_comms_with(w, config).unwrap();
            let seen = unicomm_conformance::every_kind_of_work_is_recorded_once(&cs, None)
                .unwrap_or_else(|e| panic!("world {w}, {target:?}: {e}"));
            for kinds in seen {
                assert!(kinds.contains(&"symmetric_all_reduce"), "{kinds:?}");
                assert!(kinds.contains(&"graph"), "{kinds:?}");
                let signals = kinds.contains(&"wait_signal");
                assert_eq!(signals, one_sided && w > 1, "{target:?}: {kinds:?}");
            }
        }
    }
}
