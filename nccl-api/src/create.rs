//! Creating the library's communicators (`ncclCommInitRank` / `ncclCommInitRankConfig`),
//! every wait bounded: a blocking creation waits for every rank with no deadline of its
//! own, so it runs on a helper thread under the communicator's deadline; a non-blocking one
//! is settled with it. What a process's environment says about its communicators is read
//! here once ([`Mode`]).

use std::sync::Arc;
use std::time::Duration;

use unicomm_core::{CommConfig, Result};

use crate::conv::to_config;
use crate::sys::api::{Api, UniqueId};
use crate::sys::calls::{OwnedComm, CONFIG_SINCE};
use crate::sys::runtime::Runtime;
use crate::wait::{bounded, settle_raw};

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
            && api.version >= CONFIG_SINCE;
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
) -> Result<Vec<OwnedComm>> {
    let create = {
        let (api, rt, devs) = (api.clone(), rt.clone(), devs.to_vec());
        let (nonblocking, config) = (mode.nonblocking, config.clone());
        move || create_group(&api, &*rt, &devs, id, nonblocking, &config)
    };
    let made: Vec<OwnedComm> = if mode.nonblocking {
        create()?
    } else {
        // Blocking: NCCL waits for every rank with no deadline; the call gets one.
        let late_api = api.clone();
        let what = "ncclCommInitRank (one group)";
        bounded(what, mode.timeout, create, move |r| {
            // Created after the caller gave up: aborted.
            for c in r.into_iter().flatten() {
                let _ = late_api.comm_abort(c);
            }
        })??
    };
    if mode.nonblocking {
        let settled = made.iter().try_for_each(|c| {
            settle_raw(api, c.handle(), "ncclCommInitRank", mode.timeout, &|| false)
        });
        if let Err(e) = settled {
            for c in made {
                let _ = api.comm_abort(c);
            }
            return Err(e);
        }
    }
    Ok(made)
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
) -> Result<Vec<OwnedComm>> {
    let n = devs.len();
    let mut made = Vec::with_capacity(n);
    api.group_start()?;
    let mut first_err = None;
    for (rank, &dev) in devs.iter().enumerate() {
        match rt.with_device(dev, || init_call(api, n, id, rank, nonblocking, config)) {
            Ok(c) => made.push(c),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    // ncclInProgress is a non-blocking group's success (settled by the caller).
    let end = api.group_end();
    if let Some(e) = first_err.or(end.err()) {
        for c in made {
            let _ = api.comm_abort(c);
        }
        return Err(e);
    }
    Ok(made)
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
) -> Result<OwnedComm> {
    if mode.nonblocking {
        return rt.with_device(dev, || {
            let c = init_call(api, world, id, rank, true, config)?;
            if let Err(e) = settle_raw(api, c.handle(), "ncclCommInitRank", mode.timeout, &|| false)
            {
                let _ = api.comm_abort(c);
                return Err(e);
            }
            Ok(c)
        });
    }
    // Blocking: NCCL waits for every rank with no deadline; the call gets one.
    let (a, r, late_api) = (api.clone(), rt.clone(), api.clone());
    let config = config.clone();
    let create = move || r.with_device(dev, || init_call(&a, world, id, rank, false, &config));
    bounded("ncclCommInitRank", mode.timeout, create, move |r| {
        // Created after the caller gave up: aborted.
        if let Ok(c) = r {
            let _ = late_api.comm_abort(c);
        }
    })?
}

/// `ncclCommInitRankConfig` where a configuration is set or non-blocking mode asked for
/// (`blocking = 0`), else `ncclCommInitRank`; `ncclInProgress` is success here (settled by
/// the caller). The caller checked `config` against the library's version.
fn init_call(
    api: &Api,
    world: usize,
    id: UniqueId,
    rank: usize,
    nonblocking: bool,
    config: &CommConfig,
) -> Result<OwnedComm> {
    let mut cfg = to_config(config, nonblocking)?;
    api.comm_init_rank(world, id, rank, cfg.as_mut())
}
