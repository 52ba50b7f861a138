//! The library's calls: one safe method per NCCL-API entry point (cudarc's `result` layer),
//! each carrying its version gate and turning the result code into a typed [`Result`]. The
//! one place above the loader where the library is called, so `unsafe` for a library call
//! ends here.
//!
//! What a C call needs is proved by the argument types, as rustix does for descriptors:
//! - a communicator is a [`Handle`] borrowed for a lifetime (its owner vouches, once, with
//!   [`Handle::borrow_raw`], that it is live and used by one thread while borrowed), or an
//!   [`OwnedComm`] that the ending calls consume, so an ended communicator cannot be named;
//! - device memory is a [`Slice`](unicomm_core::Slice) of a [`DeviceBytes`] allocation, whose bounds each call
//!   checks against what it reads or writes (count x element size x ranks);
//! - a stream is a [`StreamRef`] borrowed from its owner;
//! - a registration is a [`RegHandle`] that deregistration consumes.
//!
//! `ncclInProgress` is success here: only a non-blocking communicator returns it, and its
//! owner settles it (`ncclCommGetAsyncError`) before the result is used. Which calls of a
//! thread answered it is kept for the owner ([`take_in_progress`]): a call that answered
//! `ncclSuccess` is enqueued and needs no poll (NCCL's non-blocking rule), which spares the
//! hot path one library call per collective.

#![allow(
    unsafe_code,
    reason = "the layer of library calls: every call of the loaded NCCL-API library is here"
)]

use std::cell::Cell;

use crate::sys::api::{Api, NcclComm, NcclResult};
use crate::sys::config::IN_PROGRESS;

mod check;
mod comm;
mod data;
mod device;
mod gates;
mod grow;
mod handles;
mod window;

pub use check::DeviceBytes;
pub use data::{P2p, Sides};
pub use device::OwnedDevComm;
pub use gates::{CONFIG_SINCE, NO_COLOR, P2P_SINCE, REVOKE_SINCE, SHRINK_SINCE, SPLIT_SINCE};
pub use grow::Grower;
pub use handles::{
    CommRef, Handle, LibAlloc, OwnedComm, Progress, RegHandle, ShapedComm, Span, StreamRef,
    WindowRef,
};

thread_local! {
    /// Whether a call of this thread answered `ncclInProgress` since [`take_in_progress`].
    static IN_PROGRESS_SEEN: Cell<bool> = const { Cell::new(false) };
}

/// Whether a library call of this thread answered `ncclInProgress` since the last time this
/// was asked (and forgets it): what decides whether its owner must settle the communicator.
#[inline]
pub fn take_in_progress() -> bool {
    IN_PROGRESS_SEEN.with(|c| c.replace(false))
}

impl Api {
    /// A result code as a result, `ncclInProgress` included as success (and remembered for
    /// [`take_in_progress`]).
    #[inline]
    fn done(
        &self,
        call: &'static str,
        code: NcclResult,
        comm: Option<NcclComm>,
    ) -> unicomm_core::Result<()> {
        if code == IN_PROGRESS {
            IN_PROGRESS_SEEN.with(|c| c.set(true));
            return Ok(());
        }
        self.check(call, code, comm)
    }
}
