//! What only CUDA has: CUDA-graph capture (of collectives and of the copy-engine path's
//! signals) and cudarc interop.
#![cfg(feature = "nccl")]

use unicomm_core::{Comm, ReduceOp, Result};
use unicomm_gpu_tests::{each, world, NCCL};
use unicomm_nccl::NcclComm;

fn comms(n: usize) -> Vec<Comm<NcclComm>> {
    NCCL.comms(n).expect("GPU communicators")
}

/// CUDA-graph capture (a capability the contract names): ten all-reduces captured into a CUDA graph, replayed once.
#[test]
fn collectives_captured_into_a_cuda_graph_replay_correctly() {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let w = world().expect("UNICOMM_GPU_WORLD");
    let cs = comms(w);
    let out = each(&cs, |c| -> Result<Vec<f32>> {
        let st = c.create_stream()?;
        let mut buf = c.alloc::<f32>(4096)?;
        buf.copy_from_host(&vec![1.0; 4096], &st)?;
        // NCCL connects peers lazily, at the first collective, and connecting is not
        // allowed while a stream captures: one warm-up collective first (NCCL's advice).
        c.all_reduce_in_place(&mut buf, ReduceOp::Sum, &st)?;
        buf.copy_from_host(&vec![1.0; 4096], &st)?;
        let cu = st.inner().0.clone();
        cu.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| unicomm_core::Error::invalid("capture", format!("{e:?}")))?;
        for _ in 0..10 {
            c.all_reduce_in_place(&mut buf, ReduceOp::Sum, &st)?;
        }
        let graph = cu
            .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
            .map_err(|e| unicomm_core::Error::invalid("capture", format!("{e:?}")))?
            .ok_or_else(|| unicomm_core::Error::invalid("capture", "empty graph"))?;
        // Nothing ran during capture.
        assert_eq!(buf.copy_to_host(&st)?[0], 1.0);
        graph
            .launch()
            .map_err(|e| unicomm_core::Error::invalid("launch", format!("{e:?}")))?;
        st.synchronize()?;
        buf.copy_to_host(&st)
    });
    for o in out {
        let v = o.unwrap();
        let want = (w as f32).powi(10);
        assert!(v.iter().all(|&x| x == want), "got {}, want {want}", v[0]);
    }
}

/// The copy-engine path's signals captured into a CUDA graph (two streams as two ranks on
/// one GPU, forked and joined inside the capture) and the graph replayed three times: the
/// graph re-arms its own flags, so every replay moves every chunk again.
#[test]
fn copy_engine_signals_replay_in_a_cuda_graph() -> Result<()> {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let err = |what: &'static str| {
        move |e: cudarc::driver::DriverError| unicomm_core::Error::invalid(what, format!("{e:?}"))
    };
    let capture = |origin: &unicomm_nccl::CudaStreamHandle,
                   body: &mut dyn FnMut() -> Result<()>|
     -> Result<Box<dyn FnMut() -> Result<()>>> {
        let cu = origin.0.clone();
        cu.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(err("begin capture"))?;
        let enqueued = body();
        let graph = cu
            .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
            .map_err(err("end capture"))?;
        enqueued?;
        let graph = graph.ok_or_else(|| unicomm_core::Error::invalid("capture", "empty graph"))?;
        Ok(Box::new(move || {
            graph.launch().map_err(err("graph launch"))
        }))
    };
    unicomm_gpu_tests::signals_replay_in_a_graph(&NCCL, &capture)
}

/// cudarc interop (the contract's): a cudarc stream and cudarc slices used directly, without copies.
#[test]
fn cudarc_streams_and_slices_work_directly() {
    let w = world().expect("UNICOMM_GPU_WORLD");
    let cs = comms(w);
    let out = each(&cs, |c| -> Result<Vec<f32>> {
        let ctx = cudarc::driver::CudaContext::new(c.backend().device()).unwrap();
        let cu_stream = ctx.new_stream().unwrap();
        let slice = cu_stream
            .clone_htod(&vec![c.rank() as f32 + 1.0; 256])
            .unwrap();
        let st = unicomm_nccl::stream_from_cudarc(cu_stream)?;
        let mem = unicomm_nccl::memory_from_cudarc(slice)?;
        let mut buf = unicomm_core::Buffer::<f32, NcclComm>::from_memory(mem, 256)?;
        c.all_reduce_in_place(&mut buf, ReduceOp::Sum, &st)?;
        buf.copy_to_host(&st)
    });
    for o in out {
        let want = (w * (w + 1) / 2) as f32;
        assert!(o.unwrap().iter().all(|&x| x == want));
    }
}

