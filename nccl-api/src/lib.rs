//! The NCCL-API layer unicomm's GPU backends share, written once for NCCL and RCCL (they
//! export the same C API). Its layers, each importing only its own and those below it (the
//! architecture test, `xtask/src/tidy`, holds the table and checks it):
//!
//! 1. [`sys`]: the C library: the function table, `ncclConfig_t`, result codes, the
//!    library search, and the device [`Runtime`] trait (all a vendor crate supplies: CUDA
//!    for NCCL, HIP for RCCL);
//! 2. tools: one back-off, the bounded call on a helper thread, the settling of
//!    non-blocking calls (`wait.rs`), the stream watchers (`watch.rs`), the thread's group
//!    (`group.rs`), streams and memory ([`memory`]), the contract's types in the C API's
//!    values (`conv.rs`), the automatic policy's table ([`policy`]);
//! 3. one safe `ncclComm_t` (`libcomm/mod.rs`) and its creation (`create.rs`): its lock,
//!    state, deadline and teardown; it names no feature: children and abort hooks are
//!    registered with it;
//! 4. over one communicator: the ranks' agreement (`agree.rs`), each operation as the
//!    library's call (`library.rs`), split and shrink (`split.rs`, `shrink.rs`), the
//!    registration bookkeeping (`base.rs`);
//! 5. the other paths: the copy engines (`copy_engine/`) and the automatic registrations
//!    (`auto.rs`);
//! 6. [`ApiComm`], composed of the parts above, with the one decision of where a call goes
//!    (`comm/route.rs`).
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

#![deny(unsafe_code)]

mod agree;
mod auto;
mod base;
mod comm;
mod conv;
mod copy_engine;
mod create;
mod device_comm;
mod group;
mod libcomm;
mod library;
mod marker;
pub mod memory;
pub mod policy;
mod shrink;
mod split;
mod symmetric;
pub mod sys;
mod vendor;
mod wait;
mod watch;

pub use comm::ApiComm;
pub use copy_engine::signals::CopyEngineSync;
pub use create::{roots_for, RANKS_PER_ROOT};
pub use memory::{ApiGraph, ApiMemory, ApiStream};
pub use policy::Policy;
pub use sys::api::{Api, Flavor, UniqueId};
pub use sys::runtime::Runtime;
pub use sys::target::Target;
pub use sys::{api, config, flavor, runtime, search, target};
pub use vendor::Vendor;

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
