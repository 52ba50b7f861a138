//! What a call's arguments are: borrowed and owned communicators, streams, checked ranges
//! of device memory, registrations and allocations of the library.

use std::ffi::c_void;
use std::marker::PhantomData;

use unicomm_core::{Result, Slice};

use super::check::{span, DeviceBytes};
use crate::sys::api::{NcclComm, RawStream};

/// A live communicator, borrowed for `'a`.
#[derive(Clone, Copy, Debug)]
pub struct Handle<'a> {
    pub(super) raw: NcclComm,
    pub(super) _life: PhantomData<&'a ()>,
}

impl Handle<'_> {
    /// # Safety
    /// `raw` is a communicator of the library it is passed to, created and not ended
    /// (finalized, destroyed or aborted) while the handle or a copy of it is used, and used
    /// by one thread at a time meanwhile (NCCL's rule).
    pub unsafe fn borrow_raw(raw: NcclComm) -> Self {
        Handle {
            raw,
            _life: PhantomData,
        }
    }
    /// The raw `ncclComm_t` (to compare, to show in an error).
    pub fn as_raw(self) -> NcclComm {
        self.raw
    }
}

/// A live communicator with its shape, borrowed for `'a`: what a data call needs to know
/// how much memory each rank's side spans and whether this rank is the root.
#[derive(Clone, Copy, Debug)]
pub struct CommRef<'a> {
    pub(super) handle: Handle<'a>,
    pub(super) world: usize,
    pub(super) rank: usize,
}

impl<'a> CommRef<'a> {
    /// # Safety
    /// As [`Handle::borrow_raw`], and `world` is the communicator's rank count, `rank`
    /// this rank's place in it.
    pub unsafe fn borrow_raw(raw: NcclComm, world: usize, rank: usize) -> Self {
        CommRef {
            // SAFETY: the caller's contract.
            handle: unsafe { Handle::borrow_raw(raw) },
            world,
            rank,
        }
    }
    /// The communicator without its rank count.
    pub fn handle(self) -> Handle<'a> {
        self.handle
    }
}

/// A communicator made by a call of this layer, not yet ended: the ending calls consume it.
/// Dropping it leaks the library's communicator (never a use after its end).
#[derive(Debug)]
pub struct OwnedComm {
    pub(super) raw: NcclComm,
}

// SAFETY: a communicator may move between threads; NCCL's rule (one thread at a time) is
// kept by the single owner.
unsafe impl Send for OwnedComm {}

impl OwnedComm {
    /// # Safety
    /// `raw` is a live communicator of the library, owned by nobody else (ended only
    /// through this value).
    pub unsafe fn from_raw(raw: NcclComm) -> Self {
        OwnedComm { raw }
    }
    /// Gives ownership to the caller, who ends it (or re-wraps it with
    /// [`OwnedComm::from_raw`] to end it here).
    pub fn into_raw(self) -> NcclComm {
        self.raw
    }
    /// The communicator, borrowed.
    pub fn handle(&self) -> Handle<'_> {
        // SAFETY: owned and live while `self` is; `&self` keeps it from being ended.
        unsafe { Handle::borrow_raw(self.raw) }
    }
}

/// An owned communicator with its shape (its rank count and this rank's place), vouched
/// once where it is made: lent to each call as a [`CommRef`] with no further promise.
#[derive(Debug)]
pub struct ShapedComm {
    comm: OwnedComm,
    world: usize,
    rank: usize,
}

impl OwnedComm {
    /// This communicator of `world` ranks, where this rank is `rank`.
    ///
    /// # Safety
    /// `world` is the communicator's rank count and `rank` this rank's place in it (the data
    /// calls size each side's memory by them).
    pub unsafe fn shaped(self, world: usize, rank: usize) -> ShapedComm {
        ShapedComm {
            comm: self,
            world,
            rank,
        }
    }
}

impl ShapedComm {
    /// The communicator with its shape, borrowed: live while `self` is, and `&self` keeps
    /// it from being ended; one caller at a time is the owner's to keep (NCCL's rule).
    #[inline]
    pub fn lend(&self) -> CommRef<'_> {
        CommRef {
            handle: self.comm.handle(),
            world: self.world,
            rank: self.rank,
        }
    }
    /// The communicator, borrowed.
    #[inline]
    pub fn handle(&self) -> Handle<'_> {
        self.comm.handle()
    }
    /// The communicator, for the calls that end it.
    pub fn into_owned(self) -> OwnedComm {
        self.comm
    }
}

