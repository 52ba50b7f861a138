//! Splitting a communicator: `ncclCommSplit` where the library has it (NCCL >= 2.18, RCCL
//! ROCm 6.0), else the members create the child from a fresh unique id that the group's
//! first rank makes and the parent carries to them (its all-reduce, as an all-gather of
//! words). Either way every wait is bounded by the parent's deadline.

#![allow(
    unsafe_code,
    reason = "calls the NCCL-API library or the device runtime at its call sites (the architecture test's UNSAFE_FILES lists them)"
)]

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use unicomm_core::{Result, Version};

use crate::conv::OwnedConfig;
use crate::libcomm::LibComm;
use crate::sys::api::{NcclComm, NcclResult, UniqueId};
use crate::sys::config::IN_PROGRESS;
use crate::sys::runtime::Runtime;
use crate::wait::{settle_raw, SendPtr};

/// `ncclCommSplit` exists from NCCL 2.18.
pub(crate) const SPLIT_SINCE: Version = Version::new(2, 18, 0);

/// `NCCL_SPLIT_NOCOLOR`.
pub(crate) const NO_COLOR: c_int = -1;

type SplitFn =
    unsafe extern "C" fn(NcclComm, c_int, c_int, *mut NcclComm, *mut c_void) -> NcclResult;

/// `ncclCommSplit(parent, color, key, config)`: the child, or `None` for `NO_COLOR`.
/// Blocking: it waits for the peers on the host, bounded by the deadline; non-blocking: the
/// parent's part and the child are settled. `config` `None` passes NULL: the parent's
/// settings (nccl.h).
pub(crate) fn split_raw<R: Runtime>(
    lc: &Arc<LibComm<R>>,
    split: SplitFn,
    color: c_int,
    key: c_int,
    config: Option<OwnedConfig>,
) -> Result<Option<NcclComm>> {
    derive_raw(lc, "ncclCommSplit", config, move |c, out, cfg| {
        // SAFETY: a live communicator; `out` receives the new one (written when the call
        // settles); `cfg` is NULL or a live ncclConfig_t (NCCL copies it).
        unsafe { split(c, color, key, out, cfg) }
    })
}

/// A communicator derived from `lc`'s by `call(parent, &mut child, config)` (`ncclCommSplit`,
/// `ncclCommShrink`): `None` where the library made none. Blocking: it waits for the peers
/// on the host, bounded by the deadline (a child made after the caller gave up is aborted);
/// non-blocking: the parent's part and the child are settled.
pub(crate) fn derive_raw<R: Runtime>(
    lc: &Arc<LibComm<R>>,
    name: &'static str,
    mut config: Option<OwnedConfig>,
    call: impl Fn(NcclComm, *mut NcclComm, *mut c_void) -> NcclResult + Send + 'static,
) -> Result<Option<NcclComm>> {
    lc.call(|c| {
        let mut out: NcclComm = std::ptr::null_mut();
        let code = if lc.nonblocking {
            let cfg = config
                .as_mut()
                .map_or(std::ptr::null_mut(), |c| c.ptr().cast());
            call(c, &mut out, cfg)
        } else {
            let api = lc.api.clone();
            let sc = SendPtr(c);
            let (code, child) = lc.bounded_locked(
                name,
                move || {
                    let (sc, mut config) = (sc, config);
                    let mut out: NcclComm = std::ptr::null_mut();
                    let cfg = config
                        .as_mut()
                        .map_or(std::ptr::null_mut(), |c| c.ptr().cast());
                    // The caller holds the lock while this runs and gives the parent up if it
                    // does not return in time; the config is owned by this closure.
                    let code = call(sc.0, &mut out, cfg);
                    (code, SendPtr(out))
                },
                move |(code, child)| {
                    if code == 0 && !child.0.is_null() {
                        // SAFETY: a communicator made after the caller gave up, aborted once.
                        unsafe { (api.fns.comm_abort)(child.0) };
                    }
                },
            )?;
            out = child.0;
            code
        };
        // A non-blocking child answers ncclInProgress until it settles: where it is adopted
        // (`adopt_raw`), or below for a non-blocking parent's.
        if code != IN_PROGRESS || out.is_null() {
            lc.check(name, code)?;
        }
        lc.settle_locked(name)?;
        if out.is_null() {
            return Ok(None);
        }
        if lc.nonblocking {
            if let Err(e) = settle_raw(&lc.api, out, name, lc.timeout(), &|| false) {
                // SAFETY: the communicator just created, aborted once.
                unsafe { (lc.api.fns.comm_abort)(out) };
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
