//! The NCCL-API layer unicomm's GPU backends share, written once for NCCL and RCCL (they
//! export the same C API):
//!
//! - [`search`]: where a vendor library is looked for (also used by the HIP loader);
//! - [`api`]: the run-time loaded function table, version gates and error translation;
//! - [`runtime`]: the [`Runtime`] trait, all a vendor crate supplies (CUDA for NCCL, HIP for
//!   RCCL);
//! - [`comm`], [`memory`] and `collective.rs`: [`ApiComm<R>`], the communicator generic
//!   over the runtime, with its streams and memory.
//!
//! # Contract of this layer
//! - Nothing links a vendor library at build time. A missing library is `LibraryNotFound`
//!   naming every path tried, in order; a missing required symbol is `MissingSymbol`; an
//!   optional feature the library lacks (registration, windows, `ncclMemAlloc`,
//!   all-to-all) is `Unsupported` naming the version needed and the version found.
//! - Every library call is checked: a failing `ncclResult_t` becomes `Error::Library` with
//!   the code, its name, `ncclGetErrorString` and `ncclGetLastError`.
//! - An `ApiComm` serialises its library calls (NCCL forbids concurrent calls on one
//!   communicator) and can be aborted from any thread; after finalize or abort every call is
//!   an error, never a use of a freed communicator.
//! - Registration handles are bookkept ([`unicomm_core::registry`]): deregistering twice, or
//!   a handle of another communicator, is `InvalidArgument`, and of two threads
//!   deregistering one handle exactly one reaches the library.
//! - Windows left registered on a raw communicator are released by `ncclCommDestroy` /
//!   `ncclCommAbort`; unicomm does not deregister them one by one at drop because that call
//!   is collective.

pub mod api;
mod auto;
mod check;
mod collective;
pub mod comm;
mod copy_engine;
#[cfg(feature = "gpu-harness")]
pub mod gpu_tests;
#[cfg(target_os = "linux")]
mod ipc;
mod lock;
pub mod memory;
pub mod policy;
pub mod runtime;
pub mod search;
mod signals;
mod watchdog;

pub use api::{Api, Flavor, UniqueId};
pub use comm::ApiComm;
pub use memory::{ApiMemory, ApiStream};
pub use policy::Policy;
pub use runtime::Runtime;
pub use search::Search;
pub use signals::CopyEngineSync;
