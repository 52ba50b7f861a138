//! The C library: what `nccl.h` declares, loaded at run time, and what a vendor crate
//! supplies beside it. Nothing here knows a communicator of unicomm's.
//!
//! - the function table, [`Flavor`](api::Flavor) (what differs between NCCL and RCCL at
//!   the loader), result codes, version gates and error translation, in [`api`];
//! - one safe method per library call, with its gate and typed result, in [`calls`] (the
//!   only place the library is called above the loader);
//! - the contract's values as the C API numbers them, in [`codes`];
//! - `ncclConfig_t`, in [`config`], and `ncclCollConfig_t`, in [`coll_config`];
//!   NCCL's device API's host structs (`ncclDevCommRequirements_t`, `ncclTeam_t`), in
//!   [`device_api`];
//! - what a library version on a device permits, written once for the backends and the
//!   mock, in [`target`];
//! - where a vendor library is looked for (also used by the HIP loader), in [`search`];
//! - the device [`Runtime`](runtime::Runtime) trait (CUDA for NCCL, HIP for RCCL), in
//!   [`runtime`], and what unicomm's symmetric kernels take, in [`kernel_args`].

pub mod api;
pub mod calls;
pub mod codes;
pub mod coll_config;
pub mod config;
pub mod device_api;
pub mod ep;
pub mod fatbin;
pub mod flavor;
pub mod kernel_args;
pub mod runtime;
pub mod search;
pub mod target;
