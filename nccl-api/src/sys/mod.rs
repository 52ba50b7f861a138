//! The C library: what `nccl.h` declares, loaded at run time, and what a vendor crate
//! supplies beside it. Nothing here knows a communicator of unicomm's.
//!
//! - the function table, [`Flavor`](api::Flavor) (what differs between NCCL and RCCL at
//!   the loader), result codes, version gates and error translation, in [`api`];
//! - `ncclConfig_t`, in [`config`];
//! - where a vendor library is looked for (also used by the HIP loader), in [`search`];
//! - the device [`Runtime`](runtime::Runtime) trait (CUDA for NCCL, HIP for RCCL), in
//!   [`runtime`].

pub mod api;
pub mod config;
pub mod flavor;
pub mod runtime;
pub mod search;
