//! The NCCL-API layer unicomm's GPU backends share, written once for NCCL and RCCL (they
//! export the same C API). Its layers, each importing only those below it:
//!
//! 1. [`sys`]: the C library: the function table, `ncclConfig_t`, result codes, the
//!    library search, and the device [`Runtime`] trait (all a vendor crate supplies: CUDA
//!    for NCCL, HIP for RCCL);
//! 2. small shared tools: one back-off, the bounded call on a helper thread, the settling
//!    of non-blocking calls (`wait.rs`), the thread's group (`group.rs`), the stream
//!    watchers (`watch.rs`), streams and memory ([`memory`]);
//! 3. one safe `ncclComm_t` (`libcomm.rs`): its lock, state, deadline, creation
//!    (`create.rs`) and teardown; it names no feature: children and abort hooks are
//!    registered with it;
//! 4. helpers over one communicator: the ranks' agreement (`agree.rs`), the registration
//!    bookkeeping (`base.rs`);
//! 5. the paths, each with its own state, taking the communicator they run on: the plain
//!    library call (`plain.rs`), the copy engines (`copy_engine/`), the automatic
//!    registrations and their [`Policy`] (`auto.rs`, [`policy`]), which alone choose
//!    between the others;
//! 6. [`ApiComm`], composed of the parts above, with the one place that decides a call's
//!    route (`comm/route.rs`).
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

mod agree;
mod auto;
mod base;
mod comm;
mod conv;
mod copy_engine;
mod create;
mod group;
mod libcomm;
pub mod memory;
mod plain;
pub mod policy;
mod shrink;
mod split;
pub mod sys;
mod wait;
mod watch;

pub use comm::ApiComm;
pub use copy_engine::signals::CopyEngineSync;
pub use memory::{ApiMemory, ApiStream};
pub use policy::Policy;
pub use sys::api::{Api, Flavor, UniqueId};
pub use sys::runtime::Runtime;
pub use sys::{api, config, runtime, search};

/// The copy-engine path's building blocks, for the GPU test crate (`unicomm-gpu-tests`) to
/// run on a real GPU what the fake library cannot reach: not a stable API.
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing {
    #[cfg(target_os = "linux")]
    pub use crate::copy_engine::ipc::{exchange, Job, Listener, Offer};
    pub use crate::copy_engine::signals::{
        block_bytes, block_image, release, wanted, Phase, Signals,
    };
}
