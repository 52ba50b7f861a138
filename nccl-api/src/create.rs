//! Creating the library's communicators (`ncclCommInitRank` / `ncclCommInitRankConfig`),
//! every wait bounded: a blocking creation waits for every rank with no deadline of its
//! own, so it runs on a helper thread under the communicator's deadline; a non-blocking one
//! is settled with it. What a process's environment says about its communicators is read
//! here once ([`Mode`]).

use std::sync::Arc;
use std::time::Duration;

use unicomm_core::{CommConfig, Place, Result};

use crate::conv::to_config;
use crate::sys::api::{Api, UniqueId};
use crate::sys::calls::{Grower, OwnedComm, CONFIG_SINCE};
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
    // ncclInProgress is a non-blocking group's success (settled by the caller).
    let grouped = api.grouped(|| {
        let mut first_err = None;
        for (rank, &dev) in devs.iter().enumerate() {
            let ids = Ids::one(&id);
            match rt.with_device(dev, || init_call(api, n, ids, rank, nonblocking, config)) {
                Ok(c) => made.push(c),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    });
    if let Err(e) = grouped {
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
    ids: Ids<'_>,
    Place {
        rank,
        world,
        device: dev,
    }: Place,
    mode: Mode,
    config: &CommConfig,
) -> Result<OwnedComm> {
    if mode.nonblocking {
        return rt.with_device(dev, || {
            let c = init_call(api, world, ids, rank, true, config)?;
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
    let (config, (list, scalable, grown)) =
        (config.clone(), (ids.list.to_vec(), ids.scalable, ids.grown));
    let create = move || {
        let ids = Ids {
            list: &list,
            scalable,
            grown,
        };
        r.with_device(dev, || init_call(&a, world, ids, rank, false, &config))
    };
    bounded("ncclCommInitRank", mode.timeout, create, move |r| {
        // Created after the caller gave up: aborted.
        if let Ok(c) = r {
            let _ = late_api.comm_abort(c);
        }
    })?
}

/// `ncclCommInitRankConfig` where a configuration is set or non-blocking mode asked for
/// (`blocking = 0`), else `ncclCommInitRank`; with several ids, `ncclCommInitRankScalable`
/// (one root per id). `ncclInProgress` is success here (settled by the caller). The caller
/// checked `config` against the library's version.
fn init_call(
    api: &Api,
    world: usize,
    ids: Ids<'_>,
    rank: usize,
    nonblocking: bool,
    config: &CommConfig,
) -> Result<OwnedComm> {
    let mut cfg = to_config(config, nonblocking)?;
    match ids {
        Ids {
            list: [id],
            grown: true,
            ..
        } => api.comm_grow(Grower::New(id, rank), world, cfg.as_mut()),
        Ids {
            list: [id],
            scalable: false,
            ..
        } => api.comm_init_rank(world, *id, rank, cfg.as_mut()),
        _ => api.comm_init_rank_scalable(world, ids.list, rank, cfg.as_mut()),
    }
}

/// The ids a rank is created from, and whether through the many-root call
/// (`ncclCommInitRankScalable`, always with several ids; asked for explicitly with one) or
/// as a new rank of a grown world (`ncclCommGrow` with no communicator, one id).
#[derive(Clone, Copy)]
pub(crate) struct Ids<'a> {
    pub(crate) list: &'a [UniqueId],
    pub(crate) scalable: bool,
    pub(crate) grown: bool,
}

impl<'a> Ids<'a> {
    pub(crate) fn one(id: &'a UniqueId) -> Self {
        Ids {
            list: std::slice::from_ref(id),
            scalable: false,
            grown: false,
        }
    }

    /// A new rank of the world grown with `id`.
    pub(crate) fn grown(id: &'a UniqueId) -> Self {
        Ids {
            grown: true,
            ..Ids::one(id)
        }
    }
}

/// Ranks per root of a many-root creation by default (PyTorch's and XLA's choice).
pub const RANKS_PER_ROOT: u64 = 128;

/// How many roots (unique ids) a world of `world` ranks is created from: one per
/// `UNICOMM_RANKS_PER_ROOT` ranks (default [`RANKS_PER_ROOT`], 1..=2^20), at most
/// [`MAX_IDS`](unicomm_core::shrink::MAX_IDS) (so each rank receives at most 32 KiB of ids); one where the
/// world fits one root or where the library predates `ncclCommInitRankScalable` (NCCL 2.23:
/// the documented fallback, said at `info` level). Every rank must compute the same number
/// (the same variable and library on every rank; the rendezvous refuses a difference).
pub fn roots_for(api: &Api, world: usize) -> Result<usize> {
    let per = unicomm_core::env::whole_number(
        "UNICOMM_RANKS_PER_ROOT",
        RANKS_PER_ROOT,
        1..=1 << 20,
        "ranks",
    )?;
    let wanted = (world as u64)
        .div_ceil(per)
        .clamp(1, unicomm_core::shrink::MAX_IDS as u64) as usize;
    if wanted > 1 && !api.has_scalable_init() {
        tracing::info!(
            library = %api.path,
            version = %api.version,
            "one root for {world} ranks: the library predates ncclCommInitRankScalable ({})",
            crate::sys::flavor::SCALABLE_SINCE
        );
        return Ok(1);
    }
    Ok(wanted)
}
