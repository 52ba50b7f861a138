//! Interop with existing CUDA code: cudarc streams and slices, and raw device pointers, used
//! directly as unicomm streams and memory (no copy).

#![allow(unsafe_code, reason = "the CUDA driver through cudarc's result layer")]

use std::sync::Arc;

use cudarc::driver::{DevicePtr, DevicePtrMut};
use unicomm_core::{Element, Lent, LentMut, Result};
use unicomm_nccl_api::{ApiMemory, ApiStream};

use crate::runtime::CudaStreamHandle;
use crate::{cuda, NcclComm, NcclMemory, NcclStream};

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
    let dev = slice.context().ordinal();
    let bytes = slice.num_bytes();
    let stream = slice.stream().clone();
    let (p, sync) = slice.device_ptr(&stream);
    let p = p as usize;
    drop(sync);
    // SAFETY: the slice's memory belongs to device `dev` and is kept alive by `keep`.
    unsafe { ApiMemory::borrowed(cuda()?, dev, p, bytes, Some(Box::new(slice))) }
}

/// Raw device memory as unicomm memory, without a copy. Dropping the result never frees
/// the memory: its owner does.
///
/// # Safety
/// `ptr..ptr+bytes` is memory of CUDA device `dev` that outlives the returned value and
/// every operation enqueued on it.
pub unsafe fn memory_from_raw(dev: usize, ptr: usize, bytes: usize) -> Result<NcclMemory> {
    // SAFETY: forwarded from the caller.
    unsafe { ApiMemory::borrowed(cuda()?, dev, ptr, bytes, None) }
}

/// An engine's cudarc slice or view (`&CudaSlice<T>`, `&CudaView<T>`) lent to unicomm for
/// the borrow, as a collective's input: no copy, no `unsafe`, and dropping the view frees
/// nothing. The collective must run on the slice's own stream (an engine's compute stream,
/// through [`stream_from_cudarc`]), or be ordered against it by a marker: cudarc's
/// cross-stream events are not carried past the call.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = cudarc::driver::CudaContext::new(0)?;
/// let slice = ctx.default_stream().alloc_zeros::<f32>(4)?;
/// let lent = unicomm_nccl::lend(&slice)?; // a collective's input while `slice` is borrowed
/// drop(lent);
/// # Ok(()) }
/// ```
///
/// The borrow is checked: a view cannot outlive its slice.
///
/// ```compile_fail,E0597
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = cudarc::driver::CudaContext::new(0)?;
/// let lent = {
///     let slice = ctx.default_stream().alloc_zeros::<f32>(4)?;
///     unicomm_nccl::lend(&slice)?
/// };
/// drop(lent);
/// # Ok(()) }
/// ```
pub fn lend<T: Element, S: DevicePtr<T>>(slice: &S) -> Result<Lent<'_, T, NcclComm>> {
    let stream = slice.stream();
    let dev = stream.context().ordinal();
    let bytes = slice.num_bytes();
    let (p, sync) = slice.device_ptr(stream);
    drop(sync);
    // SAFETY: the memory belongs to device `dev` (the slice's context) and the borrow of
    // `slice`, which the result holds for its lifetime, keeps it allocated and unwritten by
    // safe code; `Borrowed(None)` never frees it.
    let mem = unsafe { ApiMemory::borrowed(cuda()?, dev, p as usize, bytes, None) }?;
    // cudarc frees the slice in stream order on its stream: a collective on another stream
    // orders that stream after itself.
    let mem = mem.lent_on(CudaStreamHandle(stream.clone()));
    Lent::from_memory(mem, slice.len())
}

/// An engine's cudarc slice or view (`&mut CudaSlice<T>`, `&mut CudaViewMut<T>`) lent to
/// unicomm for the borrow, as a collective's output: as [`lend`], and the exclusive borrow
/// keeps every other use of the slice out while the view lives.
///
/// ```compile_fail,E0502
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = cudarc::driver::CudaContext::new(0)?;
/// let mut slice = ctx.default_stream().alloc_zeros::<f32>(4)?;
/// let out = unicomm_nccl::lend_mut(&mut slice)?;
/// let read = unicomm_nccl::lend(&slice)?; // another view while it is lent to be written
/// drop((out, read));
/// # Ok(()) }
/// ```
pub fn lend_mut<T: Element, S: DevicePtrMut<T>>(slice: &mut S) -> Result<LentMut<'_, T, NcclComm>> {
    let len = slice.len();
    let bytes = slice.num_bytes();
    let stream = slice.stream().clone();
    let dev = stream.context().ordinal();
    let (p, sync) = slice.device_ptr_mut(&stream);
    drop(sync);
    // SAFETY: as in `lend`, with the exclusive borrow of `slice` held by the result.
    let mem = unsafe { ApiMemory::borrowed(cuda()?, dev, p as usize, bytes, None) }?;
    let mem = mem.lent_on(CudaStreamHandle(stream));
    LentMut::from_memory(mem, len)
}

/// `len` elements of `T` at a raw device pointer of CUDA device `dev` (another library's
/// tensor), lent for `'a`. Dropping the view never frees the memory.
///
/// # Safety
/// `ptr` points to at least `len` elements of `T` in memory of device `dev` that stays
/// allocated for `'a` and is not written by anyone else meanwhile (for [`lend_raw_mut`],
/// not used at all by anyone else), and past `'a` until every collective enqueued on it
/// has run.
pub unsafe fn lend_raw<'a, T: Element>(
    dev: usize,
    ptr: usize,
    len: usize,
) -> Result<Lent<'a, T, NcclComm>> {
    // SAFETY: forwarded from the caller; borrowed memory is never freed by unicomm.
    let mem = unsafe { ApiMemory::borrowed_elems::<T>(cuda()?, dev, ptr, len) }?;
    Lent::from_memory(mem, len)
}

/// As [`lend_raw`], to be written.
///
/// # Safety
/// As [`lend_raw`].
pub unsafe fn lend_raw_mut<'a, T: Element>(
    dev: usize,
    ptr: usize,
    len: usize,
) -> Result<LentMut<'a, T, NcclComm>> {
    // SAFETY: forwarded from the caller; borrowed memory is never freed by unicomm.
    let mem = unsafe { ApiMemory::borrowed_elems::<T>(cuda()?, dev, ptr, len) }?;
    LentMut::from_memory(mem, len)
}
