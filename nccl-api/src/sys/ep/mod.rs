//! NCCL EP (NVIDIA's nccl-extensions, `nccl_ep.h`): expert-parallel dispatch and combine
//! over NCCL's device API, loaded at run time beside the NCCL already loaded. Its
//! structures as the header of API version 2 lays them out (each starts with its size and
//! a magic word; a library reads only the fields the size covers, so these work with any
//! 0.x library that has the fields unicomm fills: all of them are in the frozen V1
//! boundary but the group's `num_topk`, which a V1 library ignores).
//!
//! Found as NVIDIA's wheel installs it (`site-packages/nccl/ep/lib/cu12` or `cu13`, by the
//! driver's CUDA major) or where `UNICOMM_NCCL_EP_LIBRARY` names it. Its kernels are
//! compiled at run time by its own JIT (nvcc from `CUDA_HOME`, its device headers from
//! `NCCL_EP_HOME`, NCCL's from `NCCL_HOME`): docs/engines.md says what a run needs.

mod abi;
mod calls;
mod library;

pub use abi::*;
pub use calls::{EpGroup, EpSpec};
pub use library::{check_nccl, check_version, jit_home, search, version_of_code, EpLibrary};

#[cfg(test)]
mod tests;
