//! The contract of unicomm: one API for GPU collectives on NVIDIA (NCCL), AMD (RCCL) and a
//! CPU mock.
//!
//! # Layers
//! - [`Collective`] ([`backend`]) is what a backend implements: untyped operations ([`Op`],
//!   a [`Kind`] over byte [`Slice`]s of its memory) enqueued on its streams through one
//!   door, `enqueue`: [`Comm`] builds every `Op`.
//! - [`Comm`] ([`comm`]) is what users call: typed elements ([`Element`]), [`buffer`]s and
//!   views, and the ownership rules of registered memory ([`registration`]: [`Registered`],
//!   [`Window`]).
//!
//! # The contract
//! - **Ordering.** Every collective and every copy is ordered on a stream the caller
//!   passes; work on one stream runs in order. Collectives never wait on the host; the
//!   host waits in `synchronize`, the `copy_to_host` family (which wait for the stream
//!   first), and `copy_from_host`, which returns once its source may be reused (on GPUs,
//!   after the copy).
//! - **Failure of one rank.** A rank that fails before it enqueues leaves its peers
//!   waiting until their deadline (mock: `UNICOMM_MOCK_TIMEOUT_MS`; NCCL/RCCL:
//!   `UNICOMM_TIMEOUT_MS`, [`Comm::set_timeout`]), which aborts them and returns `Timeout`.
//!   Call [`Comm::abort`] on the failing rank (any thread may): mock peers then fail at once
//!   with `Aborted` (also when a rank's process dies); NCCL/RCCL peers at their deadline.
//! - **Errors.** Argument errors (`InvalidArgument`, naming the argument) are returned by the
//!   call, before anything is enqueued. Failures of the work itself (a peer that never
//!   arrives, ranks that disagree about the operation) are returned by the next
//!   `synchronize` of the stream or by a blocking copy, as on real hardware.
//! - **Counts** are elements. The typed API derives them from the views: `all_reduce` reduces
//!   `send.len()` elements; `all_to_all` sends `send.len() / world_size` to each peer.
//! - **In-place** operations have their own methods (`all_reduce_in_place`, ...); in-place
//!   all-gather and reduce-scatter use NCCL's layout (this rank's chunk of the larger buffer).
//! - **Registration.** [`Comm::register`] takes the buffer and returns a [`Registered`] that
//!   borrows the communicator: the memory cannot be freed and the communicator cannot be
//!   destroyed while it is registered, yet the registered buffer can still be an output.
//!   [`Comm::deregister`] gives it back. If any rank passes registered memory to a collective,
//!   every rank must (the mock checks this and returns `Mismatch`).
//! - **What is validated where.** [`Comm`] checks what the caller controls: lengths, overflow,
//!   roots and peers, memory of another device. Backends check what only they can know: the
//!   library's version for a feature (`Unsupported`), live registration handles, and (on the
//!   mock) agreement across ranks. Nothing a caller or the environment can cause panics.

#![deny(unsafe_code)]

pub mod backend;
pub mod buffer;
pub mod call_options;
mod capturing;
mod clock;
pub mod comm;
pub mod completion;
pub mod config;
mod counts;
mod device;
pub mod device_api;
pub mod element;
pub mod env;
mod error;
pub mod expert;
pub mod flight;
pub mod fp8;
pub mod graph;
mod info;
mod kind;
pub mod layout;
pub mod lent;
mod marker;
mod mesh;
pub mod one_sided;
pub mod op;
mod ranks;
pub mod registration;
pub mod registry;
pub mod shrink;
pub mod state;
pub mod step;
pub mod symmetric;
pub mod work;

pub use backend::{
    Capabilities, Collective, DeviceGraph, DeviceInfo, DeviceMemory, DeviceStream, Marker,
    MarkerTime, RawHandle, StreamPriority, Version,
};
pub use buffer::{Buffer, DeviceSlice, DeviceSliceMut, View, ViewMut};
pub use call_options::{Algorithm, Algorithms, CallOptions, LaunchMarker};
pub use comm::device_api::DeviceComm;
pub use comm::fused::Fp8Buffers;
pub use comm::symmetric::Symmetric;
pub use comm::{packed_displs, Comm};
pub use config::{CommConfig, CtaPolicy};
pub use counts::{layout_disagreement, Counts, Layout};
pub use device_api::{DeviceCommLayout, DeviceCommRequirements, Team};
pub use element::{DataType, Element, ReduceOp, Scalar};
pub use error::{Error, Result};
pub use expert::{ExpertGroup, ExpertTokens};
pub use fp8::{F8E4M3, F8E5M2};
pub use half::{bf16, f16};
pub use kind::{What, WorkName};
pub use layout::Zeros;
pub use lent::{Lent, LentMut};
pub use mesh::DeviceMesh;
pub use one_sided::SignalWait;
pub use op::{Extent, Kind, Op, Slice};
pub use ranks::{each_rank, Place};
pub use registration::{AutoRegistered, RegisterError, Registered, Registration, Window};
pub use shrink::{Rejoin, ShrinkMode};
pub use state::{MemStats, Properties};
pub use symmetric::{ExpertConfig, ExpertEngine, ExpertMode, ExpertOptions, RankMask};
pub use work::{Work, DEVICE_PATH};
