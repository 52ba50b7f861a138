//! Ranks joined by unique id (`init_rank`), one thread per GPU: the plain path and the
//! copy-engine path between them.
#![cfg(any(feature = "nccl", feature = "rccl"))]

use unicomm_core::Result;
use unicomm_gpu_tests as t;
use unicomm_gpu_tests::GPU;

unicomm_gpu_tests::on_gpu! {
    explicit_init_rank_from_one_thread_per_gpu => init_rank_per_thread;
    copy_engine_path_with_init_rank_moves_exact_data => copy_engine_init_rank;
}

/// A device-to-device copy and a host function in stream order, on every vendor (CUDA's
/// cuMemcpyDtoDAsync and cuLaunchHostFunc, HIP's hipMemcpyAsync and hipLaunchHostFunc): the
/// copy after the collective before it, the host function after both.
#[test]
fn a_device_copy_and_a_host_function_run_in_stream_order() -> Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use unicomm_core::{DeviceStream, ReduceOp};
    let w = t::world()?;
    let cs = GPU.comms(w)?;
    for o in t::each(&cs, |c| -> Result<(Vec<f32>, bool)> {
        let st = c.create_stream()?;
        let mut a = c.upload(&[c.rank() as f32 + 1.0; 1024], &st)?;
        let mut b = c.alloc::<f32>(1024)?;
        c.all_reduce_in_place(&mut a, ReduceOp::Sum, &st)?;
        c.copy(&a, &mut b, &st)?;
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        st.launch_host_fn(Box::new(move || r.store(true, Ordering::Release)))?;
        st.synchronize()?;
        Ok((b.copy_to_host(&st)?, ran.load(Ordering::Acquire)))
    }) {
        let (b, ran) = o?;
        let want = (w * (w + 1) / 2) as f32;
        assert!(b.iter().all(|&v| v == want), "{:?}", &b[..4]);
        assert!(ran, "the host function ran before synchronize returned");
    }
    Ok(())
}

/// unicomm's own capture ([`unicomm_core::graph::Graph`]) on every vendor (CUDA graphs on
/// NCCL, HIP graphs on RCCL): a step of every collective, warmed up and captured by one
/// call, replayed 1,000 times with every output exact after each replay, and again with a
/// registered buffer and with a window, 1,000 times each (the library captures its
/// registered and symmetric kernels).
#[test]
fn a_captured_step_of_every_collective_replays_exactly() -> Result<()> {
    use unicomm_conformance::Reg;
    let w = t::world()?;
    let cs = GPU.comms(w)?;
    unicomm_conformance::captured_step_replays(&cs, 1000, Reg::None)?;
    unicomm_conformance::captured_step_replays(&cs, 1000, Reg::Buffer)?;
    let r = unicomm_conformance::captured_step_replays(&cs, 1000, Reg::Window);
    if cs[0].capabilities().windows {
        return r;
    }
    // A library without windows (NCCL < 2.27, RCCL) must refuse them by name, not pass.
    match r {
        Err(unicomm_core::Error::Unsupported { what, .. }) if what.contains("window") => {
            eprintln!("windows unsupported by this library: {what}: window replays NOT run");
            Ok(())
        }
        r => panic!("a library without windows answered {r:?}"),
    }
}

/// An engine recaptures its graphs (a new batch size, a new sequence bucket): 200 captures
/// of a step, each launched, checked and destroyed, leave the device's free memory within
/// 64 MiB of where it was after the first ten (a graph's instance and the library's
/// per-capture state are given back when the graph is dropped).
#[test]
fn two_hundred_capture_cycles_keep_device_memory_bounded() -> Result<()> {
    let w = t::world()?;
    let cs = GPU.comms(w)?;
    let growth = unicomm_conformance::capture_cycles(&cs, 200)?
        .expect("a GPU backend reports its device memory");
    eprintln!(
        "device memory lost over 190 capture cycles: {} KiB",
        growth >> 10
    );
    assert!(
        growth < 64 << 20,
        "{} MiB lost over 190 capture cycles",
        growth >> 20
    );
    Ok(())
}