/// An engine's cudarc slices lent, not given (`lend`, `lend_mut`): the collective reads and
/// writes them on their own stream, and the slices are the engine's again afterwards; a
/// device copy and a host function run in that stream's order.
#[test]
fn lent_cudarc_slices_a_device_copy_and_a_host_function_in_stream_order() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use unicomm_core::DeviceStream;
    let w = world().expect("UNICOMM_GPU_WORLD");
    let cs = comms(w);
    let out = each(&cs, |c| -> Result<(Vec<f32>, bool)> {
        let ctx = cudarc::driver::CudaContext::new(c.backend().device()).unwrap();
        let cu = ctx.new_stream().unwrap();
        let x = cu.clone_htod(&vec![c.rank() as f32 + 1.0; 256]).unwrap();
        let mut y = cu.alloc_zeros::<f32>(256).unwrap();
        let mut z = cu.alloc_zeros::<f32>(256).unwrap();
        let st = unicomm_nccl::stream_from_cudarc(cu.clone())?;
        {
            let send = unicomm_nccl::lend(&x)?;
            let mut recv = unicomm_nccl::lend_mut(&mut y)?;
            c.all_reduce(&send, &mut recv, ReduceOp::Sum, &st)?;
            // The sum copied into a third slice, on the same stream.
            c.copy(&recv, &mut unicomm_nccl::lend_mut(&mut z)?, &st)?;
        }
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        st.launch_host_fn(Box::new(move || r.store(true, Ordering::Release)))?;
        st.synchronize()?;
        let (y, z) = (cu.clone_dtoh(&y).unwrap(), cu.clone_dtoh(&z).unwrap());
        assert_eq!(y, z, "the device copy");
        Ok((y, ran.load(Ordering::Acquire)))
    });
    for o in out {
        let (y, ran) = o.unwrap();
        let want = (w * (w + 1) / 2) as f32;
        assert!(y.iter().all(|&v| v == want), "{:?}", &y[..4]);
        assert!(ran, "the host function ran before synchronize returned");
    }
}

/// A cudarc slice lent to a collective on a stream other than its own: the slice's stream
/// is made to wait for the collective, so cudarc's next work on it (a read here, its
/// stream-ordered free after a forgotten completion) follows the collective without a host
/// wait on unicomm's stream. 64 MiB, so that a read not ordered after the collective would
/// see zeros.
#[test]
fn a_slice_lent_on_another_stream_orders_its_own_stream_after_the_collective() -> Result<()> {
    let w = world().expect("UNICOMM_GPU_WORLD");
    let cs = comms(w);
    let out = each(&cs, |c| -> Result<Vec<f32>> {
        let ctx = cudarc::driver::CudaContext::new(c.backend().device()).unwrap();
        let cu = ctx.new_stream().unwrap();
        let n = 16 << 20;
        let x = cu.clone_htod(&vec![c.rank() as f32 + 1.0; n]).unwrap();
        let mut y = cu.alloc_zeros::<f32>(n).unwrap();
        cu.synchronize().unwrap();
        let st = c.create_stream()?;
        {
            let send = unicomm_nccl::lend(&x)?;
            let mut recv = unicomm_nccl::lend_mut(&mut y)?;
            c.all_reduce(&send, &mut recv, ReduceOp::Sum, &st)?;
        }
        // Read on the slice's stream, with no wait on `st` by the host.
        Ok(cu.clone_dtoh(&y).unwrap())
    });
    let want = (w * (w + 1) / 2) as f32;
    for o in out {
        let y = o?;
        let bad = y.iter().filter(|&&v| v != want).count();
        assert_eq!(
            bad, 0,
            "{bad} elements read before the collective wrote them"
        );
    }
    Ok(())
}

/// A raw CUDA stream of another library (here a cudarc stream's `CUstream`, as PyTorch's
/// current stream would be handed over) serves as a unicomm stream: a collective runs on it
/// after a marker of a unicomm stream it waits for, and the stream outlives the wrapper.
#[test]
fn a_raw_cuda_stream_orders_a_collective_after_another_streams_marker() -> Result<()> {
    use unicomm_core::DeviceStream;
    let cs = comms(1);
    let c = &cs[0];
    let ctx = unicomm_nccl::cuda()?.context(0)?;
    let owner = ctx
        .new_stream()
        .map_err(|e| unicomm_core::Error::invalid("stream", format!("{e:?}")))?;
    // SAFETY: a live stream of device 0's primary context, kept alive by `owner` below.
    let raw = unsafe { unicomm_nccl::stream_from_raw(0, owner.cu_stream().cast())? };
    let compute = c.create_stream()?;
    let mut b = c.alloc::<f32>(1 << 20)?;
    b.copy_from_host(&vec![2.0; 1 << 20], &compute)?;
    raw.wait(&compute.record()?)?;
    c.all_reduce_in_place(&mut b, ReduceOp::Sum, &raw)?;
    assert!(b.copy_to_host(&raw)?.iter().all(|&x| x == 2.0));
    drop(raw);
    // The stream is still the owner's: it takes work after the wrapper is gone.
    owner
        .synchronize()
        .map_err(|e| unicomm_core::Error::invalid("stream", format!("{e:?}")))?;
    Ok(())
}

/// NCCL's many-root creation (`ncclCommInitRankScalable`, NCCL >= 2.23): a world of one
/// rank created through it (one root, asked for explicitly) carries an all-reduce; on a
/// library before 2.23 the call is `Unsupported` naming the version, and this test fails
/// saying so (the GPU machine's NCCL is 2.28).
#[test]
fn a_world_created_from_the_many_root_call_carries_an_all_reduce() -> Result<()> {
    let id = unicomm_nccl::unique_id()?;
    let cfg = unicomm_core::CommConfig::default();
    let raw =
        unicomm_nccl::init_rank_scalable_with(&[id], unicomm_core::Place::new(0, 1, 0), &cfg)?;
    let c = Comm::from_backend(raw);
    let st = c.create_stream()?;
    let mut b = c.alloc::<f32>(1024)?;
    b.copy_from_host(&vec![3.0f32; 1024], &st)?;
    c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)?;
    assert!(b.copy_to_host(&st)?.iter().all(|&x| x == 3.0));
    c.finalize()
}