/// Where a non-blocking communicator's last calls stand (`ncclCommGetAsyncError` without an
/// error): the one reading of `ncclInProgress` outside a call's own result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// The library is done with them.
    Done,
    /// `ncclInProgress`: still working.
    InProgress,
}

/// A stream of the device the communicator uses, borrowed for `'a`.
#[derive(Clone, Copy, Debug)]
pub struct StreamRef<'a> {
    pub(super) raw: RawStream,
    pub(super) _life: PhantomData<&'a ()>,
}

impl StreamRef<'_> {
    /// # Safety
    /// `raw` is a stream (`cudaStream_t`/`hipStream_t`) of the library's runtime, live
    /// while the reference is used.
    pub unsafe fn borrow_raw(raw: RawStream) -> Self {
        StreamRef {
            raw,
            _life: PhantomData,
        }
    }
    /// The raw stream.
    pub fn as_raw(self) -> RawStream {
        self.raw
    }
}

/// A checked range of device memory, as registration takes it.
#[derive(Clone, Copy, Debug)]
pub struct Span<'a> {
    pub(super) addr: usize,
    pub(super) bytes: usize,
    pub(super) _life: PhantomData<&'a ()>,
}

impl<'a> Span<'a> {
    /// The range of `s`, inside its allocation.
    pub fn of<M: DeviceBytes>(s: &Slice<'a, M>) -> Result<Span<'a>> {
        span(Some(s), s.bytes, "buffer")?;
        Ok(Span {
            addr: s.address(),
            bytes: s.bytes,
            _life: PhantomData,
        })
    }
    /// The same range with no borrow, for a helper thread that may outlive the caller.
    ///
    /// # Safety
    /// The caller keeps the memory allocated while the library may use the range, or knows
    /// that what the library does with it past the borrow touches no host memory.
    pub unsafe fn unbound(self) -> Span<'static> {
        Span {
            addr: self.addr,
            bytes: self.bytes,
            _life: PhantomData,
        }
    }
}

/// A registration (`ncclCommRegister`) or a window (`ncclCommWindowRegister`) of one
/// communicator; deregistration consumes it.
#[derive(Debug)]
pub struct RegHandle {
    pub(super) raw: *mut c_void,
}

// SAFETY: an opaque token of the library, not dereferenced on the host by unicomm.
unsafe impl Send for RegHandle {}

impl RegHandle {
    /// # Safety
    /// `raw` was returned by the registration call of the communicator it will be
    /// deregistered from, and is not deregistered by anyone else.
    pub unsafe fn from_raw(raw: usize) -> Self {
        RegHandle {
            raw: raw as *mut c_void,
        }
    }
    /// The handle as a number (kept in a registry until deregistration).
    pub fn into_raw(self) -> usize {
        self.raw as usize
    }
    /// The handle as a number, still owned.
    pub fn as_raw(&self) -> usize {
        self.raw as usize
    }
}

/// A window of the communicator a call names, borrowed for the call.
#[derive(Clone, Copy)]
pub struct WindowRef<'a> {
    pub(super) raw: *mut c_void,
    _life: std::marker::PhantomData<&'a ()>,
}

impl WindowRef<'_> {
    /// # Safety
    /// `raw` is a live window (`ncclCommWindowRegister`) of the communicator the call names,
    /// not deregistered while the reference is used.
    pub unsafe fn borrow_raw(raw: usize) -> Self {
        WindowRef {
            raw: raw as *mut c_void,
            _life: std::marker::PhantomData,
        }
    }
}

/// Memory from `ncclMemAlloc`, freed by [`Api::mem_free`](crate::sys::api::Api::mem_free).
#[derive(Debug)]
pub struct LibAlloc {
    pub(super) ptr: *mut c_void,
}

// SAFETY: a device address, a plain value to the host.
unsafe impl Send for LibAlloc {}

impl LibAlloc {
    /// # Safety
    /// `ptr` was returned by `ncclMemAlloc` of the library and is freed by nobody else.
    pub unsafe fn from_raw(ptr: usize) -> Self {
        LibAlloc {
            ptr: ptr as *mut c_void,
        }
    }
    /// The device address.
    pub fn into_raw(self) -> usize {
        self.ptr as usize
    }
}

/// A communicator a call of this layer made (`None` where it returned NULL).
pub(super) fn made(raw: NcclComm) -> Option<OwnedComm> {
    // SAFETY: returned by the library just now, owned by nobody else.
    (!raw.is_null()).then(|| unsafe { OwnedComm::from_raw(raw) })
}
