//! # unicomm
//!
//! One Rust API for GPU collective communication on NVIDIA (NCCL) and AMD (RCCL), with
//! user-buffer registration as a first-class, safe operation, and a CPU mock backend so that
//! everything but the GPU itself is tested without hardware.
//!
//! ```
//! use unicomm::{each_rank, ReduceOp, Vendor};
//!
//! # std::env::set_var("UNICOMM_MOCK_RANKS", "4");
//! // one thread per GPU in one process (the NCCL/RCCL user-buffer example's pthread mode)
//! let comms = unicomm::local_comms(Vendor::Mock)?;       // Vendor::Auto picks the GPU
//! each_rank(comms, |comm| -> unicomm::Result<()> {
//!     let n = 1 << 20;
//!     let stream = comm.create_stream()?;
//!     let mut send = comm.alloc::<f32>(n)?;           // ncclMemAlloc / host memory on mock
//!     send.copy_from_host(&vec![comm.rank() as f32; n], &stream)?;
//!     let send = comm.register(send)?;                // owns the buffer, borrows comm
//!     let mut recv = comm.register(comm.alloc::<f32>(n)?)?;
//!     comm.all_reduce(&send, &mut recv, ReduceOp::Sum, &stream)?;
//!     let host = recv.copy_to_host(&stream)?;         // waits for the stream
//!     let w = comm.world_size() as f32;
//!     assert!(host.iter().all(|&x| x == w * (w - 1.0) / 2.0));
//!     let _send = comm.deregister(send)?;             // explicit: returns the buffer or
//!     drop(recv);                                     // the error; drop also deregisters
//!     Ok(())
//! })?;                                                // every rank's error is seen
//! # Ok::<(), unicomm::Error>(())
//! ```
//!
//! More, runnable on the mock: [`guide`] (registration, windows, automatic registration,
//! every collective family).
//!
//! Backends are cargo features: `mock` (default), `nccl`, `rccl`. Vendor libraries are
//! loaded at run time, so every backend builds on any machine. See `docs/dev/ARCHITECTURE.md`.
//!
//! # Choosing the vendor
//! [`Vendor::Auto`] means a GPU vendor: NVIDIA (NCCL) if usable, else AMD (RCCL); when
//! neither is, it is an error naming why each was passed over. It never lands on the CPU
//! mock by itself. A hardware-free CI chooses the mock explicitly, without changing code:
//! `UNICOMM_VENDOR=mock` is honoured by `Auto`. Vendor strings (`--vendor`,
//! `UNICOMM_VENDOR`, [`Vendor::from_str`](std::str::FromStr)): `auto`; `cuda` (or
//! `nvidia`, `nccl`); `rocm` (or `amd`, `hip`, `rccl`); `mock` (or `cpu`). The mock's rank
//! count is `UNICOMM_MOCK_RANKS` (default 4) or [`local_comms_n`]'s argument.
//!
//! # The API
//! [`Comm`] is [`generic::Comm`] over whichever backend was chosen at run time: its methods
//! (`alloc`, `register`, `all_reduce`, `all_to_all`, `group`, `abort`, ...) are listed on
//! that page, and the contract they follow (ordering, when errors surface, what is
//! validated where) on [`core`]'s front page. The buffer types are likewise
//! [`generic::Buffer`], [`generic::Registration`] and the views.
//!
//! # One rank fails
//! A rank that fails before it enqueues a collective leaves its peers waiting for it: for
//! the mock's deadline (`UNICOMM_MOCK_TIMEOUT_MS`, 60 s by default), and on NCCL/RCCL
//! without end. A caller that sees an error on one rank must call [`Comm::abort`] on that
//! rank's communicator: on the mock its peers then fail at once with `Aborted`; on
//! NCCL/RCCL the peers must abort too (one thread per process watching for the failure,
//! as PyTorch's watchdog does). The examples do both.
//!
//! # Vendor-specific parts
//! Each compiled backend is re-exported: [`mock`] (configuration, fault injection),
//! `nccl` (cudarc interop, `init_rank`/`unique_id`, where NCCL is searched,
//! `UNICOMM_NCCL_LIBRARY`) and `rccl` (the same for ROCm). See docs/cuda.md and
//! docs/rocm.md.

#![deny(unsafe_code)]

#[cfg(not(any(feature = "mock", feature = "nccl", feature = "rccl")))]
compile_error!("unicomm needs at least one backend feature: mock, nccl or rccl");

