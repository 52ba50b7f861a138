//! unicomm's NVIDIA backend: NCCL through its own run-time loaded table ([`api`]), CUDA
//! through cudarc ([`mod@cuda`]), and the communicator written once over any NCCL-API library
//! and device runtime ([`comm`]), which backend-rccl reuses with HIP.
//!
//! Nothing here links a vendor library at build time: a machine without CUDA or NCCL gets
//! `LibraryNotFound` (every path tried) or `NoDevice`, never a panic.
#![warn(missing_docs)]

pub mod api;
pub mod comm;
pub mod cuda;
pub mod runtime;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use comm_core::{Result, Version};

pub use api::{Api, Flavor, UniqueId};
pub use comm::{ApiComm, ApiMemory, ApiStream};
pub use cuda::{CudaRuntime, CudaStreamHandle};
pub use runtime::Runtime;

/// NCCL on CUDA.
pub type NcclComm = ApiComm<CudaRuntime>;
/// A CUDA stream.
pub type NcclStream = ApiStream<CudaRuntime>;
/// CUDA device memory.
pub type NcclMemory = ApiMemory<CudaRuntime>;

fn nccl_dirs() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(h) = std::env::var_os("NCCL_HOME") {
        v.push(PathBuf::from(h).join("lib"));
    }
    if let Some(h) = std::env::var_os("CUDA_HOME") {
        v.push(PathBuf::from(h).join("lib64"));
    }
    v.extend(api::python_wheel_dirs("nvidia/nccl/lib"));
    v
}

/// NCCL's loader settings: `UNICOMM_NCCL_LIBRARY`, `NCCL_HOME/lib`, `CUDA_HOME/lib64`,
/// Python wheels (`site-packages/nvidia/nccl/lib`), then `libnccl.so.2`, `libnccl.so`.
pub static NCCL: Flavor = Flavor {
    library: "NCCL",
    env_var: "UNICOMM_NCCL_LIBRARY",
    dirs: nccl_dirs,
    sonames: &["libnccl.so.2", "libnccl.so"],
    all_to_all: &["ncclAlltoAll"],
    registration_since: Version::new(2, 19, 0),
    windows_since: Version::new(2, 27, 0),
    mem_alloc_since: Version::new(2, 19, 0),
};

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

/// What is usable here: one line naming the devices and the NCCL library, or the reason
/// it is not (`NoDevice`, `LibraryNotFound`).
pub fn probe() -> Result<String> {
    let rt = cuda()?;
    let api = nccl()?;
    Ok(format!(
        "{}; NCCL {} at {}",
        rt.describe(),
        api.version,
        api.path
    ))
}

/// One communicator per visible GPU (or the first `n`), created from this thread.
pub fn local_comms(n: Option<usize>) -> Result<Vec<NcclComm>> {
    // The device first: "no GPU" says more than "no library" on a machine without either.
    let rt = cuda()?;
    ApiComm::local(nccl()?, rt, n)
}

/// Joins a world as `rank` of `world` on GPU `dev` (one rank per thread or per process);
/// every rank passes the same `id` (from [`unique_id`] on one of them).
pub fn init_rank(id: UniqueId, rank: usize, world: usize, dev: usize) -> Result<NcclComm> {
    ApiComm::init_rank(nccl()?, cuda()?, id, rank, world, dev)
}

/// A new world id (`ncclGetUniqueId`), to share with every rank.
pub fn unique_id() -> Result<UniqueId> {
    nccl()?.unique_id()
}

/// Interop: a cudarc stream as a unicomm stream.
pub fn stream_from_cudarc(s: Arc<cudarc::driver::CudaStream>) -> Result<NcclStream> {
    let dev = s.context().ordinal();
    Ok(ApiStream::from_runtime(cuda()?, CudaStreamHandle(s), dev))
}

/// Interop: a cudarc slice as unicomm memory, without a copy. The slice is kept alive by
/// the returned memory (and freed with it).
pub fn memory_from_cudarc<T: cudarc::driver::DeviceRepr + Send + Sync + 'static>(
    slice: cudarc::driver::CudaSlice<T>,
) -> Result<NcclMemory> {
    use cudarc::driver::DevicePtr;
    let dev = slice.context().ordinal();
    let bytes = slice.num_bytes();
    let stream = slice.stream().clone();
    let (p, sync) = slice.device_ptr(&stream);
    let p = p as usize;
    drop(sync);
    // SAFETY: the slice's memory belongs to device `dev` and is kept alive by `keep`.
    unsafe { ApiMemory::borrowed(cuda()?, dev, p, bytes, Some(Box::new(slice))) }
}

/// Interop: raw device memory as unicomm memory, without a copy.
///
/// # Safety
/// `ptr..ptr+bytes` is memory of CUDA device `dev` that outlives the returned value and
/// every operation enqueued on it.
pub unsafe fn memory_from_raw(dev: usize, ptr: usize, bytes: usize) -> Result<NcclMemory> {
    // SAFETY: forwarded from the caller.
    unsafe { ApiMemory::borrowed(cuda()?, dev, ptr, bytes, None) }
}
