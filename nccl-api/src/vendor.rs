//! A vendor crate's entry points, written once for NCCL and RCCL: a vendor names its
//! library and its device runtime (each loaded once per process, by the vendor crate) and
//! the board on which a process's ranks re-form after a shrink; the creation calls, the probe
//! line and the world ids follow from those, the same for both.

use std::sync::Arc;

use unicomm_core::shrink::Rejoin;
use unicomm_core::{CommConfig, Place, Result};

use crate::comm::ApiComm;
use crate::sys::api::{Api, UniqueId};
use crate::sys::runtime::Runtime;

/// What a vendor crate supplies; the rest of its entry points are this trait's provided
/// methods.
pub trait Vendor {
    /// The device runtime (CUDA, HIP).
    type Runtime: Runtime;

    /// The library, loaded once per process.
    fn library() -> Result<Arc<Api>>;

    /// The device runtime, loaded once per process.
    fn runtime() -> Result<Arc<Self::Runtime>>;

    /// The board on which the ranks of one process meet to re-form after a shrink where the
    /// library has no `ncclCommShrink` (the rendezvous's, handed in from above).
    fn local_rejoin() -> Arc<dyn Rejoin>;

    /// What is usable here: one line naming the devices and the library (its name, the NCCL
    /// API version it reports, its path), or why not (`NoDevice`, `LibraryNotFound`). The
    /// device first: "no GPU" says more than "no library" on a machine without either.
    fn probe() -> Result<String> {
        let rt = Self::runtime()?;
        let api = Self::library()?;
        Ok(format!(
            "{}; {} {} at {}",
            rt.describe(),
            api.flavor.library,
            api.version,
            api.path
        ))
    }

    /// One communicator per visible device (or the first `n`), created from this thread,
    /// with a configuration (a field the library predates is `Unsupported`, naming it and
    /// its version); they re-form on [`Vendor::local_rejoin`]'s board.
    fn local_comms_with(
        n: Option<usize>,
        config: &CommConfig,
    ) -> Result<Vec<ApiComm<Self::Runtime>>> {
        let rt = Self::runtime()?;
        let comms = ApiComm::local_with(Self::library()?, rt, n, config)?;
        ApiComm::share_rejoin(&comms, Self::local_rejoin())?;
        Ok(comms)
    }

    /// Joins the world of `id` at `at` (one rank per thread or per process); every rank
    /// passes the same `id` (from [`Vendor::unique_id`] on one of them).
    fn init_rank_with(
        id: UniqueId,
        at: Place,
        config: &CommConfig,
    ) -> Result<ApiComm<Self::Runtime>> {
        ApiComm::init_rank_with(Self::library()?, Self::runtime()?, id, at, config)
    }

    /// Joins a grown world as a new rank at `at` with the id its rank 0 made
    /// (`Comm::grow_id`), while every rank of the world calls `Comm::grow` (`ncclCommGrow`,
    /// NCCL >= 2.29.2; `Unsupported` naming the release before).
    fn init_grown_with(
        id: UniqueId,
        at: Place,
        config: &CommConfig,
    ) -> Result<ApiComm<Self::Runtime>> {
        ApiComm::init_grown_with(Self::library()?, Self::runtime()?, id, at, config)
    }

    /// [`Vendor::init_rank_with`] through several roots, one per id
    /// (`ncclCommInitRankScalable`, NCCL's API >= 2.23, else `Unsupported` naming the
    /// version): every rank passes the same ids in the same order; [`Vendor::roots_for`] says
    /// how many.
    fn init_rank_scalable_with(
        ids: &[UniqueId],
        at: Place,
        config: &CommConfig,
    ) -> Result<ApiComm<Self::Runtime>> {
        ApiComm::init_rank_scalable_with(Self::library()?, Self::runtime()?, ids, at, config)
    }

    /// How many roots a world of `world` ranks is created from (`crate::roots_for`).
    fn roots_for(world: usize) -> Result<usize> {
        crate::create::roots_for(&*Self::library()?, world)
    }

    /// A new world id (`ncclGetUniqueId`), to share with every rank.
    fn unique_id() -> Result<UniqueId> {
        Self::library()?.unique_id()
    }
}
