//! A decode step captured once in a CUDA graph with candle's own kernels and unicomm's
//! all-reduce: a tensor-parallel MLP (a column-parallel layer, SiLU, a row-parallel layer
//! whose sum is unicomm's all-reduce over NCCL, the residual add) on candle's stream,
//! captured by CUDA's stream capture (cudarc's), then replayed `STEPS` times with a new
//! input written into the tensor the graph reads (`Tensor::slice_set`, in stream order)
//! between replays, each replay's output checked against the eager step on the same input.
//! CUDA only (feature `cuda`): a world of one (`captured_step`) or one rank per process
//! (`cargo xtask launch --procs 2 --share-gpu -- captured_step`).
//!
//! What a capture of candle's kernels asks of the engine, all here:
//! - candle's device made with a stream of its own (`Device::new_cuda_with_stream`):
//!   `Device::new_cuda` runs on CUDA's legacy default stream, which cannot be captured;
//! - cudarc's event tracking off before the tensors are made (one stream orders them): a
//!   slice's wait on an event recorded before the capture invalidates it;
//! - the step run eagerly once first: NCCL connects its peers and cuBLAS makes its
//!   workspace at their first call, which a capture does not allow;
//! - candle allocating from the stream's pool (`cuMemAllocAsync`): the tensors the step makes
//!   become the graph's memory, made again at each launch at the same addresses
//!   (`CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`), so the output tensor made inside
//!   the capture holds each replay's result;
//! - the collectives' checks across ranks off (`UNICOMM_CHECK_COLLECTIVES` unset: they wait
//!   on the host);
//! - the graph dropped before the communicator and before every tensor it reads or writes
//!   (unicomm's own `Graph` holds both rules by borrows; a graph captured with cudarc does
//!   not: here the input, the weights and the output live until the graph is dropped), and
//!   a result read only once the stream is done, here through unicomm's wrapper of candle's
//!   stream, whose wait has the communicator's deadline.

use anyhow::{bail, Context as _};
use candle_core::{DType, Device, Module, Tensor};
use cudarc::driver::sys;
use unicomm::Vendor;
use unicomm_candle::{Communicator, TensorParallelColumnLinear, TensorParallelRowLinear};

const HIDDEN: usize = 64;
const FFN: usize = 128;
const ROWS: usize = 4;
const STEPS: usize = 50;
/// cuBLAS's workspace for the captured matmuls (what PyTorch gives Hopper: 32 MiB).
const CUBLAS_WORKSPACE: usize = 32 << 20;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// A weight of `rows x cols`, the same on every rank.
fn weight(rows: usize, cols: usize, seed: f64, dev: &Device) -> candle_core::Result<Tensor> {
    Tensor::arange(0f32, (rows * cols) as f32, dev)?
        .affine(0.37, seed)?
        .sin()?
        .affine(1.0 / (cols as f64).sqrt(), 0.0)?
        .reshape((rows, cols))
}

/// Step `k`'s input, the same on every rank.
fn input(k: usize, dev: &Device) -> candle_core::Result<Tensor> {
    Tensor::arange(0f32, (ROWS * HIDDEN) as f32, dev)?
        .affine(0.05, k as f64)?
        .cos()?
        .reshape((ROWS, HIDDEN))
}