/// A communication stream of the device's greatest priority (CUDA's and HIP's stream
/// priorities) carries collectives like any other.
#[test]
fn a_high_priority_stream_carries_collectives() -> Result<()> {
    use unicomm_core::{ReduceOp, StreamPriority};
    let w = t::world()?;
    let cs = GPU.comms(w)?;
    for o in t::each(&cs, |c| -> Result<Vec<f32>> {
        let st = c.create_stream_with(StreamPriority::High)?;
        let mut a = c.upload(&[1.0f32; 4096], &st)?;
        c.all_reduce_in_place(&mut a, ReduceOp::Sum, &st)?;
        a.copy_to_host(&st)
    }) {
        let v = o?;
        assert!(v.iter().all(|&x| x == w as f32), "{:?}", &v[..4]);
    }
    Ok(())
}

/// A completion handle on every vendor: a host function after the all-reduce marks it done
/// (`cuLaunchHostFunc` / `hipLaunchHostFunc`), `wait` returns within the deadline, and the
/// handle's marker orders a copy on another stream after it.
#[test]
fn a_completion_handle_is_done_after_its_collective_and_orders_another_stream() -> Result<()> {
    use unicomm_core::completion::Completion;
    use unicomm_core::{DeviceStream, ReduceOp};
    let w = t::world()?;
    let cs = GPU.comms(w)?;
    for o in t::each(&cs, |c| -> Result<Vec<f32>> {
        let (st, other) = (c.create_stream()?, c.create_stream()?);
        let x = c.upload(&[1.0f32; 1 << 20], &st)?;
        let mut y = c.alloc::<f32>(1 << 20)?;
        let h = Completion::start(&st, |s| s.all_reduce_in_place(c, &x, ReduceOp::Sum))?;
        other.wait(h.marker())?;
        c.copy(&x, &mut y, &other)?;
        h.wait()?;
        y.copy_to_host(&other)
    }) {
        let v = o?;
        assert!(v.iter().all(|&x| x == w as f32), "{:?}", &v[..4]);
    }
    Ok(())
}

/// A panic in a capture's closure during the capturing pass, caught by the caller, ends the
/// CUDA/HIP stream capture: an eager all-reduce on that stream afterwards runs and is exact.
#[test]
fn a_caught_capture_panic_leaves_the_stream_eager() -> Result<()> {
    let w = t::world()?;
    let cs = GPU.comms(w)?;
    unicomm_conformance::capture_panic_leaves_the_stream_eager(&cs)
}

/// A decode loop writes its graph's input between replays through a shared borrow (a
/// device copy on the stream, `cuMemcpyDtoDAsync`, and a host copy on alternate steps):
/// every replay reduces that step's input.
#[test]
fn a_graphs_input_is_written_between_replays() -> Result<()> {
    let w = t::world()?;
    let cs = GPU.comms(w)?;
    unicomm_conformance::graph_inputs_written_between_replays(&cs)
}

/// The sleep mode and properties (NCCL 2.29.7 and 2.29.2): run where the loaded library has
/// them, `Unsupported` naming the release where it does not; said which, never silent.
#[test]
fn the_sleep_mode_and_properties_follow_the_loaded_release() -> Result<()> {
    let w = t::world()?;
    let cs = GPU.comms(w)?;
    let seen = unicomm_conformance::sleep_mode_and_properties(&cs)?;
    let v = cs[0].capabilities().version;
    println!(
        "sleep mode and properties on {} {v}: {seen:?}",
        cs[0].capabilities().backend
    );
    let want = (
        v >= unicomm_core::Version::new(2, 29, 7),
        v >= unicomm_core::Version::new(2, 29, 2),
    );
    assert!(seen.iter().all(|&s| s == want), "{seen:?} on {v}");
    Ok(())
}

