//! Interop with other HIP code, and the handles unicomm holds: HIP streams (made here, or
//! another library's, borrowed), timing events, and another library's device memory lent
//! without copies.

#![allow(unsafe_code, reason = "HIP handles and raw memory of other libraries")]

use std::ffi::c_void;

use unicomm_core::{Element, Lent, LentMut, Result};
use unicomm_nccl_api::{ApiMemory, ApiStream, Runtime};

use crate::sys::HipEvent;
use crate::{hip, RcclComm, RcclStream};

/// A HIP stream: made by unicomm (destroyed on drop) or another library's (borrowed: never
/// destroyed here).
#[derive(Debug)]
pub struct HipStreamHandle(pub *mut c_void, pub(crate) usize, bool);

// SAFETY: a hipStream_t may be used from any thread (HIP streams are not thread-bound).
unsafe impl Send for HipStreamHandle {}
// SAFETY: HIP's stream calls are thread-safe.
unsafe impl Sync for HipStreamHandle {}

impl HipStreamHandle {
    /// A stream unicomm created on `dev`, destroyed on drop.
    pub(crate) fn owned(s: *mut c_void, dev: usize) -> Self {
        HipStreamHandle(s, dev, true)
    }
}

impl Drop for HipStreamHandle {
    fn drop(&mut self) {
        // Another library's stream is its own to destroy. The runtime is process-wide
        // (crate::hip()); every stream holds it through its ApiStream.
        if !self.2 {
            return;
        }
        if let Ok(rt) = hip() {
            let _ = rt.with_device(self.1, || {
                // SAFETY: a stream created by hipStreamCreateWithFlags, destroyed once.
                rt.check("hipStreamDestroy", unsafe {
                    (rt.fns.stream_destroy)(self.0)
                })
            });
        }
    }
}

/// A HIP timing event of one device, destroyed on drop.
#[derive(Debug)]
pub struct HipEventHandle(pub(crate) HipEvent, pub(crate) usize);

// SAFETY: a hipEvent_t may be recorded, awaited and destroyed from any thread (HIP's
// event calls are thread-safe).
unsafe impl Send for HipEventHandle {}
// SAFETY: as above.
unsafe impl Sync for HipEventHandle {}

impl Drop for HipEventHandle {
    fn drop(&mut self) {
        if let Ok(rt) = hip() {
            let _ = rt.with_device(self.1, || {
                // SAFETY: an event created by hipEventCreate, destroyed once.
                rt.check("hipEventDestroy", unsafe { (rt.fns.event_destroy)(self.0) })
            });
        }
    }
}

/// A raw HIP stream of device `dev` from another library (PyTorch's current stream on
/// ROCm, a framework's compute stream) as a unicomm stream, without taking it over:
/// dropping the result does not destroy the stream.
///
/// # Safety
/// `stream` is a valid stream of HIP device `dev` that outlives the returned value and
/// every operation enqueued through it.
pub unsafe fn stream_from_raw(dev: usize, stream: *mut c_void) -> Result<RcclStream> {
    ApiStream::from_runtime(hip()?, HipStreamHandle(stream, dev, false), dev)
}

/// `len` elements of `T` at a raw device pointer of HIP device `dev` (another library's
/// tensor), lent for `'a` to be read. Dropping the view never frees the memory.
///
/// # Safety
/// `ptr` points to at least `len` elements of `T` in memory of device `dev` that stays
/// allocated, and is not written by anyone else, for `'a` and until every collective
/// enqueued on it has run.
pub unsafe fn lend_raw<'a, T: Element>(
    dev: usize,
    ptr: usize,
    len: usize,
) -> Result<Lent<'a, T, RcclComm>> {
    // SAFETY: forwarded from the caller; borrowed memory is never freed by unicomm.
    let mem = unsafe { ApiMemory::borrowed_elems::<T>(hip()?, dev, ptr, len) }?;
    Lent::from_memory(mem, len)
}

/// As [`lend_raw`], to be written: nobody else uses the memory meanwhile.
///
/// # Safety
/// As [`lend_raw`], and the memory is not used at all by anyone else for `'a`.
pub unsafe fn lend_raw_mut<'a, T: Element>(
    dev: usize,
    ptr: usize,
    len: usize,
) -> Result<LentMut<'a, T, RcclComm>> {
    // SAFETY: forwarded from the caller; borrowed memory is never freed by unicomm.
    let mem = unsafe { ApiMemory::borrowed_elems::<T>(hip()?, dev, ptr, len) }?;
    LentMut::from_memory(mem, len)
}
