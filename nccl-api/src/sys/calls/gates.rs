//! The version each call needs, and the constants of `nccl.h` the calls pass.

use std::ffi::c_int;

use unicomm_core::Version;

/// `ncclCommSplit` exists from NCCL 2.18.
pub const SPLIT_SINCE: Version = Version::new(2, 18, 0);
/// `ncclCommShrink` exists from NCCL 2.27.
pub const SHRINK_SINCE: Version = Version::new(2, 27, 0);
/// `ncclCommRevoke` exists from NCCL 2.28.7.
pub const REVOKE_SINCE: Version = Version::new(2, 28, 7);
/// `ncclCommInitRankConfig` exists from NCCL 2.14.
pub const CONFIG_SINCE: Version = Version::new(2, 14, 0);
/// `ncclSend`/`ncclRecv` exist from NCCL 2.7.
pub const P2P_SINCE: Version = Version::new(2, 7, 0);
/// `NCCL_SPLIT_NOCOLOR`.
pub const NO_COLOR: c_int = -1;
/// `ncclScalarHostImmediate`: the scalar is read from host memory at creation.
pub(super) const SCALAR_HOST_IMMEDIATE: c_int = 1;
