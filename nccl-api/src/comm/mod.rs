//! The communicator the backends hand out ([`ApiComm`]), over any NCCL-API library and
//! device runtime: what backend-nccl (NCCL + CUDA) and backend-rccl (RCCL + HIP) both are.
//! It is composed of the parts below it, each owning its state: the communicator every
//! path runs on ([`Base`]: the library's communicator, its registrations, the ranks'
//! agreement, the library-call path), the copy-engine path and the automatic registrations; a
//! call's route is decided in `route.rs`, the contract's operations are in `collective.rs`.

mod children;
mod collective;
mod enqueue;
mod grow;
mod one_sided;
mod route;
mod shrink;

use std::sync::Arc;

use unicomm_core::registry::RegKind;
use unicomm_core::{Collective, CommConfig, Error, Result};

use unicomm_core::flight::FlightRecorder;

use crate::auto::Auto;
use crate::base::Base;
use crate::copy_engine::local::LocalWorld;
use crate::copy_engine::signals::CopyEngineSync;
use crate::copy_engine::{CopyEngine, Sharing};
use crate::create::{self, Mode};
use crate::libcomm::{End, LibComm};
use crate::policy::Policy;
use crate::sys::api::{Api, NcclComm, UniqueId};
use crate::sys::runtime::Runtime;

/// One rank's communicator over an NCCL-API library.
pub struct ApiComm<R: Runtime> {
    base: Base<R>,
    ce: CopyEngine<R>,
    auto: Auto,
    /// Splits so far (every rank splits in the same order: each child's number).
    splits: std::sync::atomic::AtomicU64,
    /// Shrinks so far (each survivor counts the same).
    shrinks: std::sync::atomic::AtomicU64,
    /// Where the survivors meet to re-form (`shrink` without `ncclCommShrink`).
    rejoin: std::sync::OnceLock<Arc<dyn unicomm_core::Rejoin>>,
    /// Its last operations, dumped when it is aborted (a deadline, an asynchronous error,
    /// `abort`) or asked to.
    flight: Arc<FlightRecorder>,
    /// Symmetric allocations and unicomm's kernels' control block.
    sym: crate::symmetric::SymmetricMemory<R>,
    /// Device communicators (NCCL's device API) and unicomm's kernel on them.
    dev: crate::device_comm::DeviceComms,
}

/// The flight recorder's dump at the communicator's abort (registered as an abort hook).
struct FlightDump(Arc<FlightRecorder>);

impl crate::libcomm::AbortHook for FlightDump {
    fn release(&self, _within: std::time::Duration, _report: bool) -> bool {
        self.0.dump_on(&Error::aborted(
            "the communicator was aborted (a deadline passed, an asynchronous error, or abort)",
        ));
        true
    }
}

impl<R: Runtime> std::fmt::Debug for ApiComm<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lc = &self.base.lc;
        write!(
            f,
            "{} rank {}/{} on {} device {}",
            lc.api.flavor.library,
            lc.rank,
            lc.world,
            R::NAME,
            lc.dev
        )
    }
}

impl<R: Runtime> ApiComm<R> {
    /// One rank per visible device (or on the first `n`), created from this thread.
    pub fn local(api: Arc<Api>, rt: Arc<R>, n: Option<usize>) -> Result<Vec<Self>> {
        Self::local_with(api, rt, n, &CommConfig::default())
    }

    /// [`ApiComm::local`] with a configuration.
    pub fn local_with(
        api: Arc<Api>,
        rt: Arc<R>,
        n: Option<usize>,
        config: &CommConfig,
    ) -> Result<Vec<Self>> {
        let count = rt.device_count()?;
        let n = n.unwrap_or(count);
        if n > count {
            return Err(Error::NoDevice {
                vendor: R::VENDOR,
                detail: format!("{n} ranks asked for, {count} GPU(s) visible"),
            });
        }
        Self::init_local_with(api, rt, &(0..n).collect::<Vec<_>>(), config)
    }

    /// Creates the `devs.len()` ranks of a world in this process from one thread
    /// (`ncclCommInitRank` for every device inside one group).
    pub fn init_local(api: Arc<Api>, rt: Arc<R>, devs: &[usize]) -> Result<Vec<Self>> {
        Self::init_local_with(api, rt, devs, &CommConfig::default())
    }

