//! # unicomm
//!
//! One Rust API for GPU collective communication on NVIDIA (NCCL) and AMD (RCCL), with
//! user-buffer registration as a first-class, safe operation, and a CPU mock backend so that
//! everything but the GPU itself is tested without hardware.
//!
//! ```
//! use unicomm::{ReduceOp, Vendor};
//!
//! # fn main() -> unicomm::Result<()> {
//! # std::env::set_var("UNICOMM_MOCK_RANKS", "4");
//! // one thread per GPU in one process (the NCCL/RCCL user-buffer example's pthread mode)
//! let comms = unicomm::local_comms(Vendor::Mock)?;       // Vendor::Auto picks the GPU
//! std::thread::scope(|s| {
//!     for comm in comms {
//!         s.spawn(move || -> unicomm::Result<()> {
//!             let n = 1 << 20;
//!             let stream = comm.create_stream()?;
//!             let mut send = comm.alloc::<f32>(n)?;           // ncclMemAlloc / host memory on mock
//!             send.copy_from_host(&vec![comm.rank() as f32; n], &stream)?;
//!             let send = comm.register(send)?;                // owns the buffer, borrows comm
//!             let mut recv = comm.register(comm.alloc::<f32>(n)?)?;
//!             comm.all_reduce(&send, &mut recv, ReduceOp::Sum, &stream)?;
//!             let host = recv.copy_to_host(&stream)?;         // waits for the stream
//!             let w = comm.world_size() as f32;
//!             assert!(host.iter().all(|&x| x == w * (w - 1.0) / 2.0));
//!             let _send = comm.deregister(send)?;             // explicit: returns the buffer or
//!             drop(recv);                                     // the error; drop also deregisters
//!             Ok(())
//!         });
//!     }
//! });
//! # Ok(())
//! # }
//! ```
//!
//! Backends are cargo features: `mock` (default), `nccl`, `rccl`. Vendor libraries are
//! loaded at run time, so every backend builds on any machine. See `docs/ARCHITECTURE.md`.
#![warn(missing_docs)]

#[cfg(not(any(feature = "mock", feature = "nccl", feature = "rccl")))]
compile_error!("unicomm needs at least one backend feature: mock, nccl or rccl");

mod dispatch;

pub use comm_core::{
    backend, bf16, f16, Capabilities, DataType, DeviceSlice, DeviceSliceMut, DeviceStream, Element,
    Error, Op, RawHandle, ReduceOp, Result, Version,
};
pub use dispatch::{AnyComm, AnyMemory, AnyStream};

/// The backends compiled into this build, by crate.
#[cfg(feature = "mock")]
pub use backend_mock as mock;

/// A communicator of whichever backend was chosen at run time.
pub type Comm = comm_core::Comm<AnyComm>;
/// Device memory of `T` elements.
pub type Buffer<T> = comm_core::Buffer<T, AnyComm>;
/// A registered buffer (see [`comm_core::Registered`]).
pub type Registered<'c, T> = comm_core::Registered<'c, T, AnyComm>;
/// A buffer in a symmetric window (see [`comm_core::Window`]).
pub type Window<'c, T> = comm_core::Window<'c, T, AnyComm>;
/// A stream.
pub type Stream = AnyStream;
/// A shared view of device elements.
pub type View<'a, T> = comm_core::View<'a, T, AnyComm>;
/// An exclusive view of device elements.
pub type ViewMut<'a, T> = comm_core::ViewMut<'a, T, AnyComm>;

/// Which vendor's GPUs (and library) to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Vendor {
    /// NVIDIA if a CUDA device and NCCL are usable, else AMD if a HIP device and RCCL are,
    /// else the mock (if compiled in).
    Auto,
    /// NVIDIA GPUs through NCCL (feature `nccl`).
    Cuda,
    /// AMD GPUs through RCCL (feature `rccl`).
    Rocm,
    /// CPU threads as ranks (feature `mock`).
    Mock,
}

impl std::fmt::Display for Vendor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Vendor::Auto => "auto",
            Vendor::Cuda => "cuda",
            Vendor::Rocm => "rocm",
            Vendor::Mock => "mock",
        })
    }
}