mod dispatch;
#[cfg(feature = "mock")]
mod host;
mod id;

pub use dispatch::{AnyComm, AnyGraph, AnyMemory, AnyStream};
#[cfg(feature = "mock")]
pub use host::{host_scope, HostScope};
pub use id::{init_grown, init_rank, UniqueId};
pub use unicomm_core::each_rank;

#[doc = include_str!("guide.md")]
pub mod guide {}
/// The ownership rules of registered memory and captured graphs, as programs that must not
/// compile (each checked by `cargo test`, with its error code).
#[doc = include_str!("rules.md")]
pub mod rules {}
pub use unicomm_core::symmetric::{
    RmsNormOptions, SymmetricAlgorithm, SymmetricArgs, SymmetricOptions, MAX_SYMMETRIC_WORLD,
};
pub use unicomm_core::{
    backend, bf16, f16, packed_displs, Algorithm, Algorithms, CallOptions, Capabilities,
    CommConfig, Counts, CtaPolicy, DataType, DeviceInfo, DeviceSlice, DeviceSliceMut, DeviceStream,
    Element, Error, ExpertConfig, ExpertEngine, ExpertMode, ExpertOptions, ExpertTokens,
    Fp8Buffers, LaunchMarker, Marker, Op, Place, RankMask, RawHandle, ReduceOp, Result, Scalar,
    ShrinkMode, SignalWait, Version, F8E4M3, F8E5M2,
};
pub use unicomm_core::{DeviceCommLayout, DeviceCommRequirements, Team};

/// This rank's communicators along each dimension of a mesh of the world (`dp` x `tp`,
/// ...), over the backend chosen at run time.
pub type DeviceMesh = unicomm_core::DeviceMesh<AnyComm>;

/// The rendezvous (`unicomm-bootstrap`): the launcher's variables, the unique id's exchange, re-forming.
pub use unicomm_bootstrap as bootstrap;
/// The contract crate (`unicomm-core`): the backend trait, the typed API, the flight recorder.
pub use unicomm_core as core;

/// The generic types behind the aliases below ([`Comm`], [`Buffer`], [`Registered`],
/// [`Window`], [`View`], [`ViewMut`]), documented here with all their methods: `C` is the
/// backend, [`AnyComm`] for the aliases.
pub mod generic {
    #[doc(inline)]
    pub use unicomm_core::registration::{AutoKind, BufferKind, Kind, WindowKind};
    #[doc(inline)]
    pub use unicomm_core::{
        Buffer, Comm, DeviceSlice, DeviceSliceMut, ExpertGroup, RegisterError, Registration,
        Symmetric, View, ViewMut,
    };
}
/// The CPU mock backend (feature `mock`): configuration and fault injection.
#[cfg(feature = "mock")]
pub use unicomm_mock as mock;
/// The NVIDIA backend (feature `nccl`): cudarc interop, `init_rank`/`unique_id`, the NCCL
/// search order and `UNICOMM_NCCL_LIBRARY`.
#[cfg(feature = "nccl")]
pub use unicomm_nccl as nccl;
/// The AMD backend (feature `rccl`): `init_rank`/`unique_id`, the RCCL and HIP search order.
#[cfg(feature = "rccl")]
pub use unicomm_rccl as rccl;