    /// [`ApiComm::init_local`] with a configuration (`ncclCommInitRankConfig`; a field the
    /// library predates is `Unsupported`, naming it).
    pub fn init_local_with(
        api: Arc<Api>,
        rt: Arc<R>,
        devs: &[usize],
        config: &CommConfig,
    ) -> Result<Vec<Self>> {
        crate::conv::check_config(config, api.flavor.library, api.version)?;
        let n = devs.len();
        if n == 0 {
            return Err(Error::invalid("devices", "no device given"));
        }
        let count = rt.device_count()?;
        if let Some(&d) = devs.iter().find(|&&d| d >= count) {
            return Err(Error::NoDevice {
                vendor: R::VENDOR,
                detail: format!("device {d} asked for, {count} visible"),
            });
        }
        let id = api.unique_id()?;
        let mode = Mode::from_env(&api)?.with(config);
        // Every variable read before anything is created: a bad one leaves nothing behind.
        let flights = (0..n)
            .map(|rank| FlightRecorder::from_env("world", rank, n))
            .collect::<Result<Vec<_>>>()?;
        let raw = create::local_world(&api, &rt, devs, mode, id, config)?;
        let local = Arc::new(LocalWorld::new(n));
        let mut out = Vec::with_capacity(n);
        let mut raw = raw.into_iter();
        for (rank, (c, &dev)) in raw.by_ref().zip(devs).enumerate() {
            let lc = LibComm::new(
                api.clone(),
                rt.clone(),
                c,
                unicomm_core::Place::new(rank, n, dev),
                mode.nonblocking,
                mode.timeout,
            );
            let sharing = Sharing::new(Some(local.clone()), None).with_local_job(&id.to_bytes());
            let flight = flights[rank].clone();
            match Self::compose(lc, mode, sharing, None, flight) {
                Ok(me) => out.push(me),
                Err(e) => {
                    // The rest were created and are not wrapped: ended here (the wrapped
                    // ones end with `out`).
                    for c in raw {
                        let _ = api.comm_abort(c);
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// The explicit form, for one rank per thread or per process: joins the world of
    /// `world` ranks identified by `id` as `rank`, on device `dev`. Blocks until every rank
    /// has called it.
    pub fn init_rank(
        api: Arc<Api>,
        rt: Arc<R>,
        id: UniqueId,
        rank: usize,
        world: usize,
        dev: usize,
    ) -> Result<Self> {
        let at = unicomm_core::Place::new(rank, world, dev);
        Self::init_rank_with(api, rt, id, at, &CommConfig::default())
    }

    /// [`ApiComm::init_rank`] with a configuration.
    pub fn init_rank_with(
        api: Arc<Api>,
        rt: Arc<R>,
        id: UniqueId,
        at: unicomm_core::Place,
        config: &CommConfig,
    ) -> Result<Self> {
        Self::init_rank_ids(api, rt, create::Ids::one(&id), at, config)
    }

    /// [`ApiComm::init_rank_with`] through several roots, one per id of `ids` (NCCL's
    /// `ncclCommInitRankScalable`, NCCL >= 2.23, else `Unsupported` naming the version):
    /// every rank passes the same ids in the same order, at most one per rank; root `k`
    /// serves the `k`-th block of ranks. The library's creation waits on one root per block
    /// instead of one for the world (a single root staggers ranks at about 7,000 a second).
    /// One id is the same call with one root.
    pub fn init_rank_scalable_with(
        api: Arc<Api>,
        rt: Arc<R>,
        ids: &[UniqueId],
        at: unicomm_core::Place,
        config: &CommConfig,
    ) -> Result<Self> {
        if ids.is_empty() {
            return Err(Error::invalid("ids", "no unique id"));
        }
        let ids = create::Ids {
            list: ids,
            scalable: true,
            grown: false,
        };
        Self::init_rank_ids(api, rt, ids, at, config)
    }

    fn init_rank_ids(
        api: Arc<Api>,
        rt: Arc<R>,
        ids: create::Ids<'_>,
        at: unicomm_core::Place,
        config: &CommConfig,
    ) -> Result<Self> {
        let id = *ids
            .list
            .first()
            .ok_or_else(|| Error::invalid("ids", "no unique id"))?;
        crate::conv::check_config(config, api.flavor.library, api.version)?;
        let unicomm_core::Place {
            rank,
            world,
            device: dev,
        } = at;
        if rank >= world {
            return Err(Error::invalid(
                "rank",
                format!("{rank} is outside 0..{world}"),
            ));
        }
        let count = rt.device_count()?;
        if dev >= count {
            return Err(Error::NoDevice {
                vendor: R::VENDOR,
                detail: format!("device {dev} asked for, {count} visible"),
            });
        }
        let mode = Mode::from_env(&api)?.with(config);
        // Every variable read before anything is created: a bad one leaves nothing behind.
        let flight =
            FlightRecorder::from_env(if ids.grown { "grown" } else { "world" }, rank, world)?;
        let c = create::one_rank(&api, &rt, ids, at, mode, config)?;
        let lc = LibComm::new(api, rt, c, at, mode.nonblocking, mode.timeout);
        // A grown world's existing ranks never see the id (NCCL's non-root ranks pass
        // none): no copy-engine sharing keyed by it on either side.
        let sharing = match ids.grown {
            true => Sharing::default(),
            false => Sharing::new(None, Some(&id.to_bytes())),
        };
        Self::compose(lc, mode, sharing, None, flight)
    }

    /// The communicator of a library communicator just created: its parts built over it.
    /// On failure the library communicator is destroyed.
    fn compose(
        lc: LibComm<R>,
        mode: Mode,
        sharing: Sharing,
        rejoin: Option<Arc<dyn unicomm_core::Rejoin>>,
        flight: Arc<FlightRecorder>,
    ) -> Result<Self> {
        let lc = Arc::new(lc);
        let base = match Base::new(lc.clone(), mode.check) {
            Ok(b) => b,
            Err(e) => {
                // Just created and not used elsewhere: ended through its owner.
                let _ = lc.destroy(End::Abort);
                return Err(e);
            }
        };
        let ce = CopyEngine::with_sharing(&base, sharing);
        if flight.on() {
            lc.add_abort_hook(Arc::new(FlightDump(flight.clone())));
        }
        Ok(ApiComm {
            base,
            ce,
            auto: Auto::default(),
            splits: std::sync::atomic::AtomicU64::new(0),
            shrinks: std::sync::atomic::AtomicU64::new(0),
            rejoin: rejoin.map(std::sync::OnceLock::from).unwrap_or_default(),
            flight,
            sym: Default::default(),
            dev: Default::default(),
        })
    }

    /// The loaded library.
    pub fn api(&self) -> &Arc<Api> {
        &self.base.lc.api
    }
    /// The device runtime.
    pub fn runtime(&self) -> &Arc<R> {
        &self.base.lc.rt
    }
    /// The raw `ncclComm_t`, for calling the library directly (the overhead benchmark does,
    /// to compare). Using it while this communicator is used from another thread breaks
    /// NCCL's rule; that is the caller's responsibility.
    pub fn raw_comm(&self) -> NcclComm {
        self.base.lc.raw()
    }

    /// This rank's device.
    pub fn device(&self) -> usize {
        self.base.lc.dev
    }

    /// How many all-to-alls and all-gathers took the copy-engine path so far (the rest
    /// went to the library).
    pub fn copy_engine_calls(&self) -> u64 {
        self.ce.calls()
    }

    /// Which mechanism orders this communicator's copy-engine operations (`None` before the
    /// first window was shared for the path).
    pub fn copy_engine_sync(&self) -> Option<CopyEngineSync> {
        self.ce.sync()
    }

    /// The thresholds this communicator's automatic registrations use, in place of
    /// `UNICOMM_TUNE_FILE` or the built-in defaults (an engine that ships its own tuning).
    /// Before the first automatic registration, where the ranks agree on the policy: every
    /// rank must set the same one (else that registration fails on every rank); afterwards
    /// `InvalidArgument`.
    pub fn set_auto_policy(&self, policy: Policy) -> Result<()> {
        self.auto.set_policy(policy)
    }

    /// The automatic policy the ranks agreed on, once an automatic registration has been
    /// made.
    pub fn auto_policy(&self) -> Option<&Policy> {
        self.auto.policy()
    }
}

impl<R: Runtime> Drop for ApiComm<R> {
    fn drop(&mut self) {
        // Registrations borrow the typed communicator, so none is alive here; a raw user
        // may have left some: deregister them before the communicator goes (NCCL: after
        // destroy, deregistering is a use-after-free). Windows are not deregistered one by
        // one: that call is collective, and one rank's drop cannot make its peers join it;
        // ncclCommDestroy/ncclCommAbort release a communicator's windows with it (NCCL's
        // documented lifecycle of communicator resources).
        for h in self.base.registry.handles(RegKind::Buffer) {
            let _ = Collective::deregister(self, h);
        }
        let lc = self.base.lc.clone();
        // Finalized where its copy-engine work completed within the deadline; else aborted,
        // which releases this rank's signal waits beside the library's teardown (a finalize
        // would wait for the device, which such a wait holds, with no end in non-blocking
        // mode).
        // A rank that drops it while panicking will not do its part: it aborts (a finalize
        // would wait for peers that this rank's failure may keep waiting).
        let end = if std::thread::panicking() {
            End::Abort
        } else if lc.ended() || self.ce.done_within(lc.timeout()) {
            End::Finalize
        } else {
            tracing::warn!(
                "unicomm: rank {}: copy-engine work still waiting at the communicator's drop after {:?}: aborted instead of finalized",
                lc.rank,
                lc.timeout()
            );
            End::Abort
        };
        match lc.locked_for_teardown(end) {
            Ok(mut g) => {
                let _ = lc.destroy_locked(&mut g, end);
            }
            Err(e) => {
                // Another thread's call (an abort, a settle) still holds the communicator
                // past twice its deadline: it may still use the copy-engine memory, so that
                // is left mapped and allocated, as is the communicator.
                tracing::warn!(
                    "unicomm: rank {}: the communicator's drop: {e}; left as it is (not destroyed, its copy-engine memory not freed)",
                    lc.rank
                );
                self.ce.leak_at_drop();
                return;
            }
        }
        self.ce.release_at_drop();
    }
}
