//! Creating the library's communicators (`ncclCommInitRank` / `ncclCommInitRankConfig`),
//! every wait bounded: a blocking creation waits for every rank with no deadline of its
//! own, so it runs on a helper thread under the communicator's deadline; a non-blocking one
//! is settled with it. What a process's environment says about its communicators is read
//! here once ([`Mode`]).

#![allow(
    unsafe_code,
    reason = "calls the NCCL-API library or the device runtime at its call sites (the architecture test's UNSAFE_FILES lists them)"
)]

use std::ffi::c_int;
use std::sync::Arc;
use std::time::Duration;

use unicomm_core::{CommConfig, Result, Version};

use crate::conv::to_config;
use crate::sys::api::{Api, NcclComm, UniqueId};
use crate::sys::config::IN_PROGRESS;
use crate::sys::runtime::Runtime;
use crate::wait::{bounded, settle_raw, SendPtr};

/// How a process's communicators work, from its environment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mode {
    /// Created non-blocking (`UNICOMM_NONBLOCKING=1`, where the library has
    /// `ncclCommInitRankConfig` and `ncclCommGetAsyncError`).
    pub(crate) nonblocking: bool,
    /// The deadline of their waits (`UNICOMM_TIMEOUT_MS`).
    pub(crate) timeout: Duration,
    /// The ranks compare every collective first (`UNICOMM_CHECK_COLLECTIVES=1`).
    pub(crate) check: bool,
}

impl Mode {
    /// The mode of communicators created with `config`, whose `blocking` wins over
    /// `UNICOMM_NONBLOCKING`.
    pub(crate) fn with(self, config: &CommConfig) -> Mode {
        Mode {
            nonblocking: config.blocking.map_or(self.nonblocking, |b| !b),
            ..self
        }
    }

    pub(crate) fn from_env(api: &Api) -> Result<Mode> {
        let timeout = unicomm_core::env::timeout()?;
        let able = api.fns.comm_init_rank_config.is_some()
            && api.fns.comm_get_async_error.is_some()
            && api.version >= Version::new(2, 14, 0);
        Ok(Mode {
            nonblocking: able && unicomm_core::env::switch("UNICOMM_NONBLOCKING", false)?,
            timeout,
            check: unicomm_core::env::switch("UNICOMM_CHECK_COLLECTIVES", false)?,
        })
    }
}

/// The `devs.len()` ranks of a world created from this thread, one per device, inside one
/// group (communicators in rank order), settled or bounded by the deadline.
pub(crate) fn local_world<R: Runtime + 'static>(
    api: &Arc<Api>,
    rt: &Arc<R>,
    devs: &[usize],
    mode: Mode,
    id: UniqueId,
    config: &CommConfig,
) -> Result<Vec<NcclComm>> {
    let create = {
        let (api, rt, devs) = (api.clone(), rt.clone(), devs.to_vec());
        let (nonblocking, config) = (mode.nonblocking, config.clone());
        move || create_group(&api, &*rt, &devs, id, nonblocking, &config)
    };
    let raw: Vec<NcclComm> = if mode.nonblocking {
        create()?
    } else {
        // Blocking: NCCL waits for every rank with no deadline; the call gets one.
        let late_api = api.clone();
        let what = "ncclCommInitRank (one group)";
        bounded(what, mode.timeout, create, move |r| {
            for c in r.into_iter().flatten() {
                // SAFETY: a communicator created after the caller gave up; aborted once.
                unsafe { (late_api.fns.comm_abort)(c.0) };
            }
        })??
    }
    .into_iter()
    .map(|c| c.0)
    .collect();
    if mode.nonblocking {
        let settled = raw
            .iter()
            .try_for_each(|&c| settle_raw(api, c, "ncclCommInitRank", mode.timeout, &|| false));
        if let Err(e) = settled {
            for &c in &raw {
                // SAFETY: a communicator created above, aborted once.
                unsafe { (api.fns.comm_abort)(c) };
            }
            return Err(e);
        }
    }
    Ok(raw)
}

