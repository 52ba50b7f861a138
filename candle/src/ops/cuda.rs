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
