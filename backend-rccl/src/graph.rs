//! HIP graphs: stream capture in thread-local mode, instantiation and launch through the
//! loaded table, and the executable graph destroyed on drop.

#![allow(
    unsafe_code,
    reason = "the HIP runtime's graph calls through its loaded table"
)]

use unicomm_core::{Error, Result};

use crate::sys::{HipError, HipGraphT, HipGraphs, HipStream, HIP_STREAM_CAPTURE_MODE_THREAD_LOCAL};

/// The runtime's result check: a HIP error code into unicomm's error, naming the call.
pub(crate) type Check<'a> = &'a dyn Fn(&'static str, HipError) -> Result<()>;

/// An instantiated HIP graph (`hipGraphExec_t`), destroyed on drop. The runtime's library
/// stays loaded while it lives (the graph's owner, nccl-api's `ApiGraph`, holds the runtime
/// and drops the graph first).
pub struct HipGraph {
    exec: HipGraphT,
    destroy: unsafe extern "C" fn(HipGraphT) -> i32,
}

impl std::fmt::Debug for HipGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HipGraph")
    }
}

// SAFETY: a hipGraphExec_t is a runtime handle usable from any thread; HIP orders each
// launch behind the previous launches of the same executable graph.
unsafe impl Send for HipGraph {}
// SAFETY: as above; `&HipGraph` only launches.
unsafe impl Sync for HipGraph {}

impl Drop for HipGraph {
    fn drop(&mut self) {
        // SAFETY: the handle came from hipGraphInstantiateWithFlags and is destroyed once;
        // a failure at exit leaves nothing to release.
        let _ = unsafe { (self.destroy)(self.exec) };
    }
}

/// The graph calls of a runtime at `path`, or `Unsupported` naming them.
pub(crate) fn table(graphs: Option<HipGraphs>, path: &str) -> Result<HipGraphs> {
    graphs.ok_or_else(|| {
        Error::unsupported(
            "graph capture",
            "hipStreamBeginCapture, hipStreamEndCapture, hipGraphInstantiateWithFlags and hipGraphLaunch",
            format!("libamdhip64 at {path} without them"),
        )
    })
}

/// Starts capturing `s` (this thread's work on it is recorded).
pub(crate) fn begin(g: &HipGraphs, check: Check<'_>, s: HipStream) -> Result<()> {
    // SAFETY: a live stream of this runtime.
    let code = unsafe { (g.stream_begin_capture)(s, HIP_STREAM_CAPTURE_MODE_THREAD_LOCAL) };
    check("hipStreamBeginCapture", code)
}

/// Ends the capture of `s` and instantiates it; the template is destroyed.
pub(crate) fn end(g: &HipGraphs, check: Check<'_>, s: HipStream) -> Result<HipGraph> {
    let mut graph: HipGraphT = std::ptr::null_mut();
    // SAFETY: a live stream this thread captures; writes one handle.
    let code = unsafe { (g.stream_end_capture)(s, &mut graph) };
    check("hipStreamEndCapture", code)?;
    if graph.is_null() {
        return Err(Error::invalid(
            "stream",
            "the capture was invalidated (an operation illegal during capture ran on the stream)",
        ));
    }
    let mut exec: HipGraphT = std::ptr::null_mut();
    // SAFETY: `graph` is the capture's graph; writes one handle.
    let code = unsafe { (g.graph_instantiate_with_flags)(&mut exec, graph, 0) };
    // SAFETY: the template, no longer needed once instantiated (or if that failed).
    let _ = unsafe { (g.graph_destroy)(graph) };
    check("hipGraphInstantiateWithFlags", code)?;
    Ok(HipGraph {
        exec,
        destroy: g.graph_exec_destroy,
    })
}

/// One replay of `graph` on `s`.
pub(crate) fn launch(
    g: &HipGraphs,
    check: Check<'_>,
    graph: &HipGraph,
    s: HipStream,
) -> Result<()> {
    // SAFETY: an executable graph and a live stream of the same device.
    let code = unsafe { (g.graph_launch)(graph.exec, s) };
    check("hipGraphLaunch", code)
}
