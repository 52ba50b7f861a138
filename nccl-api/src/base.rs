//! What every path runs on ([`Base`]): the library's communicator, the bookkeeping of its
//! registrations, the ranks' agreement and the library-call path, with the registration calls
//! over them (the check, the library call and the bookkeeping as one step each).

#![allow(
    unsafe_code,
    reason = "calls the NCCL-API library or the device runtime at its call sites (the architecture test's UNSAFE_FILES lists them)"
)]

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use unicomm_core::registry::{RegKind, Registry};
use unicomm_core::{Error, RawHandle, Result};

use crate::agree::Agreement;
use crate::group;
use crate::libcomm::LibComm;
use crate::library::Library;
use crate::memory::ApiMemory;
use crate::sys::api::{NcclComm, WIN_COLL_SYMMETRIC};
use crate::sys::runtime::Runtime;
use crate::wait::SendPtr;

/// Handles for zero-byte registrations, which never reach the library (there is nothing
/// to register); they live in the upper half of the address space no library hands out.
static NEXT_EMPTY: AtomicUsize = AtomicUsize::new(usize::MAX / 2);

fn is_empty_handle(h: RawHandle) -> bool {
    h.0 >= usize::MAX / 2
}

/// A library deregistration call (`ncclCommDeregister`, `ncclCommWindowDeregister`).
pub(crate) type DeregisterFn = unsafe extern "C" fn(NcclComm, *mut c_void) -> c_int;

/// The communicator every path runs on, and what it shares with them.
pub(crate) struct Base<R: Runtime> {
    pub(crate) lc: Arc<LibComm<R>>,
    pub(crate) registry: Registry,
    pub(crate) agree: Agreement<R>,
    pub(crate) library: Library<R>,
}

impl<R: Runtime> Base<R> {
    pub(crate) fn new(lc: Arc<LibComm<R>>, check: bool) -> Result<Self> {
        Ok(Base {
            library: Library::new(&lc)?,
            lc,
            registry: Registry::new(),
            agree: Agreement::new(check),
        })
    }

    /// Memory of this rank's device, or `InvalidArgument`.
    pub(crate) fn check_memory(&self, mem: &ApiMemory<R>) -> Result<()> {
        if mem.dev == self.lc.dev {
            return Ok(());
        }
        Err(Error::invalid(
            "buffer",
            format!(
                "memory of device {}, used by the communicator of device {}",
                mem.dev, self.lc.dev
            ),
        ))
    }

    /// The element-wise maximum of every rank's `words` (collective).
    pub(crate) fn all_max(&self, words: &[u64]) -> Result<Vec<u64>> {
        self.agree.all_max(&self.lc, words)
    }

    /// A stream-ordered barrier on `st`.
    pub(crate) fn barrier_on(&self, st: *mut c_void) -> Result<()> {
        self.library.barrier_on(&self.lc, st)
    }

    /// Collective registrations (window, the second communicator's split) are refused
    /// inside `Comm::group`: NCCL would defer them to the group's end and write their
    /// out-parameter then, after this call returned (a dangling write), and a bounded call
    /// cannot run on another thread (groups are per thread). The mock accepts them there
    /// (its registrations are not deferred): documented in docs/reliability.md.
    pub(crate) fn not_in_group(&self, what: &str) -> Result<()> {
        if group::in_group() {
            return Err(Error::invalid(
                "group",
                format!("{what} is collective and cannot be called inside Comm::group on {}; call it before or after the group", self.lc.api.flavor.library),
            ));
        }
        Ok(())
    }

    /// Registers `mem[offset..offset+bytes]` through `call` (which gets the communicator and
    /// the address, and returns the library's handle) and records it; zero bytes never reach
    /// the library (there is nothing to register).
    pub(crate) fn register_range(
        &self,
        mem: &ApiMemory<R>,
        (offset, bytes): (usize, usize),
        kind: RegKind,
        call: impl FnOnce(NcclComm, *mut c_void) -> Result<*mut c_void>,
    ) -> Result<RawHandle> {
        self.check_memory(mem)?;
        let addr = mem.range(offset, bytes, "bytes")?;
        let h = if bytes == 0 {
            RawHandle(NEXT_EMPTY.fetch_add(1, Ordering::Relaxed))
        } else {
            RawHandle(self.lc.call(|c| call(c, addr as *mut c_void))? as usize)
        };
        self.registry.insert(h, addr, bytes, kind)?;
        Ok(h)
    }

