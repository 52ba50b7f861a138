//! Interop with existing CUDA code: cudarc streams and slices, and raw device pointers, used
//! directly as unicomm streams and memory (no copy).

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
