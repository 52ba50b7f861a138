//! CUDA graphs: stream capture in thread-local mode, instantiation and launch through
//! cudarc's result layer, and the executable graph destroyed on drop.

#![allow(
    unsafe_code,
    reason = "the CUDA driver's graph calls through cudarc's result layer"
)]

use cudarc::driver::{result, sys};

use unicomm_core::{Error, Result};

use crate::driver_error::cuda_err;

/// An instantiated CUDA graph (`CUgraphExec`), destroyed on drop.
#[derive(Debug)]
pub struct CudaGraph {
    exec: sys::CUgraphExec,
}

// SAFETY: a CUgraphExec is a driver handle usable from any thread; the driver orders each
// launch behind the previous launches of the same executable graph (cuGraphLaunch), so
// launches from several threads do not race.
unsafe impl Send for CudaGraph {}
// SAFETY: as above; `&CudaGraph` only launches.
unsafe impl Sync for CudaGraph {}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: the handle came from cuGraphInstantiate and is destroyed once, here; a
        // launch still running completes first (the driver defers the release).
        // A failure (a context already torn down at exit) leaves nothing to release.
        let _ = unsafe { result::graph::exec_destroy(self.exec) };
    }
}

/// Starts capturing `s`: this thread's work on it is recorded until [`end`]. Thread-local
/// mode: another thread's `cudaMalloc` (another rank of this process) stays legal, this
/// thread's is refused by the driver.
pub(crate) fn begin(s: sys::CUstream) -> Result<()> {
    // SAFETY: a live stream of this runtime (the caller's).
    unsafe {
        result::stream::begin_capture(
            s,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
    }
    .map_err(|e| cuda_err("cuStreamBeginCapture", e))
}

/// Ends the capture of `s` and instantiates what it recorded; the template graph is
/// destroyed once instantiated (the executable graph stands alone).
pub(crate) fn end(s: sys::CUstream) -> Result<CudaGraph> {
    // SAFETY: a live stream of this runtime that this thread is capturing.
    let graph =
        unsafe { result::stream::end_capture(s) }.map_err(|e| cuda_err("cuStreamEndCapture", e))?;
    if graph.is_null() {
        return Err(Error::invalid(
            "stream",
            "the capture was invalidated (an operation illegal during capture ran on the stream)",
        ));
    }
    // SAFETY: `graph` is the valid graph the capture returned.
    let exec = unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) };
    // SAFETY: the template, no longer needed once instantiated (or if that failed).
    let _ = unsafe { result::graph::destroy(graph) };
    let exec = exec.map_err(|e| cuda_err("cuGraphInstantiate", e))?;
    Ok(CudaGraph { exec })
}

/// One replay of `g` on `s`.
pub(crate) fn launch(g: &CudaGraph, s: sys::CUstream) -> Result<()> {
    // SAFETY: an executable graph and a live stream of the same context.
    unsafe { result::graph::launch(g.exec, s) }.map_err(|e| cuda_err("cuGraphLaunch", e))
}
