//! The version each call needs (the floors are [`flavor`](crate::sys::flavor)'s), and the
//! constants of `nccl.h` the calls pass.

use std::ffi::c_int;

pub use crate::sys::flavor::{
    CONFIG_SINCE, DEVICE_COMM_SINCE, GROW_SINCE, ONE_SIDED_SINCE, P2P_SINCE, PARAMS_SINCE,
    PEER_POINTER_SINCE, PROPERTIES_SINCE, REVOKE_SINCE, SCALABLE_SINCE, SHRINK_SINCE, SPLIT_SINCE,
    SUSPEND_SINCE,
};

/// `NCCL_SPLIT_NOCOLOR`.
pub const NO_COLOR: c_int = -1;
/// `ncclScalarHostImmediate`: the scalar is read from host memory at creation.
pub(super) const SCALAR_HOST_IMMEDIATE: c_int = 1;