impl std::str::FromStr for Vendor {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Vendor::Auto),
            "cuda" | "nvidia" | "nccl" => Ok(Vendor::Cuda),
            "rocm" | "amd" | "hip" | "rccl" => Ok(Vendor::Rocm),
            "mock" | "cpu" => Ok(Vendor::Mock),
            _ => Err(Error::invalid(
                "vendor",
                format!("{s:?} is not one of auto, cuda, rocm, mock"),
            )),
        }
    }
}

/// Decides what [`Vendor::Auto`] means on this machine: the vendor, and one line saying why
/// (what was found, or why each GPU vendor was passed over).
pub fn resolve(vendor: Vendor) -> (Vendor, String) {
    if vendor != Vendor::Auto {
        return (vendor, format!("{vendor} requested"));
    }
    let mut why: Vec<String> = Vec::new();
    #[cfg(feature = "nccl")]
    match backend_nccl::probe() {
        Ok(p) => return (Vendor::Cuda, format!("cuda: {p}")),
        Err(e) => why.push(format!("cuda: {e}")),
    }
    #[cfg(not(feature = "nccl"))]
    why.push("cuda: feature `nccl` not compiled in".into());
    #[cfg(feature = "rccl")]
    match backend_rccl::probe() {
        Ok(p) => return (Vendor::Rocm, format!("rocm: {p}")),
        Err(e) => why.push(format!("rocm: {e}")),
    }
    #[cfg(not(feature = "rccl"))]
    why.push("rocm: feature `rccl` not compiled in".into());
    (
        Vendor::Mock,
        format!("falling back to mock ({})", why.join("; ")),
    )
}

/// What the machine offers for `vendor`: one line naming devices, library and version, or
/// the reason it is unusable (`NoDevice`, `LibraryNotFound`, or a backend not compiled in).
pub fn probe(vendor: Vendor) -> Result<String> {
    match vendor {
        Vendor::Auto => Ok(resolve(Vendor::Auto).1),
        #[cfg(feature = "nccl")]
        Vendor::Cuda => backend_nccl::probe(),
        #[cfg(feature = "rccl")]
        Vendor::Rocm => backend_rccl::probe(),
        #[cfg(feature = "mock")]
        Vendor::Mock => Ok(format!(
            "CPU threads as ranks ({} by default, UNICOMM_MOCK_RANKS)",
            backend_mock::DEFAULT_RANKS
        )),
        #[allow(unreachable_patterns)]
        v => Err(not_compiled(
            match v {
                Vendor::Cuda => "nccl",
                Vendor::Rocm => "rccl",
                _ => "mock",
            },
            "this vendor",
        )),
    }
}

/// One communicator per visible device of `vendor`, in one process (hand each to its own
/// thread, or drive them all from one thread inside [`comm_core::Comm::group`]). The mock
/// has no devices: it takes `UNICOMM_MOCK_RANKS` ranks (default 4).
pub fn local_comms(vendor: Vendor) -> Result<Vec<Comm>> {
    local_comms_n(vendor, None)
}

/// Like [`local_comms`], with `n` ranks (`None`: every device, or `UNICOMM_MOCK_RANKS` on the
/// mock). On a GPU vendor, `n` may not exceed the visible devices.
pub fn local_comms_n(vendor: Vendor, n: Option<usize>) -> Result<Vec<Comm>> {
    let (vendor, _) = resolve(vendor);
    let raw: Vec<AnyComm> = match vendor {
        Vendor::Auto => unreachable_auto()?,
        Vendor::Mock => mock_comms(n)?,
        Vendor::Cuda => nccl_comms(n)?,
        Vendor::Rocm => rccl_comms(n)?,
    };
    Ok(raw.into_iter().map(comm_core::Comm::from_backend).collect())
}

