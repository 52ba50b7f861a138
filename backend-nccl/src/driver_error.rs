//! A CUDA driver error as unicomm's [`Error::Device`], with the driver's name and message
//! for its code.

use cudarc::driver::DriverError;
use unicomm_core::Error;

/// `e`, returned by `call`.
pub(crate) fn cuda_err(call: &'static str, e: DriverError) -> Error {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    let message = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    Error::Device {
        runtime: "CUDA",
        call,
        code: e.0 as i32,
        name,
        message,
    }
}

/// The refusal of stream memory operations where the driver lacks them.
pub(crate) fn no_mem_ops() -> Error {
    Error::unsupported(
        "stream memory operations",
        "a CUDA driver exporting cuStreamWaitValue32_v2 and cuStreamWriteValue32_v2 (11.7+)",
        "a driver without them",
    )
}
