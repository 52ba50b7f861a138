//! Shrinking a communicator after a failure: `ncclCommShrink` (NCCL >= 2.27; RCCL from
//! 2.27.7, unverified on its headers) in its default and abort modes, and `ncclCommRevoke`
//! (NCCL >= 2.28.7), which stops the work in flight and leaves the communicator quiescent
//! for a shrink. Without them the survivors re-form (`comm/shrink.rs`).

#![allow(
    unsafe_code,
    reason = "calls the NCCL-API library or the device runtime at its call sites (the architecture test's UNSAFE_FILES lists them)"
)]

use std::ffi::c_int;
use std::sync::Arc;

use unicomm_core::{Result, Version};

use crate::conv::OwnedConfig;
use crate::libcomm::LibComm;
use crate::split::derive_raw;
use crate::sys::api::NcclComm;
use crate::sys::runtime::Runtime;
use crate::wait::settle_raw;

/// `ncclCommShrink` exists from NCCL 2.27.
pub(crate) const SHRINK_SINCE: Version = Version::new(2, 27, 0);
/// `ncclCommRevoke` exists from NCCL 2.28.7.
pub(crate) const REVOKE_SINCE: Version = Version::new(2, 28, 7);

type ShrinkFn = unsafe extern "C" fn(
    NcclComm,
    *mut c_int,
    c_int,
    *mut NcclComm,
    *mut std::ffi::c_void,
    c_int,
) -> crate::sys::api::NcclResult;

/// `ncclCommShrink(parent, exclude, config, flags)`: the survivors' communicator, bounded
/// like a split (`derive_raw`).
pub(crate) fn shrink_raw<R: Runtime>(
    lc: &Arc<LibComm<R>>,
    shrink: ShrinkFn,
    exclude: &[usize],
    config: Option<OwnedConfig>,
    flags: c_int,
) -> Result<Option<NcclComm>> {
    let list: Vec<c_int> = exclude.iter().map(|&r| r as c_int).collect();
    derive_raw(lc, "ncclCommShrink", config, move |c, out, cfg| {
        let mut list = list.clone();
        // SAFETY: a live communicator; `list` holds the excluded ranks (NCCL reads them
        // during the call); `out` receives the new communicator; `cfg` is NULL or a live
        // ncclConfig_t (NCCL copies it).
        unsafe { shrink(c, list.as_mut_ptr(), list.len() as c_int, out, cfg, flags) }
    })
}

/// `ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT)`, then waits (bounded by the deadline) until
/// the communicator is quiescent: NCCL reports `ncclInProgress` until then.
pub(crate) fn revoke<R: Runtime>(lc: &Arc<LibComm<R>>) -> Result<()> {
    let f = lc
        .api
        .gated("ncclCommRevoke", REVOKE_SINCE, lc.api.fns.comm_revoke)?;
    lc.call(|c| {
        // SAFETY: a live communicator; the flags are NCCL_REVOKE_DEFAULT (0), as nccl.h
        // requires.
        let code = unsafe { f(c, 0) };
        // The call may answer ncclInProgress itself: the state, settled below.
        if code != crate::sys::config::IN_PROGRESS {
            lc.check("ncclCommRevoke", code)?;
        }
        settle_raw(&lc.api, c, "ncclCommRevoke", lc.timeout(), &|| false)
    })
}
