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
mod kernels;
mod load;
pub mod runtime;
mod streams;
pub mod sys;
mod vmm;

use std::sync::{Arc, OnceLock};
use unicomm_core::{CommConfig, Place};

use unicomm_core::Result;
use unicomm_nccl_api::{Api, ApiComm, ApiMemory, ApiStream, Runtime, Vendor};

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

/// Rccl's entry points (the shared NCCL-API layer's [`Vendor`], written once for NCCL and
/// RCCL); the free functions below are its methods.
#[derive(Debug, Clone, Copy)]
pub struct Rccl;

impl Vendor for Rccl {
    type Runtime = HipRuntime;
    fn library() -> Result<Arc<Api>> {
        rccl()
    }
    fn runtime() -> Result<Arc<HipRuntime>> {
        hip()
    }
    fn local_rejoin() -> Arc<dyn unicomm_core::shrink::Rejoin> {
        Arc::new(unicomm_bootstrap::Rejoin::local())
    }
    /// RCCL reports the NCCL API version it implements, not its own.
    fn probe() -> Result<String> {
        let rt = hip()?;
        let api = rccl()?;
        Ok(format!(
            "{}; RCCL (NCCL API {}) at {}",
            rt.describe(),
            api.version,
            api.path
        ))
    }
}

/// What is usable here: one line naming the devices and the RCCL library, or the reason
/// it is not (`NoDevice`, `LibraryNotFound`).
pub fn probe() -> Result<String> {
    Rccl::probe()
}

/// One communicator per visible GPU (or the first `n`), created from this thread.
pub fn local_comms(n: Option<usize>) -> Result<Vec<RcclComm>> {
    Rccl::local_comms_with(n, &CommConfig::default())
}

/// [`local_comms`] with a configuration (`ncclCommInitRankConfig`; a field the library
/// predates is `Unsupported`, naming it and its version).
pub fn local_comms_with(n: Option<usize>, config: &CommConfig) -> Result<Vec<RcclComm>> {
    Rccl::local_comms_with(n, config)
}

/// [`init_rank`] with a configuration.
pub fn init_rank_with(id: UniqueId, at: Place, config: &CommConfig) -> Result<RcclComm> {
    Rccl::init_rank_with(id, at, config)
}

/// Joins a world as `rank` of `world` on GPU `dev` (one rank per thread or per process);
/// every rank passes the same `id` (from [`unique_id`] on one of them).
pub fn init_rank(id: UniqueId, rank: usize, world: usize, dev: usize) -> Result<RcclComm> {
    Rccl::init_rank_with(id, Place::new(rank, world, dev), &CommConfig::default())
}

/// Joins a grown world ([`Vendor::init_grown_with`]).
pub fn init_grown_with(id: UniqueId, at: Place, config: &CommConfig) -> Result<RcclComm> {
    Rccl::init_grown_with(id, at, config)
}

/// [`init_rank_with`] through several roots ([`Vendor::init_rank_scalable_with`]).
pub fn init_rank_scalable_with(
    ids: &[UniqueId],
    at: Place,
    config: &CommConfig,
) -> Result<RcclComm> {
    Rccl::init_rank_scalable_with(ids, at, config)
}

/// How many roots a world of `world` ranks is created from: one per
/// `UNICOMM_RANKS_PER_ROOT` ranks (default 128), one where the loaded library predates
/// many-root creation (`unicomm_nccl_api::roots_for`).
pub fn roots_for(world: usize) -> Result<usize> {
    Rccl::roots_for(world)
}

/// A new world id (`ncclGetUniqueId`), to share with every rank.
pub fn unique_id() -> Result<UniqueId> {
    Rccl::unique_id()
}