/// `ncclCommInitRank` for every device of `devs` inside one group; on any failure those
/// created are aborted.
fn create_group<R: Runtime>(
    api: &Api,
    rt: &R,
    devs: &[usize],
    id: UniqueId,
    nonblocking: bool,
    config: &CommConfig,
) -> Result<Vec<SendPtr>> {
    let n = devs.len();
    let mut raw = vec![std::ptr::null_mut(); n];
    api.group_start()?;
    let mut first_err = None;
    for (rank, (&dev, slot)) in devs.iter().zip(raw.iter_mut()).enumerate() {
        let r = rt.with_device(dev, || {
            init_call(api, slot, n, id, rank, nonblocking, config)
        });
        if let Err(e) = r {
            first_err.get_or_insert(e);
        }
    }
    let end = in_progress_ok(api, "ncclGroupEnd", api.group_end(), nonblocking);
    if let Some(e) = first_err.or(end.err()) {
        for c in raw.into_iter().filter(|c| !c.is_null()) {
            // SAFETY: a communicator created above, aborted once.
            unsafe { (api.fns.comm_abort)(c) };
        }
        return Err(e);
    }
    Ok(raw.into_iter().map(SendPtr).collect())
}

/// One rank of a world of `world` identified by `id`, on `dev`: blocks until every rank
/// has called it, at most the deadline.
pub(crate) fn one_rank<R: Runtime + 'static>(
    api: &Arc<Api>,
    rt: &Arc<R>,
    id: UniqueId,
    (rank, world, dev): (usize, usize, usize),
    mode: Mode,
    config: &CommConfig,
) -> Result<NcclComm> {
    if mode.nonblocking {
        let mut c = std::ptr::null_mut();
        rt.with_device(dev, || {
            init_call(api, &mut c, world, id, rank, true, config)?;
            if let Err(e) = settle_raw(api, c, "ncclCommInitRank", mode.timeout, &|| false) {
                // SAFETY: the communicator created above, aborted once.
                unsafe { (api.fns.comm_abort)(c) };
                return Err(e);
            }
            Ok(())
        })?;
        return Ok(c);
    }
    // Blocking: NCCL waits for every rank with no deadline; the call gets one.
    let (a, r, late_api) = (api.clone(), rt.clone(), api.clone());
    let config = config.clone();
    let create = move || -> Result<SendPtr> {
        let mut c = std::ptr::null_mut();
        r.with_device(dev, || {
            init_call(&a, &mut c, world, id, rank, false, &config)
        })?;
        Ok(SendPtr(c))
    };
    let c = bounded("ncclCommInitRank", mode.timeout, create, move |r| {
        if let Ok(c) = r {
            // SAFETY: a communicator created after the caller gave up; aborted once.
            unsafe { (late_api.fns.comm_abort)(c.0) };
        }
    })??;
    Ok(c.0)
}

/// `ncclCommInitRankConfig` where a configuration is set or non-blocking mode asked for
/// (`blocking = 0`), else `ncclCommInitRank`; `ncclInProgress` is success here (settled by
/// the caller). The caller checked `config` against the library's version.
fn init_call(
    api: &Api,
    slot: &mut NcclComm,
    world: usize,
    id: UniqueId,
    rank: usize,
    nonblocking: bool,
    config: &CommConfig,
) -> Result<()> {
    let (n, r) = (world as c_int, rank as c_int);
    match to_config(config, nonblocking)? {
        Some(mut cfg) => {
            let f = api.gated(
                "creating a communicator with a configuration (ncclCommInitRankConfig)",
                Version::new(2, 14, 0),
                api.fns.comm_init_rank_config,
            )?;
            // SAFETY: `slot` receives the communicator; the id is shared by all ranks;
            // `cfg` is an initialised ncclConfig_t with its true size and version whose
            // strings it owns, alive across the call (NCCL copies the fields it knows).
            let code = unsafe { f(slot, n, id, r, cfg.ptr().cast()) };
            let blocking = config.blocking.unwrap_or(!nonblocking);
            in_progress_ok(api, "ncclCommInitRankConfig", code, !blocking)
        }
        None => {
            // SAFETY: `slot` receives the communicator; the id is shared by all ranks.
            let code = unsafe { (api.fns.comm_init_rank)(slot, n, id, r) };
            api.check("ncclCommInitRank", code, None)
        }
    }
}

/// `code` as a result, where `ncclInProgress` of a non-blocking call is success.
fn in_progress_ok(api: &Api, call: &'static str, code: c_int, nonblocking: bool) -> Result<()> {
    if nonblocking && code == IN_PROGRESS {
        Ok(())
    } else {
        api.check(call, code, None)
    }
}
