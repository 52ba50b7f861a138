//! Splitting a communicator: `ncclCommSplit` where the library has it (NCCL >= 2.18, RCCL
//! ROCm 6.0), else the members create the child from a fresh unique id that the group's
//! first rank makes and the parent carries to them (its all-reduce, as an all-gather of
//! words). Either way every wait is bounded by the parent's deadline.

use std::sync::Arc;

use unicomm_core::Result;

use crate::conv::OwnedConfig;
use crate::libcomm::LibComm;
use crate::sys::api::UniqueId;
use crate::sys::calls::{Handle, OwnedComm};
use crate::sys::runtime::Runtime;
use crate::wait::settle_raw;

pub(crate) use crate::sys::calls::{NO_COLOR, SPLIT_SINCE};

/// `ncclCommSplit(parent, color, key, config)`: the child, or `None` for `NO_COLOR`.
/// Blocking: it waits for the peers on the host, bounded by the deadline; non-blocking: the
/// parent's part and the child are settled. `config` `None` passes NULL: the parent's
/// settings (nccl.h).
pub(crate) fn split_raw<R: Runtime>(
    lc: &Arc<LibComm<R>>,
    color: i32,
    key: i32,
    config: Option<OwnedConfig>,
) -> Result<Option<OwnedComm>> {
    let api = lc.api.clone();
    derive_raw(lc, "ncclCommSplit", config, move |c, cfg| {
        api.comm_split(c, color, key, cfg)
    })
}

/// A communicator derived from `lc`'s by `call(parent, config)` (`ncclCommSplit`,
/// `ncclCommShrink`): `None` where the library made none. Blocking: it waits for the peers
/// on the host, bounded by the deadline (a child made after the caller gave up is aborted);
/// non-blocking: the parent's part and the child are settled.
pub(crate) fn derive_raw<R: Runtime>(
    lc: &Arc<LibComm<R>>,
    name: &'static str,
    mut config: Option<OwnedConfig>,
    call: impl FnOnce(Handle<'_>, Option<&mut OwnedConfig>) -> Result<Option<OwnedComm>>
        + Send
        + 'static,
) -> Result<Option<OwnedComm>> {
    lc.call_lent(|l| {
        let out = if lc.nonblocking {
            call(l.comm()?.handle(), config.as_mut())?
        } else {
            let api = lc.api.clone();
            // The caller holds the lock while this runs and gives the parent up if it does
            // not return in time; the config is owned by the closure.
            l.bounded(
                name,
                move |h| {
                    let mut config = config;
                    call(h, config.as_mut())
                },
                move |late| {
                    // A child made after the caller gave up: aborted.
                    if let Ok(Some(child)) = late {
                        let _ = api.comm_abort(child);
                    }
                },
            )??
        };
        // A non-blocking child answers ncclInProgress until it settles: where it is adopted
        // (`adopt_raw`), or below for a non-blocking parent's.
        l.settle(name)?;
        let Some(out) = out else {
            return Ok(None);
        };
        if lc.nonblocking {
            if let Err(e) = settle_raw(&lc.api, out.handle(), name, lc.timeout(), &|| false) {
                let _ = lc.api.comm_abort(out);
                return Err(e);
            }
        }
        Ok(Some(out))
    })
}

/// The ranks of `color`, in the child's rank order (by key, then parent rank), from every
/// rank's (color, key).
pub(crate) fn members(all: &[(Option<u32>, i32)], color: u32) -> Vec<usize> {
    let mut m: Vec<(i32, usize)> = all
        .iter()
        .enumerate()
        .filter(|(_, (c, _))| *c == Some(color))
        .map(|(r, (_, k))| (*k, r))
        .collect();
    m.sort();
    m.into_iter().map(|(_, r)| r).collect()
}

/// Every rank's (color, key) over the parent: an all-gather through its all-reduce (each
/// rank fills its own word, zeros elsewhere, reduced by maximum).
pub(crate) fn exchange_colors(
    all_max: &dyn Fn(&[u64]) -> Result<Vec<u64>>,
    world: usize,
    rank: usize,
    color: Option<u32>,
    key: i32,
) -> Result<Vec<(Option<u32>, i32)>> {
    let mine = (color.map_or(0, |c| u64::from(c) + 1) << 32) | u64::from(key as u32);
    let mut out = Vec::with_capacity(world);
    for start in (0..world).step_by(16) {
        let n = (world - start).min(16);
        let words: Vec<u64> = (start..start + n)
            .map(|r| if r == rank { mine } else { 0 })
            .collect();
        for w in all_max(&words)? {
            let c = (w >> 32) as u32;
            out.push(((c > 0).then(|| c - 1), w as u32 as i32));
        }
    }
    Ok(out)
}

/// A unique id from `root` of the parent to every rank (each group's first rank makes
/// one; the others learn it): one all-reduce of 16 words per group.
pub(crate) fn share_id(
    all_max: &dyn Fn(&[u64]) -> Result<Vec<u64>>,
    mine: Option<UniqueId>,
) -> Result<UniqueId> {
    let bytes = mine.map_or([0u8; 128], |id| id.to_bytes());
    let words: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    let got = all_max(&words)?;
    let mut out = [0u8; 128];
    for (i, w) in got.iter().enumerate().take(16) {
        out[i * 8..][..8].copy_from_slice(&w.to_ne_bytes());
    }
    Ok(UniqueId::from_bytes(out))
}