/// A communicator of whichever backend was chosen at run time: [`generic::Comm`], whose
/// page lists its methods (`alloc`, `register`, `all_reduce`, `all_to_all`, `group`,
/// `abort`, ...) and the contract they follow.
pub type Comm = unicomm_core::Comm<AnyComm>;
/// Device memory of `T` elements: [`generic::Buffer`] (methods there).
pub type Buffer<T> = unicomm_core::Buffer<T, AnyComm>;
/// A registered buffer: [`generic::Registration`] of the buffer kind (methods there).
pub type Registered<'c, T> = unicomm_core::Registered<'c, T, AnyComm>;
/// A buffer registered for the automatic policy (`register_auto`): [`generic::Registration`]
/// of the automatic kind.
pub type AutoRegistered<'c, T> = unicomm_core::AutoRegistered<'c, T, AnyComm>;
/// A buffer in a symmetric window: [`generic::Registration`] of the window kind.
pub type Window<'c, T> = unicomm_core::Window<'c, T, AnyComm>;
/// Symmetric memory: one allocation per rank, every rank's mapped on every rank, with
/// unicomm's own kernels on it ([`generic::Symmetric`], methods there; docs/symmetric.md).
pub type Symmetric<'c, T> = unicomm_core::Symmetric<'c, T, AnyComm>;
/// An expert-parallel group: dispatch and combine with counts on the device
/// ([`generic::ExpertGroup`], methods there; docs/symmetric.md).
pub type ExpertGroup<'c, T> = unicomm_core::ExpertGroup<'c, T, AnyComm>;
/// A device communicator (NCCL's device API) over the backend chosen at run time.
pub type DeviceComm<'c> = unicomm_core::DeviceComm<'c, AnyComm>;
/// A stream ([`AnyStream`]).
pub type Stream = AnyStream;
/// A shared view of device elements: [`generic::View`] (methods there).
pub type View<'a, T> = unicomm_core::View<'a, T, AnyComm>;
/// An exclusive view of device elements: [`generic::ViewMut`] (methods there).
pub type ViewMut<'a, T> = unicomm_core::ViewMut<'a, T, AnyComm>;
/// An engine's device memory lent for a borrow, to be read by a collective
/// ([`core::Lent`]; made by `nccl::lend`, `nccl::lend_raw`, `rccl::lend_raw`, then
/// `.into_backend()`). Dropping it frees nothing.
pub type Lent<'a, T> = unicomm_core::Lent<'a, T, AnyComm>;
/// An engine's device memory lent for an exclusive borrow, to be written by a collective
/// ([`core::LentMut`]).
pub type LentMut<'a, T> = unicomm_core::LentMut<'a, T, AnyComm>;

/// A captured graph of collectives over [`Comm`]s, launched on a [`Stream`]
/// ([`core::graph::Graph`]: capture, launch, the borrows it holds).
pub type Graph<'a> = unicomm_core::graph::Graph<'a, AnyComm>;
/// What a step's closure enqueues through ([`core::step::Step`]): a captured graph's, a
/// completion handle's.
pub type Step<'a> = unicomm_core::step::Step<'a, AnyComm>;
/// The work of a step in flight, a future ([`core::completion::Completion`]: `start`,
/// `is_done`, `wait`, `.await`, `marker`).
pub type Completion<'a> = unicomm_core::completion::Completion<'a, AnyComm>;

/// Which vendor's GPUs (and library) to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Vendor {
    /// A GPU vendor: `UNICOMM_VENDOR` if set, else NVIDIA if a CUDA device and NCCL are
    /// usable, else AMD if a HIP device and RCCL are, else an error. Never the mock unless
    /// `UNICOMM_VENDOR=mock` asks for it.
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
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Vendor::Auto),
            "cuda" | "nvidia" | "nccl" => Ok(Vendor::Cuda),
            "rocm" | "amd" | "hip" | "rccl" => Ok(Vendor::Rocm),
            "mock" | "cpu" => Ok(Vendor::Mock),
            _ => Err(Error::invalid(
                "vendor",
                format!("{s:?} is not one of auto, cuda (nvidia, nccl), rocm (amd, hip, rccl), mock (cpu)"),
            )),
        }
    }
}

/// Decides what `vendor` means on this machine: the concrete vendor and one line saying
/// why. For [`Vendor::Auto`]: `UNICOMM_VENDOR` when set (an invalid value is an error),
/// else the first usable GPU vendor; when none is usable, `NoDevice` naming why each GPU
/// vendor was passed over. Auto never resolves to the mock by itself.
pub fn resolve(vendor: Vendor) -> Result<(Vendor, String)> {
    if vendor != Vendor::Auto {
        return Ok((vendor, format!("{vendor} requested")));
    }
    if let Some(v) = std::env::var_os("UNICOMM_VENDOR") {
        let s = v.to_string_lossy();
        let chosen: Vendor = s.parse().map_err(|_| {
            Error::invalid(
                "UNICOMM_VENDOR",
                format!("{s:?} is not one of auto, cuda, rocm, mock"),
            )
        })?;
        if chosen != Vendor::Auto {
            return Ok((chosen, format!("{chosen} chosen by UNICOMM_VENDOR")));
        }
    }
    let mut why = Vec::new();
    for v in [Vendor::Cuda, Vendor::Rocm] {
        match dispatch::probe_vendor(v) {
            Ok(p) => return Ok((v, format!("{v}: {p}"))),
            Err(e) => why.push(format!("{v}: {e}")),
        }
    }
    Err(Error::NoDevice {
        vendor: "GPU",
        detail: format!(
            "Vendor::Auto found no usable GPU vendor ({}); set UNICOMM_VENDOR=mock to run on CPU threads",
            why.join("; ")
        ),
    })
}

