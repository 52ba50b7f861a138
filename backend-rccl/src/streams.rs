//! HIP's stream extras, each optional in the runtime: priorities (a stream of the current
//! device's greatest priority) and host functions in stream order.

#![allow(
    unsafe_code,
    reason = "the HIP runtime's stream calls through its loaded table"
)]

use std::ffi::{c_int, c_void};

use unicomm_core::{Error, Result};

use crate::graph::Check;
use crate::sys::{HipPriorities, HipStream, HIP_STREAM_NON_BLOCKING};

/// The priority calls of a runtime at `path`, or `Unsupported` naming them.
pub(crate) fn priorities(p: Option<HipPriorities>, path: &str) -> Result<HipPriorities> {
    p.ok_or_else(|| {
        Error::unsupported(
            "stream priorities",
            "hipDeviceGetStreamPriorityRange and hipStreamCreateWithPriority",
            format!("libamdhip64 at {path} without them"),
        )
    })
}

/// A new non-blocking stream of the current device at its greatest priority.
pub(crate) fn greatest(p: &HipPriorities, check: Check<'_>) -> Result<HipStream> {
    let (mut least, mut greatest): (c_int, c_int) = (0, 0);
    // SAFETY: writes two ints for the current device.
    let code = unsafe { (p.device_get_stream_priority_range)(&mut least, &mut greatest) };
    check("hipDeviceGetStreamPriorityRange", code)?;
    let mut s = std::ptr::null_mut();
    // SAFETY: writes one stream handle.
    let code =
        unsafe { (p.stream_create_with_priority)(&mut s, HIP_STREAM_NON_BLOCKING, greatest) };
    check("hipStreamCreateWithPriority", code)?;
    Ok(s)
}

/// `hipLaunchHostFunc`'s signature.
pub(crate) type HostFnCall =
    unsafe extern "C" fn(HipStream, unsafe extern "C" fn(*mut c_void), *mut c_void) -> i32;

/// `hipLaunchHostFunc` of a runtime at `path`, or `Unsupported` naming it.
pub(crate) fn host_fn_call(f: Option<HostFnCall>, path: &str) -> Result<HostFnCall> {
    f.ok_or_else(|| {
        Error::unsupported(
            "a host function",
            "hipLaunchHostFunc",
            format!("libamdhip64 at {path} without it"),
        )
    })
}

/// Enqueues `run(arg)` on `s` (the caller made its device current).
pub(crate) fn launch(
    call: HostFnCall,
    check: Check<'_>,
    s: HipStream,
    (run, arg): (unsafe extern "C" fn(*mut c_void), *mut c_void),
) -> Result<()> {
    // SAFETY: `run` takes back `arg` (given to HIP once) exactly once.
    let code = unsafe { call(s, run, arg) };
    check("hipLaunchHostFunc", code)
}
