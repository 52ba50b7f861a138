//! Shrinking a communicator after a failure: `ncclCommShrink` (NCCL >= 2.27; RCCL from
//! 2.27.7, unverified on its headers) in its default and abort modes, and `ncclCommRevoke`
//! (NCCL >= 2.28.7), which stops the work in flight and leaves the communicator quiescent
//! for a shrink. Without them the survivors re-form (`comm/shrink.rs`).

use std::ffi::c_int;
use std::sync::Arc;

use unicomm_core::Result;

use crate::conv::OwnedConfig;
use crate::libcomm::LibComm;
use crate::split::derive_raw;
use crate::sys::calls::OwnedComm;
use crate::sys::runtime::Runtime;
use crate::wait::settle_raw;

pub(crate) use crate::sys::calls::SHRINK_SINCE;

/// `ncclCommShrink(parent, exclude, config, flags)`: the survivors' communicator, bounded
/// like a split (`derive_raw`).
pub(crate) fn shrink_raw<R: Runtime>(
    lc: &Arc<LibComm<R>>,
    exclude: &[usize],
    config: Option<OwnedConfig>,
    flags: c_int,
) -> Result<Option<OwnedComm>> {
    let (api, list) = (lc.api.clone(), exclude.to_vec());
    derive_raw(lc, "ncclCommShrink", config, move |c, cfg| {
        api.comm_shrink(c, &list, cfg, flags)
    })
}

/// `ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT)`, then waits (bounded by the deadline) until
/// the communicator is quiescent: NCCL reports `ncclInProgress` until then.
pub(crate) fn revoke<R: Runtime>(lc: &Arc<LibComm<R>>) -> Result<()> {
    lc.call(|c| {
        lc.api.comm_revoke(c.handle())?;
        settle_raw(&lc.api, c.handle(), "ncclCommRevoke", lc.timeout(), &|| {
            false
        })
    })
}