fn run() -> anyhow::Result<()> {
    if std::env::var_os("UNICOMM_CHECK_COLLECTIVES").is_some() {
        bail!("UNICOMM_CHECK_COLLECTIVES compares calls on the host, which a capture does not allow: unset it");
    }
    let local: usize = std::env::var("LOCAL_RANK").map_or(Ok(0), |v| v.parse())?;
    let comm = match std::env::var_os("WORLD_SIZE") {
        Some(_) => unicomm::from_env(Vendor::Cuda).context("joining the job")?,
        None => unicomm::local_comms_n(Vendor::Cuda, Some(1))?.remove(0),
    };
    let r = comm.rank();
    // A stream of its own: `Device::new_cuda` runs candle on CUDA's legacy default stream,
    // which CUDA cannot capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED at the capture's
    // start, seen on an H100).
    let dev = Device::new_cuda_with_stream(local)?;
    let Device::Cuda(cuda) = &dev else {
        bail!("not a CUDA device")
    };
    // A second stream puts cudarc in its multi-stream mode, where every use of a slice first
    // waits on the event of its last write: inside a capture, a wait on an event recorded
    // before it invalidates the capture (CUDA's rule: a capturing stream may wait only on
    // events captured with it, unless the wait is flagged external). cudarc keeps the error
    // to itself, and the next launch fails: candle's first matmul, with
    // CUBLAS_STATUS_EXECUTION_FAILED on an H100 and an H200. Everything here runs on
    // candle's one stream, so no tracking is needed.
    // SAFETY: every slice made from here on is used on candle's stream only (unicomm's
    // all-reduce enqueues there too), so stream order alone orders its uses and frees.
    unsafe { cuda.cuda_stream().context().disable_event_tracking() };
    let comm = Communicator::new(comm);
    let up = TensorParallelColumnLinear::from_full(&weight(FFN, HIDDEN, 1.0, &dev)?, None, &comm)?;
    let down = TensorParallelRowLinear::from_full(&weight(HIDDEN, FFN, 2.0, &dev)?, None, &comm)?;
    // Each stage named in an error (a call a capture does not allow says which).
    let step = |x: &Tensor| -> anyhow::Result<Tensor> {
        let h = up.forward(x).context("the column-parallel layer")?;
        let h = h.silu().context("SiLU")?;
        let h = down
            .forward(&h)
            .context("the row-parallel layer (its matmul and unicomm's all-reduce)")?;
        (x + h).context("the residual add")
    };
    // The tensor the graph reads, and the eager step once (outside any capture).
    let x = input(0, &dev)?;
    step(&x)?;
    let stream = cuda.cuda_stream();
    if stream.cu_stream().is_null() {
        bail!("candle's device runs on CUDA's legacy default stream, which cannot be captured: make it with Device::new_cuda_with_stream");
    }
    // A cuBLAS workspace of the step's own, alive as long as the graph: cuBLAS's guide on
    // graph capture asks for one (its default pool is allocated on demand), as PyTorch
    // gives each handle. (It did not cure the capture failure described above.)
    let mut workspace = stream.alloc_zeros::<u8>(CUBLAS_WORKSPACE)?;
    {
        let blas = cuda.cublas_handle();
        let (p, _sync) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut workspace, &stream);
        // SAFETY: a live handle of candle's device; the workspace, on the handle's stream,
        // outlives every use of the handle here (it is dropped after the graph, below).
        let status = unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                *blas.handle(),
                p as *mut _,
                CUBLAS_WORKSPACE,
            )
        };
        if status != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            bail!("cublasSetWorkspace: {status:?}");
        }
    }
    let watched = unicomm::Stream::from(unicomm::nccl::stream_from_cudarc(stream.clone())?);
    watched.synchronize()?;
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .context("beginning the capture on candle's stream")?;
    let y = step(&x);
    // Ended whatever the step answered: a stream left capturing would refuse later work.
    let graph = stream.end_capture(
        sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
    );
    let (y, graph) = (y?, graph?.context("the capture recorded nothing")?);
    let mut worst = 0f32;
    for k in 1..=STEPS {
        let next = input(k, &dev)?;
        // In stream order: after the last replay read `x`, before the next one does.
        x.slice_set(&next, 0, 0)?;
        graph.launch()?;
        watched.synchronize()?;
        let got = y.to_dtype(DType::F32)?;
        let want = step(&next)?;
        watched.synchronize()?;
        let d = (got - want)?
            .abs()?
            .flatten_all()?
            .max(0)?
            .to_scalar::<f32>()?;
        if d.is_nan() || d > 1e-5 {
            bail!("rank {r}: replay {k} differs from the eager step by {d:e}");
        }
        worst = worst.max(d);
    }
    drop(graph);
    drop(workspace);
    println!(
        "captured_step: rank {r} of {}: {STEPS} replays of candle's kernels and unicomm's all-reduce in one CUDA graph, a new input before each, within {worst:e} of the eager step; PASSED",
        comm.world_size()
    );
    Ok(())
}
