//! Interop with existing CUDA code: cudarc streams and slices, and raw device pointers, used
//! directly as unicomm streams and memory (no copy).

#![allow(unsafe_code, reason = "the CUDA driver through cudarc's result layer")]

use std::sync::Arc;

use unicomm_core::Result;
use unicomm_nccl_api::{ApiMemory, ApiStream};

use crate::runtime::CudaStreamHandle;
use crate::{cuda, NcclMemory, NcclStream};

/// A cudarc stream as a unicomm stream.
pub fn stream_from_cudarc(s: Arc<cudarc::driver::CudaStream>) -> Result<NcclStream> {
    let dev = s.context().ordinal();
    ApiStream::from_runtime(cuda()?, CudaStreamHandle(s), dev)
}

/// A raw CUDA stream (`cudaStream_t` / `CUstream` of device `dev`, from another library:
/// PyTorch's current stream, a framework's compute stream) as a unicomm stream, without
/// taking it over: dropping the result does not destroy the stream.
///
/// # Safety
/// `stream` is a valid stream of CUDA device `dev`'s primary context that outlives the
/// returned value and every operation enqueued through it; ordering with work its owner
/// enqueues is the stream's own order.
pub unsafe fn stream_from_raw(dev: usize, stream: *mut std::ffi::c_void) -> Result<NcclStream> {
    let ctx = cuda()?.context(dev)?;
    // SAFETY: forwarded from the caller (a live stream of this context, kept alive).
    let s = unsafe { ctx.wrap_borrowed_stream(stream.cast()) };
    ApiStream::from_runtime(cuda()?, CudaStreamHandle(s), dev)
}

/// A cudarc slice as unicomm memory, without a copy. The slice is kept alive by the
/// returned memory (and freed with it).
pub fn memory_from_cudarc<T: cudarc::driver::DeviceRepr + Send + Sync + 'static>(
    slice: cudarc::driver::CudaSlice<T>,
) -> Result<NcclMemory> {
    use cudarc::driver::DevicePtr;
    let dev = slice.context().ordinal();
    let bytes = slice.num_bytes();
    let stream = slice.stream().clone();
    let (p, sync) = slice.device_ptr(&stream);
    let p = p as usize;
    drop(sync);
    // SAFETY: the slice's memory belongs to device `dev` and is kept alive by `keep`.
    unsafe { ApiMemory::borrowed(cuda()?, dev, p, bytes, Some(Box::new(slice))) }
}

/// Raw device memory as unicomm memory, without a copy.
///
/// # Safety
/// `ptr..ptr+bytes` is memory of CUDA device `dev` that outlives the returned value and
/// every operation enqueued on it.
pub unsafe fn memory_from_raw(dev: usize, ptr: usize, bytes: usize) -> Result<NcclMemory> {
    // SAFETY: forwarded from the caller.
    unsafe { ApiMemory::borrowed(cuda()?, dev, ptr, bytes, None) }
}