/// What the machine offers for `vendor`: one line naming devices, library and version, or
/// the reason it is unusable (`NoDevice`, `LibraryNotFound`, or a backend not compiled in).
pub fn probe(vendor: Vendor) -> Result<String> {
    match vendor {
        Vendor::Auto => resolve(Vendor::Auto).map(|(_, why)| why),
        v => dispatch::probe_vendor(v),
    }
}

/// One communicator per visible device of `vendor`, in one process (hand each to its own
/// thread, or drive them all from one thread inside [`unicomm_core::Comm::group`]). The mock
/// has no devices: it takes `UNICOMM_MOCK_RANKS` ranks (default 4).
///
/// ```
/// # std::env::set_var("UNICOMM_MOCK_RANKS", "3");
/// let comms = unicomm::local_comms(unicomm::Vendor::Mock)?;
/// assert_eq!(comms.len(), 3);
/// assert!(comms.iter().enumerate().all(|(r, c)| c.rank() == r && c.world_size() == 3));
/// # Ok::<(), unicomm::Error>(())
/// ```
pub fn local_comms(vendor: Vendor) -> Result<Vec<Comm>> {
    local_comms_n(vendor, None)
}

/// Like [`local_comms`], with `n` ranks (`None`: every device, or `UNICOMM_MOCK_RANKS` on the
/// mock). On a GPU vendor, `n` may not exceed the visible devices.
pub fn local_comms_n(vendor: Vendor, n: Option<usize>) -> Result<Vec<Comm>> {
    local_comms_with(vendor, n, &CommConfig::default())
}

/// Like [`local_comms_n`], each communicator created with `config` (NCCL's
/// `ncclConfig_t`: blocking, CTA counts and policy, names; a field the loaded library
/// predates is `Unsupported`, naming it). The mock checks it and is otherwise unaffected.
pub fn local_comms_with(
    vendor: Vendor,
    n: Option<usize>,
    config: &CommConfig,
) -> Result<Vec<Comm>> {
    let (vendor, _) = resolve(vendor)?;
    let raw = dispatch::local_vendor(vendor, n, config)?;
    Ok(raw
        .into_iter()
        .map(unicomm_core::Comm::from_backend)
        .collect())
}

/// One rank per process, launched by torchrun, mpirun or srun: reads the launcher's
/// variables (`unicomm_bootstrap::LaunchEnv`), shares rank 0's unique id over a TCP
/// rendezvous on `MASTER_ADDR:MASTER_PORT` (deadline: `UNICOMM_BOOTSTRAP_TIMEOUT_S`, default
/// 300 s), and joins on GPU `LOCAL_RANK`. On the mock (Linux) the ranks are the processes of
/// this machine, their buffers in shared memory (`unicomm_mock::join`): a program launched
/// one rank per process is tested in CI without a GPU.
///
/// (DESIGN.md sketches this as `Comm::from_env`; `Comm` is an alias of a unicomm-core type,
/// so the facade offers it as a function.)
///
/// ```
/// // What torchrun sets for a job of one rank (rank 0 serves the rendezvous).
/// # let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
/// for (k, v) in [("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
///                ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", &port.to_string())] {
///     std::env::set_var(k, v);
/// }
/// let comm = unicomm::from_env(unicomm::Vendor::Mock)?;
/// assert_eq!((comm.rank(), comm.world_size()), (0, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn from_env(vendor: Vendor) -> Result<Comm> {
    from_env_with(vendor, &CommConfig::default())
}

/// Like [`from_env`], the communicator created with `config`.
pub fn from_env_with(vendor: Vendor, config: &CommConfig) -> Result<Comm> {
    let env = unicomm_bootstrap::LaunchEnv::detect()?;
    let timeout = bootstrap_timeout()?;
    let (vendor, _) = resolve(vendor)?;
    let raw = dispatch::from_env_vendor(vendor, &env, timeout, config)?;
    Ok(unicomm_core::Comm::from_backend(raw))
}

/// `UNICOMM_BOOTSTRAP_TIMEOUT_S` (seconds, 1..=86400), default 300.
fn bootstrap_timeout() -> Result<std::time::Duration> {
    let s =
        unicomm_core::env::whole_number("UNICOMM_BOOTSTRAP_TIMEOUT_S", 300, 1..=86_400, "seconds")?;
    Ok(std::time::Duration::from_secs(s))
}
