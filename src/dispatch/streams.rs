//! [`AnyStream`] and [`AnyGraph`]: the backend traits of streams and graphs implemented by
//! matching, with the macros of the one table (`each!`, `pair!`).

use unicomm_core::{DeviceGraph, DeviceStream, Error, Marker, Result};

use super::{AnyGraph, AnyStream};

impl DeviceStream for AnyStream {
    fn synchronize(&self) -> Result<()> {
        each!(self, AnyStream, s => s.synchronize())
    }
    fn query(&self) -> Result<bool> {
        each!(self, AnyStream, s => s.query())
    }
    fn record(&self) -> Result<Marker> {
        each!(self, AnyStream, s => s.record())
    }
    fn wait(&self, marker: &Marker) -> Result<()> {
        each!(self, AnyStream, s => s.wait(marker))
    }
    fn launch_marker(&self) -> Result<Marker> {
        each!(self, AnyStream, s => s.launch_marker())
    }
    fn launch_host_fn(&self, f: Box<dyn FnOnce() + Send + 'static>) -> Result<()> {
        each!(self, AnyStream, s => s.launch_host_fn(f))
    }
    type Graph = AnyGraph;
    fn begin_capture(&self) -> Result<()> {
        each!(self, AnyStream, s => s.begin_capture())
    }
    fn end_capture(&self) -> Result<AnyGraph> {
        self.end_capture_any()
    }
    fn capturing(&self) -> Result<bool> {
        each!(self, AnyStream, s => s.capturing())
    }
}

impl DeviceGraph for AnyGraph {
    type Stream = AnyStream;
    fn launch(&self, stream: &AnyStream) -> Result<()> {
        pair!(self, AnyGraph, stream, AnyStream, "stream", (g, s) => g.launch(s))
    }
}

impl AnyStream {
    /// Blocks until the work enqueued so far has finished; returns its first error.
    pub fn synchronize(&self) -> Result<()> {
        DeviceStream::synchronize(self)
    }
    /// Records a marker in stream order (see [`DeviceStream::record`]): for timing, or for
    /// another stream to [`wait`](AnyStream::wait) for.
    pub fn record(&self) -> Result<Marker> {
        DeviceStream::record(self)
    }
    /// Makes this stream's later work wait for `marker`, recorded on another stream of the
    /// same device (`cudaStreamWaitEvent`); the host does not block.
    pub fn wait(&self, marker: &Marker) -> Result<()> {
        DeviceStream::wait(self, marker)
    }
}