/// One rank per process, launched by torchrun, mpirun or srun: reads the launcher's
/// variables (`comm_core::bootstrap::LaunchEnv`), shares rank 0's unique id over a TCP
/// rendezvous on `MASTER_ADDR:MASTER_PORT` (deadline: `UNICOMM_BOOTSTRAP_TIMEOUT_S`, default
/// 300 s), and joins on GPU `LOCAL_RANK`. The mock has no processes as ranks: `Unsupported`.
///
/// (DESIGN.md sketches this as `Comm::from_env`; `Comm` is an alias of a comm-core type, so
/// the facade offers it as a function.)
pub fn from_env(vendor: Vendor) -> Result<Comm> {
    let env = comm_core::bootstrap::LaunchEnv::detect()?;
    let timeout = std::time::Duration::from_secs(
        std::env::var("UNICOMM_BOOTSTRAP_TIMEOUT_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(300),
    );
    let raw = match resolve(vendor).0 {
        Vendor::Cuda => nccl_from_env(&env, timeout)?,
        Vendor::Rocm => rccl_from_env(&env, timeout)?,
        Vendor::Mock | Vendor::Auto => {
            return Err(Error::unsupported(
                "one rank per process on the mock",
                "a GPU vendor (the mock's ranks are threads: use local_comms)",
                format!("{} rank {} of {}", env.launcher, env.rank, env.world_size),
            ))
        }
    };
    Ok(comm_core::Comm::from_backend(raw))
}

#[cfg(feature = "nccl")]
fn nccl_from_env(
    env: &comm_core::bootstrap::LaunchEnv,
    timeout: std::time::Duration,
) -> Result<AnyComm> {
    let id = comm_core::bootstrap::exchange_unique_id(
        env,
        || Ok(backend_nccl::unique_id()?.to_bytes()),
        timeout,
    )?;
    let id = backend_nccl::UniqueId::from_bytes(id);
    Ok(AnyComm::Nccl(backend_nccl::init_rank(
        id,
        env.rank,
        env.world_size,
        env.local_rank,
    )?))
}
#[cfg(not(feature = "nccl"))]
fn nccl_from_env(_: &comm_core::bootstrap::LaunchEnv, _: std::time::Duration) -> Result<AnyComm> {
    Err(not_compiled("nccl", "CUDA/NCCL"))
}

#[cfg(feature = "rccl")]
fn rccl_from_env(
    env: &comm_core::bootstrap::LaunchEnv,
    timeout: std::time::Duration,
) -> Result<AnyComm> {
    let id = comm_core::bootstrap::exchange_unique_id(
        env,
        || Ok(backend_rccl::unique_id()?.to_bytes()),
        timeout,
    )?;
    let id = backend_rccl::UniqueId::from_bytes(id);
    Ok(AnyComm::Rccl(backend_rccl::init_rank(
        id,
        env.rank,
        env.world_size,
        env.local_rank,
    )?))
}
#[cfg(not(feature = "rccl"))]
fn rccl_from_env(_: &comm_core::bootstrap::LaunchEnv, _: std::time::Duration) -> Result<AnyComm> {
    Err(not_compiled("rccl", "ROCm/RCCL"))
}

fn unreachable_auto() -> Result<Vec<AnyComm>> {
    Err(Error::invalid("vendor", "auto was not resolved"))
}

#[cfg(feature = "mock")]
fn mock_comms(n: Option<usize>) -> Result<Vec<AnyComm>> {
    let n = match n {
        Some(n) => n,
        None => backend_mock::ranks_from_env()?,
    };
    Ok(backend_mock::world(n, backend_mock::MockConfig::default())?
        .into_iter()
        .map(AnyComm::Mock)
        .collect())
}
#[cfg(not(feature = "mock"))]
fn mock_comms(_: Option<usize>) -> Result<Vec<AnyComm>> {
    Err(not_compiled("mock", "the mock backend"))
}

#[cfg(feature = "nccl")]
fn nccl_comms(n: Option<usize>) -> Result<Vec<AnyComm>> {
    Ok(backend_nccl::local_comms(n)?
        .into_iter()
        .map(AnyComm::Nccl)
        .collect())
}
#[cfg(not(feature = "nccl"))]
fn nccl_comms(_: Option<usize>) -> Result<Vec<AnyComm>> {
    Err(not_compiled("nccl", "CUDA/NCCL"))
}

#[cfg(feature = "rccl")]
fn rccl_comms(n: Option<usize>) -> Result<Vec<AnyComm>> {
    Ok(backend_rccl::local_comms(n)?
        .into_iter()
        .map(AnyComm::Rccl)
        .collect())
}
#[cfg(not(feature = "rccl"))]
fn rccl_comms(_: Option<usize>) -> Result<Vec<AnyComm>> {
    Err(not_compiled("rccl", "ROCm/RCCL"))
}

#[allow(dead_code)] // unused when every backend feature is on
fn not_compiled(feature: &str, what: &str) -> Error {
    Error::unsupported(
        what.to_string(),
        format!("unicomm built with feature `{feature}`"),
        "a build without it",
    )
}
