//! unicomm's NVIDIA backend: CUDA through cudarc ([`runtime`]), the NCCL flavour of the
//! shared NCCL-API layer ([`NCCL`], over [`unicomm_nccl_api`]), and interop with existing
//! cudarc code ([`interop`]). The communicator itself is written once, generic over the
//! device runtime, in `unicomm-nccl-api`; backend-rccl is the same shape over HIP.
//!
//! Nothing here links a vendor library at build time: a machine without CUDA or NCCL gets
//! `LibraryNotFound` (every path tried) or `NoDevice`, never a panic.
//!
//! # Where NCCL is looked for
//! `UNICOMM_NCCL_LIBRARY` (a file), then `NCCL_HOME/lib`, `CUDA_HOME/lib64`, Python wheels
//! (`site-packages/nvidia/nccl/lib`, as PyTorch installs it), then the sonames
//! `libnccl.so.2` and `libnccl.so` through the system loader (`LD_LIBRARY_PATH`,
//! `ldconfig`). The first that opens and exports every required symbol wins; the error
//! lists every candidate and why it was passed over.

#![deny(unsafe_code)]

mod attributes;
mod dependent;
mod driver_error;
mod graph;
pub mod interop;
mod kernels;
mod mem_ops;
pub mod runtime;
mod vmm;

use std::sync::{Arc, OnceLock};
use unicomm_core::{CommConfig, Place};

use unicomm_core::Result;
use unicomm_nccl_api::{Api, ApiComm, ApiMemory, ApiStream, Vendor};

pub use graph::CudaGraph;
pub use interop::{
    lend, lend_mut, lend_raw, lend_raw_mut, memory_from_cudarc, memory_from_raw,
    stream_from_cudarc, stream_from_raw,
};
pub use runtime::{CudaRuntime, CudaStreamHandle};
pub use unicomm_nccl_api::sys::kernel_args::device_kernel_requirements;
pub use unicomm_nccl_api::{Policy, UniqueId};

/// NCCL on CUDA.
pub type NcclComm = ApiComm<CudaRuntime>;
/// A CUDA stream.
pub type NcclStream = ApiStream<CudaRuntime>;
/// CUDA device memory.
pub type NcclMemory = ApiMemory<CudaRuntime>;

/// NCCL's loader settings (defined once, in the NCCL-API layer).
pub use unicomm_nccl_api::flavor::NCCL;

/// The NCCL library, loaded once per process.
pub fn nccl() -> Result<Arc<Api>> {
    static API: OnceLock<Result<Arc<Api>>> = OnceLock::new();
    API.get_or_init(|| Api::load(&NCCL).map(Arc::new)).clone()
}

/// The CUDA driver, loaded once per process.
pub fn cuda() -> Result<Arc<CudaRuntime>> {
    static RT: OnceLock<Result<Arc<CudaRuntime>>> = OnceLock::new();
    RT.get_or_init(|| CudaRuntime::new().map(Arc::new)).clone()
}

/// Nccl's entry points (the shared NCCL-API layer's [`Vendor`], written once for NCCL and
/// RCCL); the free functions below are its methods.
#[derive(Debug, Clone, Copy)]
pub struct Nccl;

impl Vendor for Nccl {
    type Runtime = CudaRuntime;
    fn library() -> Result<Arc<Api>> {
        nccl()
    }
    fn runtime() -> Result<Arc<CudaRuntime>> {
        cuda()
    }
    fn local_rejoin() -> Arc<dyn unicomm_core::shrink::Rejoin> {
        Arc::new(unicomm_bootstrap::Rejoin::local())
    }
}

/// What is usable here: one line naming the devices and the NCCL library, or the reason
/// it is not (`NoDevice`, `LibraryNotFound`).
pub fn probe() -> Result<String> {
    Nccl::probe()
}

/// One communicator per visible GPU (or the first `n`), created from this thread.
pub fn local_comms(n: Option<usize>) -> Result<Vec<NcclComm>> {
    Nccl::local_comms_with(n, &CommConfig::default())
}

/// [`local_comms`] with a configuration (`ncclCommInitRankConfig`; a field the library
/// predates is `Unsupported`, naming it and its version).
pub fn local_comms_with(n: Option<usize>, config: &CommConfig) -> Result<Vec<NcclComm>> {
    Nccl::local_comms_with(n, config)
}

/// [`init_rank`] with a configuration.
pub fn init_rank_with(id: UniqueId, at: Place, config: &CommConfig) -> Result<NcclComm> {
    Nccl::init_rank_with(id, at, config)
}

/// Joins a world as `rank` of `world` on GPU `dev` (one rank per thread or per process);
/// every rank passes the same `id` (from [`unique_id`] on one of them).
pub fn init_rank(id: UniqueId, rank: usize, world: usize, dev: usize) -> Result<NcclComm> {
    Nccl::init_rank_with(id, Place::new(rank, world, dev), &CommConfig::default())
}

/// Joins a grown world ([`Vendor::init_grown_with`]).
pub fn init_grown_with(id: UniqueId, at: Place, config: &CommConfig) -> Result<NcclComm> {
    Nccl::init_grown_with(id, at, config)
}

/// [`init_rank_with`] through several roots ([`Vendor::init_rank_scalable_with`]).
pub fn init_rank_scalable_with(
    ids: &[UniqueId],
    at: Place,
    config: &CommConfig,
) -> Result<NcclComm> {
    Nccl::init_rank_scalable_with(ids, at, config)
}

/// How many roots a world of `world` ranks is created from: one per
/// `UNICOMM_RANKS_PER_ROOT` ranks (default 128), one where the loaded library predates
/// many-root creation (`unicomm_nccl_api::roots_for`).
pub fn roots_for(world: usize) -> Result<usize> {
    Nccl::roots_for(world)
}

/// A new world id (`ncclGetUniqueId`), to share with every rank.
pub fn unique_id() -> Result<UniqueId> {
    Nccl::unique_id()
}
