//! Programmatic dependent launch (Hopper and newer, CUDA 12.3's driver in graphs): a kernel
//! launched with `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION` may be scheduled
//! while the kernel before it on the stream still runs, once that one's blocks have all
//! executed `griddepcontrol.launch_dependents`; its own `griddepcontrol.wait` then holds it
//! until that grid has finished and its memory is visible. unicomm's symmetric kernels wait
//! first and trigger at once, so back-to-back launches overlap their start with the previous
//! kernel's end (TensorRT-LLM's and FlashInfer's all-reduce kernels do the same).
//! Off until a GPU run has measured it and seen it captured into graphs on the drivers engines
//! run: `UNICOMM_KERNEL_PDL=1` turns it on (the kernels' `griddepcontrol` instructions do
//! nothing in a plain launch).

#![allow(unsafe_code, reason = "the CUDA driver's cuLaunchKernelEx")]

use std::ffi::c_void;
use std::sync::OnceLock;

use cudarc::driver::{sys, DriverError};

/// Whether unicomm's kernels that wait for the grid before them are launched as its
/// programmatic dependents (`UNICOMM_KERNEL_PDL=1`; read once).
pub(crate) fn dependent_launch() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("UNICOMM_KERNEL_PDL").is_ok_and(|v| v.trim() == "1"))
}

/// Launches `f` on `blocks` blocks of `threads` threads as a programmatic dependent of the
/// work before it on `stream`.
///
/// # Safety
/// `f` is a live function whose first instruction that touches memory is
/// `griddepcontrol.wait`; `args` are its parameters in order and layout; `stream` is a live
/// stream of the context `f` was loaded in.
pub(crate) unsafe fn launch_dependent(
    f: sys::CUfunction,
    blocks: u32,
    threads: u32,
    stream: sys::CUstream,
    args: &mut [*mut c_void],
) -> Result<(), DriverError> {
    // SAFETY: a zeroed attribute is a valid C value (plain integers and a union of them).
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: blocks,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: `config` and `attr` outlive the call (the driver copies them); the caller's
    // contract covers `f`, `args` and `stream`.
    unsafe { sys::cuLaunchKernelEx(&config, f, args.as_mut_ptr(), std::ptr::null_mut()) }.result()
}