    /// Deregisters a live handle of `kind` with `f`, then forgets it.
    pub(crate) fn deregister_handle(
        &self,
        handle: RawHandle,
        kind: RegKind,
        name: &'static str,
        f: Option<DeregisterFn>,
    ) -> Result<()> {
        // Taken out of the table before the library call, as one step: of two threads
        // deregistering one handle, one reaches the library and the other gets an error.
        self.registry
            .release(handle, kind, || self.deregister_raw(handle, name, f))
    }

    /// The library's deregistration of `h` alone (the caller has taken `h` out of the
    /// registry).
    pub(crate) fn deregister_raw(
        &self,
        h: RawHandle,
        name: &'static str,
        f: Option<DeregisterFn>,
    ) -> Result<()> {
        if is_empty_handle(h) {
            return Ok(()); // a zero-byte registration never reached the library
        }
        let f = f.ok_or_else(|| Error::invalid("handle", format!("the library has no {name}")))?;
        // SAFETY: a live handle of this communicator, taken out of the table by the caller,
        // so deregistered once.
        self.lc
            .call(|c| self.lc.check(name, unsafe { f(c, h.0 as *mut c_void) }))
    }

    /// `ncclCommRegister` over `mem[offset..offset+bytes]`.
    pub(crate) fn buffer_register(
        &self,
        mem: &ApiMemory<R>,
        range: (usize, usize),
    ) -> Result<RawHandle> {
        let (api, lc) = (&self.lc.api, &self.lc);
        let f = api.gated(
            "user-buffer registration (ncclCommRegister)",
            api.flavor.registration_since,
            api.fns
                .comm_register
                .filter(|_| api.fns.comm_deregister.is_some()),
        )?;
        let bytes = range.1;
        self.register_range(mem, range, RegKind::Buffer, |c, addr| {
            let mut h = std::ptr::null_mut();
            // SAFETY: `addr..addr+bytes` is device memory of this rank; `h` receives the handle.
            lc.check("ncclCommRegister", unsafe { f(c, addr, bytes, &mut h) })?;
            // Non-blocking: the handle is written when the call is done.
            lc.settle_locked("ncclCommRegister")?;
            Ok(h)
        })
    }

    /// `ncclCommWindowRegister` over `mem[offset..offset+bytes]`, recorded as `kind` (a
    /// window, or the window of an automatic registration). NULL from the library (no
    /// symmetric memory here) is `Unsupported`.
    pub(crate) fn window_register(
        &self,
        mem: &ApiMemory<R>,
        range: (usize, usize),
        kind: RegKind,
    ) -> Result<RawHandle> {
        let (api, lc) = (&self.lc.api, &self.lc);
        let f = api.gated(
            "symmetric windows (ncclCommWindowRegister)",
            api.flavor.windows_since,
            api.fns
                .window_register
                .filter(|_| api.fns.window_deregister.is_some()),
        )?;
        self.not_in_group("a symmetric window registration")?;
        let bytes = range.1;
        self.register_range(mem, range, kind, |c, addr| {
            let w = if lc.nonblocking {
                let mut w = std::ptr::null_mut();
                // SAFETY: `addr..addr+bytes` is device memory of this rank; `w` receives
                // the window and lives until the call settles below.
                let code = unsafe { f(c, addr, bytes, &mut w, WIN_COLL_SYMMETRIC) };
                lc.check("ncclCommWindowRegister", code)?;
                // Non-blocking: the window is written when the call is done.
                lc.settle_locked("ncclCommWindowRegister")?;
                w
            } else {
                // Collective: it waits for the peers on the host; bounded by the deadline.
                let (sc, sa) = (SendPtr(c), SendPtr(addr));
                let (code, w) = lc.bounded_locked(
                    "ncclCommWindowRegister",
                    move || {
                        let (sc, sa) = (sc, sa);
                        let mut w = std::ptr::null_mut();
                        // SAFETY: as above; the caller holds the communicator's lock
                        // while this runs, and gives the communicator up if it does not
                        // return in time.
                        let code = unsafe { f(sc.0, sa.0, bytes, &mut w, WIN_COLL_SYMMETRIC) };
                        (code, SendPtr(w))
                    },
                    |_| {},
                )?;
                lc.check("ncclCommWindowRegister", code)?;
                w.0
            };
            if w.is_null() {
                // NCCL returns success and no window where symmetric memory is unsupported.
                return Err(Error::unsupported(
                    "symmetric window",
                    "symmetric-memory support (cuMem memory from ncclMemAlloc, NVLink or a supported transport)",
                    format!("{} {} returned a NULL window", api.flavor.library, api.version),
                ));
            }
            Ok(w)
        })
    }
}
