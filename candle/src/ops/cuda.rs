//! The CUDA path: candle's CUDA tensors lent to NCCL (no copy) and the collective enqueued
//! on candle's own stream, so it is ordered with candle's kernels before and after it and
//! the host never waits.

#![allow(
    unsafe_code,
    reason = "the output is allocated uninitialised, as candle's own ops allocate theirs"
)]

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::{CudaDType, CudaDevice};
use candle_core::{CudaStorage, DType, Layout, Result, Shape, WithDType};
use cudarc::driver::DeviceRepr;
use unicomm::Element;

use super::{contiguous, unsupported_dtype, Coll};
use crate::comm::{wrap, Communicator, Streams};

pub(crate) fn forward(
    comm: &Communicator,
    (coll, dim): (Coll, usize),
    s: &CudaStorage,
    l: &Layout,
    shape: Shape,
) -> Result<(CudaStorage, Shape)> {
    let range = contiguous(l, coll)?;
    if coll.every_rank() && comm.comm().checks_collectives() {
        let mut streams = comm.locked(coll.name())?;
        let stream = candle_stream(&mut streams, s.device())?;
        super::agree(comm.comm(), stream, coll, (l.shape(), dim), s.dtype())
            .map_err(|e| wrap(coll.name(), e))?;
    }
    let dev = s.device();
    let out = match s.dtype() {
        DType::F32 => run::<f32>(comm, coll, s, range, dev, &shape)?,
        DType::F64 => run::<f64>(comm, coll, s, range, dev, &shape)?,
        DType::F16 => run::<unicomm::f16>(comm, coll, s, range, dev, &shape)?,
        DType::BF16 => run::<unicomm::bf16>(comm, coll, s, range, dev, &shape)?,
        DType::U8 => run::<u8>(comm, coll, s, range, dev, &shape)?,
        DType::U32 => run::<u32>(comm, coll, s, range, dev, &shape)?,
        DType::I32 => run::<i32>(comm, coll, s, range, dev, &shape)?,
        DType::I64 => run::<i64>(comm, coll, s, range, dev, &shape)?,
        other => return Err(unsupported_dtype(coll, other)),
    };
    Ok((out, shape))
}

fn run<T: Element + WithDType + CudaDType + DeviceRepr>(
    comm: &Communicator,
    coll: Coll,
    s: &CudaStorage,
    (start, end): (usize, usize),
    dev: &CudaDevice,
    shape: &Shape,
) -> Result<CudaStorage> {
    let what = coll.name();
    let src = s.as_cuda_slice::<T>()?.slice(start..end);
    // SAFETY: every element of `dst` is written by the collective, enqueued below on the
    // stream candle's later kernels use, before anything reads it; if the collective is not
    // enqueued, `dst` is dropped unread.
    let mut dst = unsafe { dev.alloc::<T>(shape.elem_count()) }?;
    let mut streams = comm.locked(what)?;
    let stream = candle_stream(&mut streams, dev)?;
    let send = unicomm::nccl::lend(&src)
        .map_err(|e| wrap(what, e))?
        .into_backend();
    let mut recv = unicomm::nccl::lend_mut(&mut dst)
        .map_err(|e| wrap(what, e))?
        .into_backend();
    coll.enqueue::<T>(comm.comm(), &send, &mut recv, stream)?;
    drop((send, recv));
    Ok(CudaStorage::wrap_cuda_slice(dst, dev.clone()))
}

/// candle's stream of `dev` as a unicomm stream, made once (again if candle's changes).
fn candle_stream<'s>(streams: &'s mut Streams, dev: &CudaDevice) -> Result<&'s unicomm::Stream> {
    let cs = dev.cuda_stream();
    let key = cs.cu_stream() as usize;
    let s = match streams.cuda.take() {
        Some((k, s)) if k == key => s,
        _ => unicomm::Stream::from(
            unicomm::nccl::stream_from_cudarc(cs).map_err(|e| wrap("stream", e))?,
        ),
    };
    Ok(&streams.cuda.insert((key, s)).1)
}

/// The fused all-reduce + residual add + RMSNorm on candle's CUDA tensors: the partial
/// product copied into the workspace and the residual into the output's second half, both
/// on candle's stream, then unicomm's kernel there (the host never waits). The output holds
/// `[normed; next residual]`, every element written by the copy or the kernel.
pub(crate) fn fused_cuda(
    comm: &Communicator,
    work: &mut crate::workspace::Workspace<'_>,
    inputs: [(&CudaStorage, &Layout); 3],
    eps: f32,
) -> Result<CudaStorage> {
    use crate::workspace::Workspace;
    match work {
        Workspace::F32(s) => fused_run::<f32>(comm, s, inputs, eps),
        Workspace::Bf16(s) => fused_run::<unicomm::bf16>(comm, s, inputs, eps),
        Workspace::F16(s) => fused_run::<unicomm::f16>(comm, s, inputs, eps),
    }
}

fn fused_run<T: Element + WithDType + CudaDType + DeviceRepr>(
    comm: &Communicator,
    sym: &mut unicomm::Symmetric<'_, T>,
    [(s1, l1), (s2, l2), (s3, l3)]: [(&CudaStorage, &Layout); 3],
    eps: f32,
) -> Result<CudaStorage> {
    use crate::workspace::{offsets, NAME};
    let e = |e| wrap(NAME, e);
    let (x, r, w) = (offsets(l1)?, offsets(l2)?, offsets(l3)?);
    let n = x.1 - x.0;
    let dev = s1.device();
    let partial = s1.as_cuda_slice::<T>()?.slice(x.0..x.1);
    let residual = s2.as_cuda_slice::<T>()?.slice(r.0..r.1);
    let weight = s3.as_cuda_slice::<T>()?.slice(w.0..w.1);
    // SAFETY: the first half is written by the kernel and the second by the copy below,
    // both enqueued on the stream candle's later kernels use, before anything reads them;
    // if either is not enqueued, `dst` is dropped unread.
    let mut dst = unsafe { dev.alloc::<T>(2 * n) }?;
    let mut streams = comm.locked(NAME)?;
    let stream = candle_stream(&mut streams, dev)?;
    let c = comm.comm();
    {
        let (mut normed, mut summed) = dst.split_at_mut(n);
        let (xs, rs, ws) = (lent(&partial)?, lent(&residual)?, lent(&weight)?);
        let mut into_sym = sym.slice_mut(..n).map_err(e)?;
        c.copy(&xs, &mut into_sym, stream).map_err(e)?;
        let mut sm = unicomm::nccl::lend_mut(&mut summed)
            .map_err(e)?
            .into_backend();
        c.copy(&rs, &mut sm, stream).map_err(e)?;
        let mut nm = unicomm::nccl::lend_mut(&mut normed)
            .map_err(e)?
            .into_backend();
        let how = unicomm::RmsNormOptions::new(eps, unicomm::SymmetricAlgorithm::OneShot);
        c.all_reduce_rms_norm(sym, n, &mut sm, &ws, &mut nm, how, stream)
            .map_err(e)?;
    }
    Ok(CudaStorage::wrap_cuda_slice(dst, dev.clone()))
}

/// A cudarc view lent to unicomm's facade, read-only.
fn lent<'a, T: Element + DeviceRepr>(
    v: &'a cudarc::driver::CudaView<'_, T>,
) -> Result<unicomm::Lent<'a, T>> {
    let l = unicomm::nccl::lend(v).map_err(|e| wrap(crate::workspace::NAME, e))?;
    Ok(l.into_backend())
}