/// Per-call options (NCCL 2.32's `nccl*Config`): taken and exact where the loaded library
/// has them, `Unsupported` naming 2.32 where it does not; said which, never silent.
#[test]
fn per_call_options_follow_the_loaded_release() -> Result<()> {
    let w = t::world()?;
    let cs = GPU.comms(w)?;
    let seen = unicomm_conformance::call_options(&cs)?;
    let v = cs[0].capabilities().version;
    println!(
        "per-call options on {} {v}: {seen:?}",
        cs[0].capabilities().backend
    );
    let want = v >= unicomm_core::Version::new(2, 32, 0);
    assert!(seen.iter().all(|&s| s == want), "{seen:?} on {v}");
    Ok(())
}

/// One-sided operations (NCCL 2.29.2's `ncclPutSignal`, `ncclSignal`, `ncclWaitSignal`):
/// NCCL's source rule refused before the library where the loaded library has them,
/// `Unsupported` naming 2.29.2 where it does not; at world 2 or more the ring's blocks
/// move exactly (or the communicator's missing host RMA is said). Never silent.
#[test]
fn one_sided_operations_follow_the_loaded_release() -> Result<()> {
    let w = t::world()?;
    let cs = GPU.comms(w)?;
    let seen = unicomm_conformance::one_sided_put_signal(&cs)?;
    let v = cs[0].capabilities().version;
    println!(
        "one-sided operations on {} {v}, world {w}: {seen:?}",
        cs[0].capabilities().backend
    );
    if v < unicomm_core::Version::new(2, 29, 2) || w == 1 {
        let want = v >= unicomm_core::Version::new(2, 29, 2);
        assert!(seen.iter().all(|&s| s == want), "{seen:?} on {v}");
    }
    Ok(())
}

/// The ring captured in a graph and replayed 200 times (NCCL 2.30.3 gives captured
/// one-sided operations signals of their own): exact at each replay, `Unsupported` naming
/// the release below it. Never silent.
#[test]
fn one_sided_operations_in_a_graph_follow_the_loaded_release() -> Result<()> {
    let w = t::world()?;
    let cs = GPU.comms(w)?;
    let seen = unicomm_conformance::one_sided_in_graph(&cs, 200)?;
    let v = cs[0].capabilities().version;
    println!(
        "one-sided operations in a graph on {} {v}, world {w}: {seen:?}",
        cs[0].capabilities().backend
    );
    if v < unicomm_core::Version::new(2, 30, 3) {
        assert!(seen.iter().all(|&s| !s), "{seen:?} on {v}");
    }
    Ok(())
}

/// A window's peer addresses (NCCL 2.29.2's `ncclGetPeerDevicePointer`): every rank of the
/// world in one NVLink domain (one GPU here) has one, non-null; a library before 2.29.2
/// refuses naming it. Never silent.
#[test]
fn a_windows_peer_addresses_follow_the_loaded_release() -> Result<()> {
    let w = t::world()?;
    let cs = GPU.comms(w)?;
    let got = unicomm_core::each_rank(&cs, |c| -> unicomm_core::Result<Vec<Option<usize>>> {
        let win = match c.register_window(c.alloc::<f32>(1024)?) {
            Err(e) if matches!(e.error, unicomm_core::Error::Unsupported { .. }) => {
                return Ok(Vec::new())
            }
            Err(e) => return Err(e.error),
            Ok(w) => w,
        };
        (0..c.world_size())
            .map(|p| win.peer_address(p))
            .collect::<unicomm_core::Result<Vec<_>>>()
            .or_else(|e| match e {
                unicomm_core::Error::Unsupported { needs, .. } if needs.contains("2.29.2") => {
                    Ok(Vec::new())
                }
                e => Err(e),
            })
    })?;
    let v = cs[0].capabilities().version;
    println!("window peer addresses on {v}, world {w}: {got:?}");
    if v >= unicomm_core::Version::new(2, 29, 2) && cs[0].capabilities().windows {
        assert!(
            got.iter()
                .all(|r| r.len() == w && r.iter().all(|a| a.is_some_and(|a| a != 0))),
            "{got:?}"
        );
    } else {
        assert!(got.iter().all(|r| r.is_empty()), "{got:?}");
    }
    Ok(())
}
