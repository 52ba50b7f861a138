//! What a backend's device gives every communicator of a rank: streams (ordered queues of
//! device work) and memory. Below the backend contract, which enqueues on them.

use crate::marker::Marker;
use crate::Result;

/// The scheduling priority of a new stream ([`Comm::create_stream_with`](crate::Comm::create_stream_with)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum StreamPriority {
    /// The device's default priority (what [`Comm::create_stream`](crate::Comm::create_stream) gives).
    #[default]
    Normal,
    /// The device's greatest priority (`cuCtxGetStreamPriorityRange`'s greatest, as
    /// PyTorch's high-priority process-group streams): the GPU's scheduler starts this
    /// stream's pending blocks before lower-priority ones, so a small collective is not
    /// queued behind a long compute kernel's remaining blocks. No effect on the mock (its
    /// streams are threads); accepted there.
    High,
}

/// A stream: an ordered queue of device work.
pub trait DeviceStream: Send + Sync + Sized {
    /// A graph captured from this stream's work ([`DeviceStream::end_capture`]).
    type Graph: DeviceGraph<Stream = Self>;

    /// Blocks until all work enqueued so far has finished, and returns the first
    /// asynchronous error it raised.
    fn synchronize(&self) -> Result<()>;

    /// Whether the work enqueued so far has finished, without waiting (`cuStreamQuery`), or
    /// the failure that ended it: on the GPU backends a communicator's asynchronous error
    /// (its communicators are then aborted, as a wait does) or its abort while the work ran
    /// (the kernels end without completing), on the mock the stream's first error. The
    /// error stays for the next [`DeviceStream::synchronize`] where the backend keeps one.
    fn query(&self) -> Result<bool>;

    /// Records a [`Marker`] in stream order (`cudaEventRecord`): the point after the work
    /// enqueued so far. The time between two markers of one stream is device time, with no
    /// host synchronisation in between (how nccl-tests times back-to-back iterations).
    fn record(&self) -> Result<Marker>;

    /// Makes the work enqueued on this stream after this call wait until `marker` (recorded
    /// on another stream of the same device) was reached (`cudaStreamWaitEvent` /
    /// `hipStreamWaitEvent`): how a compute stream and a communication stream overlap
    /// without the host waiting. The host does not block.
    fn wait(&self, marker: &Marker) -> Result<()>;

    /// A marker for [`CallOptions::launch_marker`](crate::CallOptions::launch_marker),
    /// recorded by each collective that carries it when the collective has begun on the
    /// device (NCCL 2.32's `launchCompletionEvent`: CUDA's launch completion event, created
    /// without timing as CUDA requires), not when it ends. Until a collective recorded it,
    /// waiting on it returns at once (a CUDA event never recorded). Prefer
    /// [`LaunchMarker::new`](crate::call_options::LaunchMarker::new). `Unsupported` where
    /// the backend has none.
    fn launch_marker(&self) -> Result<Marker> {
        Err(crate::Error::unsupported(
            "a launch marker",
            "a backend whose collectives record one (NCCL >= 2.32, the mock)",
            "this backend",
        ))
    }

    /// Runs `f` on a host thread once the work enqueued so far has finished, before the
    /// work enqueued after it (`cuLaunchHostFunc` / `hipLaunchHostFunc`; a job of the mock's
    /// stream): an engine's own host step in stream order. `f` must not call the device
    /// runtime nor wait on a stream (CUDA's rule for host functions: it would deadlock). A
    /// panic in `f` does not unwind into the driver: on the mock it becomes the stream's
    /// error, on the GPUs it is caught and reported through `tracing`.
    fn launch_host_fn(&self, f: Box<dyn FnOnce() + Send + 'static>) -> Result<()>;

    /// Starts capturing: the work enqueued on this stream from now on, by this thread, is
    /// recorded into a graph instead of run (`cuStreamBeginCapture` in thread-local mode /
    /// `hipStreamBeginCapture`; the mock records its jobs). Users capture through
    /// [`crate::graph::Graph::capture`], which ties the graph to what it uses.
    fn begin_capture(&self) -> Result<()>;

    /// Ends the capture begun by [`DeviceStream::begin_capture`] and returns the graph,
    /// ready to launch (instantiated).
    fn end_capture(&self) -> Result<Self::Graph>;

    /// Whether this stream is capturing now (`cuStreamIsCapturing`).
    fn capturing(&self) -> Result<bool>;
}

/// A captured graph of device work, instantiated: launched on a stream, it runs what the
/// capture recorded, in order, each time (`cuGraphLaunch` / `hipGraphLaunch`; the mock
/// replays its jobs). Destroyed on drop (a launch in flight completes first, as CUDA's
/// `cuGraphExecDestroy` lets it).
pub trait DeviceGraph: Send + Sync + 'static {
    /// The stream type it is launched on.
    type Stream;
    /// Enqueues one replay of the whole graph on `stream` (a stream of the device it was
    /// captured on); the host does not wait.
    fn launch(&self, stream: &Self::Stream) -> Result<()>;
}

impl std::fmt::Debug for Marker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Marker")
    }
}

/// One device allocation, owned; freed on drop.
pub trait DeviceMemory: Send + Sync {
    /// The stream type copies are enqueued on.
    type Stream: DeviceStream;

    /// Size in bytes.
    fn byte_len(&self) -> usize;

    /// The device address of the first byte (a host address on the mock).
    fn address(&self) -> usize;

    /// Whether dropping this value never frees the memory under work still using it (its
    /// free waits for, or follows, that work): `true` for the allocations a backend owns,
    /// `false` for memory lent by an owner that frees it on its own terms (a cudarc slice,
    /// a raw pointer). What lets a pending [`Completion`](crate::completion::Completion) be
    /// dropped without waiting.
    fn outlives_its_work(&self) -> bool;

    /// Copies `src` to `self[offset..offset + src.len()]`, ordered after the work enqueued
    /// on `stream`, and returns once `src` may be reused. The GPU backends return after the
    /// copy completed (so after the work before it on the stream: a host copy is a set-up
    /// step, not a hot path; docs/dev/decisions.md); the mock stages the bytes and returns.
    fn write(&self, offset: usize, src: &[u8], stream: &Self::Stream) -> Result<()>;

    /// Copies `self[offset..offset + dst.len()]` into `dst` after all work enqueued on
    /// `stream` so far; returns once `dst` holds the bytes.
    fn read(&self, offset: usize, dst: &mut [u8], stream: &Self::Stream) -> Result<()>;

    /// Copies `bytes` from `src[src_offset..]` to `self[offset..]` in stream order on
    /// `stream` (`cuMemcpyDtoDAsync` / `hipMemcpyAsync`, a job of the mock's stream); the
    /// host does not wait. Both are memory of the stream's rank, ranges checked.
    fn copy_from(
        &self,
        offset: usize,
        src: &Self,
        src_offset: usize,
        bytes: usize,
        stream: &Self::Stream,
    ) -> Result<()>;
}
