//! The calls on a communicator's symmetric windows: registration and its end (NCCL >=
//! 2.27), the address a window was registered at and a peer's part of it for this rank's
//! kernels (NCCL >= 2.29.2).

use std::ffi::{c_int, c_void};

use unicomm_core::{Error, Result};

use super::gates::{ONE_SIDED_SINCE, PEER_POINTER_SINCE};
use super::handles::{Handle, RegHandle, Span, WindowRef};
use crate::sys::api::{Api, WIN_COLL_SYMMETRIC};
use crate::sys::target::ONE_SIDED_TITLE;

impl Api {
    /// `ncclCommWindowRegister` of `buf` for symmetric collectives (NCCL >= 2.27): `None`
    /// where the library returned no window (no symmetric memory here). A non-blocking
    /// communicator writes the window when the call settles: `slot` receives it then.
    pub fn window_register(
        &self,
        comm: Handle<'_>,
        buf: Span<'_>,
        slot: &mut *mut c_void,
    ) -> Result<()> {
        let f = self.gated(
            "symmetric windows (ncclCommWindowRegister)",
            self.flavor.windows_since,
            self.fns
                .window_register
                .filter(|_| self.fns.window_deregister.is_some()),
        )?;
        let addr = buf.addr as *mut c_void;
        // SAFETY: `addr..addr+bytes` is device memory (a checked span); `slot` receives the window
        // and outlives the call's settling (the caller's borrow).
        let code = unsafe { f(comm.raw, addr, buf.bytes, slot, WIN_COLL_SYMMETRIC) };
        self.done("ncclCommWindowRegister", code, Some(comm.raw))
    }

    /// A window written into the slot of [`Api::window_register`], once settled.
    pub fn window_of(slot: *mut c_void) -> Option<RegHandle> {
        (!slot.is_null()).then_some(RegHandle { raw: slot })
    }

    /// `ncclCommWindowDeregister`.
    pub fn window_deregister(&self, comm: Handle<'_>, w: RegHandle) -> Result<()> {
        let f = self.fns.window_deregister;
        let f = f.ok_or_else(|| {
            Error::invalid("handle", "the library has no ncclCommWindowDeregister")
        })?;
        // SAFETY: a window of this communicator (the handle's contract), consumed.
        let code = unsafe { f(comm.raw, w.raw) };
        self.done("ncclCommWindowDeregister", code, Some(comm.raw))
    }

    /// `ncclWinGetUserPtr`: the address the window was registered at.
    pub fn win_user_ptr(&self, comm: Handle<'_>, win: WindowRef<'_>) -> Result<usize> {
        let f = self.gated(ONE_SIDED_TITLE, ONE_SIDED_SINCE, self.fns.win_get_user_ptr)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: a live communicator and a live window of it; `p` receives a pointer.
        let code = unsafe { f(comm.raw, win.raw, &mut p) };
        self.check("ncclWinGetUserPtr", code, Some(comm.raw))?;
        Ok(p as usize)
    }

    /// `ncclGetPeerDevicePointer`: where `peer`'s part of `win` lies for this rank's
    /// kernels, from byte `offset`; `None` where the peer is outside this rank's NVLink
    /// domain (NCCL answers NULL). NCCL >= 2.29.2.
    pub fn peer_device_ptr(
        &self,
        win: WindowRef<'_>,
        offset: usize,
        peer: usize,
    ) -> Result<Option<usize>> {
        let what = "a window's peer pointers (ncclGetPeerDevicePointer)";
        let f = self.gated(what, PEER_POINTER_SINCE, self.fns.get_peer_device_pointer)?;
        let peer = c_int::try_from(peer).map_err(|_| Error::invalid("peer", "past c_int"))?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: a live window of a live communicator (the caller holds it registered);
        // `p` receives a pointer.
        let code = unsafe { f(win.raw, offset, peer, &mut p) };
        self.check("ncclGetPeerDevicePointer", code, None)?;
        Ok((!p.is_null()).then_some(p as usize))
    }
}
