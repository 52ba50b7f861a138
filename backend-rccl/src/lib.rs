//! unicomm's AMD backend: HIP through our own libloading table ([`runtime`]) and the RCCL
//! flavour of the shared NCCL-API layer ([`RCCL`], over [`unicomm_nccl_api`], written once
//! for both vendors). Cut like backend-nccl: `lib.rs` (flavour and entry points) and
//! `runtime.rs` (the device runtime); no CUDA crate is compiled for it.
//!
//! # Where RCCL and HIP are looked for
//! RCCL: `UNICOMM_RCCL_LIBRARY`, `ROCM_PATH/lib`, `HIP_PATH/lib`, `/opt/rocm/lib`, then
//! `librccl.so.1`, `librccl.so`. HIP: `UNICOMM_HIP_LIBRARY`, the same directories, then
//! `libamdhip64.so` and its versioned sonames.
//!
//! RCCL's differences from NCCL, handled here:
//! - all-to-all is `ncclAllToAll` (NCCL >= 2.28 spells it `ncclAlltoAll`);
//! - `ncclCommRegister` and `ncclMemAlloc` exist from ROCm 6.2 (RCCL reporting NCCL API
//!   2.20); older RCCL gives `Unsupported` for registration and allocates with `hipMalloc`;
//! - symmetric windows need RCCL with NCCL API >= 2.27; older gives `Unsupported`.
//!
//! No AMD GPU has run this code yet: what CI proves is the loaders (the real HIP runtime
//! of Debian's `libamdhip64-5` answering "no device") and the NCCL-API layer against a fake
//! NCCL-ABI library. See docs/rocm.md.

#![deny(unsafe_code)]
mod graph;
pub mod interop;
mod load;
pub mod runtime;
mod streams;
pub mod sys;

use std::sync::{Arc, OnceLock};
use unicomm_core::{CommConfig, Place};

use unicomm_core::Result;
use unicomm_nccl_api::{Api, ApiComm, ApiMemory, ApiStream, Runtime};

pub use interop::{lend_raw, lend_raw_mut, stream_from_raw};
pub use runtime::{HipRuntime, HipStreamHandle};
pub use unicomm_nccl_api::{Policy, UniqueId};

/// RCCL on HIP.
pub type RcclComm = ApiComm<HipRuntime>;
/// A HIP stream.
pub type RcclStream = ApiStream<HipRuntime>;
/// HIP device memory.
pub type RcclMemory = ApiMemory<HipRuntime>;

/// RCCL's loader settings (defined once, in the NCCL-API layer).
pub use unicomm_nccl_api::flavor::{rocm_dirs, RCCL};

/// The RCCL library, loaded once per process.
pub fn rccl() -> Result<Arc<Api>> {
    static API: OnceLock<Result<Arc<Api>>> = OnceLock::new();
    API.get_or_init(|| Api::load(&RCCL).map(Arc::new)).clone()
}

/// The HIP runtime, loaded once per process.
pub fn hip() -> Result<Arc<HipRuntime>> {
    static RT: OnceLock<Result<Arc<HipRuntime>>> = OnceLock::new();
    RT.get_or_init(|| HipRuntime::new().map(Arc::new)).clone()
}

/// What is usable here: the devices and the RCCL library, or why not.
pub fn probe() -> Result<String> {
    let rt = hip()?;
    let api = rccl()?;
    Ok(format!(
        "{}; RCCL (NCCL API {}) at {}",
        rt.describe(),
        api.version,
        api.path
    ))
}

/// One communicator per visible AMD GPU (or the first `n`), created from this thread.
pub fn local_comms(n: Option<usize>) -> Result<Vec<RcclComm>> {
    // The device first: "no GPU" says more than "no library" on a machine without either.
    local_comms_with(n, &CommConfig::default())
}

/// [`local_comms`] with a configuration (`ncclCommInitRankConfig`; a field the library
/// predates is `Unsupported`, naming it and its version).
pub fn local_comms_with(n: Option<usize>, config: &CommConfig) -> Result<Vec<RcclComm>> {
    let rt = hip()?;
    let comms = ApiComm::local_with(rccl()?, rt, n, config)?;
    // The survivors of a shrink without ncclCommShrink meet on a board of this process.
    ApiComm::share_rejoin(&comms, Arc::new(unicomm_bootstrap::Rejoin::local()))?;
    Ok(comms)
}

/// [`init_rank`] with a configuration.
pub fn init_rank_with(id: UniqueId, at: Place, config: &CommConfig) -> Result<RcclComm> {
    ApiComm::init_rank_with(rccl()?, hip()?, id, at, config)
}

/// Joins a grown world as new rank `rank` of `world` on GPU `dev` with the id its rank 0
/// made (`Comm::grow_id`), while every rank of the world calls `Comm::grow`
/// (`ncclCommGrow`, NCCL >= 2.29.2; `Unsupported` naming the release before).
pub fn init_grown_with(id: UniqueId, at: Place, config: &CommConfig) -> Result<RcclComm> {
    ApiComm::init_grown_with(rccl()?, hip()?, id, at, config)
}

/// [`init_rank_with`] through several roots, one per id (`ncclCommInitRankScalable`,
/// RCCL with NCCL's API >= 2.23, else `Unsupported` naming the version): every rank passes
/// the same ids in the same order, made by [`unique_id`]; [`roots_for`] says how many.
pub fn init_rank_scalable_with(
    ids: &[UniqueId],
    at: Place,
    config: &CommConfig,
) -> Result<RcclComm> {
    ApiComm::init_rank_scalable_with(rccl()?, hip()?, ids, at, config)
}

/// How many roots a world of `world` ranks is created from: one per
/// `UNICOMM_RANKS_PER_ROOT` ranks (default 128), one where the loaded library predates
/// many-root creation (`unicomm_nccl_api::roots_for`).
pub fn roots_for(world: usize) -> Result<usize> {
    unicomm_nccl_api::roots_for(&*rccl()?, world)
}

/// A new world id (`ncclGetUniqueId` of RCCL), to share with every rank.
pub fn unique_id() -> Result<UniqueId> {
    rccl()?.unique_id()
}

/// Joins a world as `rank` of `world` on GPU `dev`.
pub fn init_rank(id: UniqueId, rank: usize, world: usize, dev: usize) -> Result<RcclComm> {
    ApiComm::init_rank(rccl()?, hip()?, id, rank, world, dev)
}
