//! What every path runs on ([`Base`]): the library's communicator, the bookkeeping of its
//! registrations, the ranks' agreement and the library-call path, with the registration calls
//! over them (the check, the library call and the bookkeeping as one step each).

#![allow(
    unsafe_code,
    reason = "calls the NCCL-API library or the device runtime at its call sites (the architecture test's UNSAFE_FILES lists them)"
)]

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use unicomm_core::registry::{RegKind, Registry};
use unicomm_core::{Error, RawHandle, Result, Slice};

use crate::agree::Agreement;
use crate::group;
use crate::libcomm::call::Lent;
use crate::libcomm::LibComm;
use crate::library::Library;
use crate::memory::ApiMemory;
use crate::sys::api::Api;
use crate::sys::calls::{CommRef, RegHandle, Span, StreamRef, WindowRef};
use crate::sys::runtime::Runtime;

/// Handles for zero-byte registrations, which never reach the library (there is nothing
/// to register); they live in the upper half of the address space no library hands out.
static NEXT_EMPTY: AtomicUsize = AtomicUsize::new(usize::MAX / 2);

pub(crate) fn is_empty_handle(h: RawHandle) -> bool {
    h.0 >= usize::MAX / 2
}

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
    pub(crate) fn barrier_on(&self, st: StreamRef<'_>) -> Result<()> {
        self.library.barrier_on(&self.lc, st)
    }

    /// Collective registrations (window, the second communicator's split) are refused
    /// inside `Comm::group`: NCCL would defer them to the group's end and write their
    /// out-parameter then, after this call returned (a dangling write), and a bounded call
    /// cannot run on another thread (groups are per thread). The mock accepts them there
    /// (its registrations are not deferred): documented in docs/reliability.md.
    /// Before one of unicomm's kernels is launched on `stream`: the stream of this
    /// communicator's device, not inside a group (a kernel is not the library's to defer),
    /// the communicator live.
    pub(crate) fn ready_for_kernel(&self, stream: &crate::memory::ApiStream<R>) -> Result<()> {
        if stream.dev != self.lc.dev {
            return Err(foreign_stream(stream.dev, self.lc.dev));
        }
        if group::in_group() {
            return Err(unicomm_core::symmetric::refused_in_group());
        }
        self.lc.live_now()
    }

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
    /// the range, and returns the library's handle) and records it; zero bytes never reach
    /// the library (there is nothing to register).
    pub(crate) fn register_range(
        &self,
        mem: &ApiMemory<R>,
        offset: usize,
        bytes: usize,
        kind: RegKind,
        call: impl FnOnce(&mut Lent<'_, R>, &Slice<'_, ApiMemory<R>>) -> Result<RegHandle>,
    ) -> Result<RawHandle> {
        self.check_memory(mem)?;
        let addr = mem.range(offset, bytes, "bytes")?;
        let h = if bytes == 0 {
            RawHandle(NEXT_EMPTY.fetch_add(1, Ordering::Relaxed))
        } else {
            let buf = Slice { mem, offset, bytes };
            RawHandle(self.lc.call_lent(|l| call(l, &buf))?.into_raw())
        };
        self.registry.insert(h, addr, bytes, kind)?;
        Ok(h)
    }

    /// Deregisters a live handle of `kind`, then forgets it.
    pub(crate) fn deregister_handle(&self, handle: RawHandle, kind: RegKind) -> Result<()> {
        // Taken out of the table before the library call, as one step: of two threads
        // deregistering one handle, one reaches the library and the other gets an error.
        self.registry
            .release(handle, kind, || self.deregister_raw(handle, kind))
    }

    /// The library's deregistration of `h` alone (`ncclCommDeregister` for a buffer,
    /// `ncclCommWindowDeregister` for a window or an automatic registration's window); the
    /// caller has taken `h` out of the registry.
    pub(crate) fn deregister_raw(&self, h: RawHandle, kind: RegKind) -> Result<()> {
        if is_empty_handle(h) {
            return Ok(()); // a zero-byte registration never reached the library
        }
        if kind != RegKind::Buffer {
            // NCCL unmaps a window's peer mappings at once (2.30.7's symWindowDestroy), while
            // a kernel of NCCL's or an engine's may still read them: the device's work first,
            // within the deadline.
            self.lc.live_now()?;
            let (rt, dev) = (self.lc.rt.clone(), self.lc.dev);
            let what = "the device's work before ncclCommWindowDeregister";
            crate::wait::bounded(
                what,
                self.lc.timeout(),
                move || rt.synchronize_device(dev),
                |_| {},
            )??;
        }
        self.lc.call(|c| {
            // SAFETY: a registration of this communicator of this kind (the registry
            // recorded it so), taken out of the table by the caller: deregistered once.
            let rh = unsafe { RegHandle::from_raw(h.0) };
            match kind {
                RegKind::Buffer => self.lc.api.comm_deregister(c.handle(), rh),
                _ => self.lc.api.window_deregister(c.handle(), rh),
            }
        })
    }

    /// Runs `f` with `h`, a live window of this communicator, and its size in bytes, the
    /// window held registered through `f` (the registry's lock: a deregistration on another
    /// thread waits for it).
    pub(crate) fn with_window<T>(
        &self,
        h: RawHandle,
        f: impl FnOnce(WindowRef<'_>, usize) -> Result<T>,
    ) -> Result<T> {
        self.registry.while_live(h, RegKind::Window, |size| {
            // SAFETY: a window of this communicator (the registry recorded it so, with the
            // library's handle), live while the registry's lock is held.
            f(unsafe { WindowRef::borrow_raw(h.0) }, size)
        })
    }

    /// `ncclCommRegister` over `mem[offset..offset+bytes]`.
    pub(crate) fn buffer_register(
        &self,
        mem: &ApiMemory<R>,
        range: (usize, usize),
    ) -> Result<RawHandle> {
        self.buffer_register_as(mem, range, RegKind::Buffer)
    }

    /// `ncclCommRegister` over `mem[offset..offset+bytes]`, recorded as `kind` (a buffer, or
    /// an automatic registration where the communicator has no symmetric window).
    pub(crate) fn buffer_register_as(
        &self,
        mem: &ApiMemory<R>,
        range: (usize, usize),
        kind: RegKind,
    ) -> Result<RawHandle> {
        let lc = &self.lc;
        self.register_range(mem, range.0, range.1, kind, |l, buf| {
            let h = lc.api.comm_register(l.comm()?.handle(), Span::of(buf)?)?;
            // Non-blocking: the handle is written when the call is done.
            l.settle("ncclCommRegister")?;
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
        api.require(
            "symmetric windows (ncclCommWindowRegister)",
            api.flavor.windows_since,
            api.fns.window_register.is_some() && api.fns.window_deregister.is_some(),
        )?;
        self.not_in_group("a symmetric window registration")?;
        self.register_range(mem, range.0, range.1, kind, |l, buf| {
            let w = if lc.nonblocking {
                let mut w = std::ptr::null_mut();
                api.window_register(l.comm()?.handle(), Span::of(buf)?, &mut w)?;
                // Non-blocking: the window is written when the call is done.
                l.settle("ncclCommWindowRegister")?;
                w
            } else {
                // Collective: it waits for the peers on the host; bounded by the deadline.
                // SAFETY: the memory is borrowed for the whole wait; past the deadline the
                // library may still map the range (device-side: no host memory is touched
                // through it) and the communicator is given up.
                let span = unsafe { Span::of(buf)?.unbound() };
                let api2 = api.clone();
                let w = l.bounded(
                    "ncclCommWindowRegister",
                    move |h| {
                        let mut w = std::ptr::null_mut();
                        api2.window_register(h, span, &mut w).map(|()| SendWindow(w))
                    },
                    |_| {},
                )??;
                w.0
            };
            let h = Api::window_of(w).ok_or_else(|| {
                // NCCL returns success and no window where symmetric memory is unsupported.
                Error::unsupported(
                    "symmetric window",
                    "symmetric-memory support (cuMem memory from ncclMemAlloc, NVLink or a supported transport)",
                    format!("{} {} returned a NULL window", api.flavor.library, api.version),
                )
            })?;
            window_starts_at(api, l.comm()?, &h, buf.address())?;
            Ok(h)
        })
    }
}

/// Where the library has `ncclWinGetUserPtr` (NCCL >= 2.29.2): its own record of window `h`
/// names the buffer registered at `addr`, what one-sided puts into it rest on. Otherwise
/// the registration is refused; the window is left with the library until the communicator
/// ends (its deregistration is collective: this rank alone would wait for its peers).
fn window_starts_at(api: &Api, c: CommRef<'_>, h: &RegHandle, addr: usize) -> Result<()> {
    if api.version < crate::sys::flavor::ONE_SIDED_SINCE || api.fns.win_get_user_ptr.is_none() {
        return Ok(());
    }
    // SAFETY: a window just registered on this communicator, not deregistered (the caller
    // still holds its handle).
    let win = unsafe { WindowRef::borrow_raw(h.as_raw()) };
    let at = api.win_user_ptr(c.handle(), win)?;
    if at == addr {
        return Ok(());
    }
    Err(Error::invalid(
        "buffer",
        format!(
            "{} says the window starts at {at:#x}, registered at {addr:#x}",
            api.flavor.library
        ),
    ))
}

/// A window written by a registration on a helper thread.
struct SendWindow(*mut c_void);
// SAFETY: an opaque token of the library, a plain value to the host.
unsafe impl Send for SendWindow {}

/// A stream of another device than the communicator's.
#[cold]
#[inline(never)]
pub(crate) fn foreign_stream(stream: usize, comm: usize) -> Error {
    Error::invalid(
        "stream",
        format!("a stream of device {stream} used by the communicator of device {comm}"),
    )
}
