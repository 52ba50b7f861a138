//! The backend contract: what every backend (mock, NCCL, RCCL) implements.
//!
//! This layer is untyped (bytes, [`DataType`](crate::DataType)) and trusts nothing: the typed, safe API in
//! [`crate::comm`] validates arguments first, but a backend still checks what would be
//! unsound for it to get wrong (bounds of host memory on the mock, unknown handles).

use crate::work::Work;
use crate::{CommConfig, Result};

pub use crate::device::{DeviceGraph, DeviceMemory, DeviceStream, StreamPriority};
pub use crate::marker::{Marker, MarkerTime};

pub use crate::info::{Capabilities, DeviceInfo, Version};

pub use crate::registry::RawHandle;

use crate::device_api::DEVICE_API_NEEDS;

/// The communicator of one rank, as a backend implements it.
///
/// Users reach it through [`crate::Comm`], which adds element types and ownership. A
/// backend implements the required methods; every stream-ordered operation reaches it as
/// one [`Work`] through [`Collective::enqueue`], the one door into a backend
/// ([`crate::Comm`] builds it), so where a call goes, and its one flight record, are decided
/// in one place per backend.
///
/// Ordering: every `enqueue` and every memory copy runs after the work enqueued before it
/// on the same stream. Errors of the work itself surface at the next `synchronize` of that
/// stream (or at a blocking read), as on real hardware. Every method checks what would be
/// unsound for the backend to get wrong ([`crate::Op::check`]); the typed layer checks the rest
/// first.
pub trait Collective: Send + Sync + Sized + 'static {
    /// The backend's stream.
    type Stream: DeviceStream;
    /// The backend's device allocation.
    type Memory: DeviceMemory<Stream = Self::Stream>;

    /// This rank, `0..world_size`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// What the loaded library can do.
    fn capabilities(&self) -> Capabilities;

    /// A new stream on this rank's device.
    fn create_stream(&self) -> Result<Self::Stream>;
    /// A new stream on this rank's device with `priority`. Default: the normal priority is
    /// [`Collective::create_stream`], another is `Unsupported`.
    fn create_stream_with(&self, priority: StreamPriority) -> Result<Self::Stream> {
        match priority {
            StreamPriority::Normal => self.create_stream(),
            p => Err(crate::Error::unsupported(
                "stream priorities",
                "a backend with prioritised streams",
                format!("{} ({p:?} asked for)", self.capabilities().backend),
            )),
        }
    }
    /// Allocates `bytes` on this rank's device (through `ncclMemAlloc` where available).
    fn alloc(&self, bytes: usize) -> Result<Self::Memory>;
    /// Whether `mem` may be used by this communicator (same device).
    fn check_memory(&self, mem: &Self::Memory) -> Result<()>;

    /// `ncclCommRegister` over `bytes` bytes at `mem[offset..]`.
    fn register(&self, mem: &Self::Memory, offset: usize, bytes: usize) -> Result<RawHandle>;
    /// `ncclCommDeregister`. An unknown handle (twice, or another communicator's) is an
    /// `InvalidArgument` error; of two threads deregistering one handle at once, exactly
    /// one reaches the library.
    fn deregister(&self, handle: RawHandle) -> Result<()>;
    /// `ncclCommWindowRegister` (collective: every rank calls it, in the same order).
    fn register_window(&self, mem: &Self::Memory, offset: usize, bytes: usize)
        -> Result<RawHandle>;
    /// `ncclCommWindowDeregister` (collective, like registration).
    fn deregister_window(&self, handle: RawHandle) -> Result<()>;

    /// Enqueues one piece of work on `stream`: the one door of every stream-ordered
    /// operation (collectives, unicomm's symmetric kernels, one-sided calls, the device-API
    /// kernel), where the backend routes it and records it once in its flight recorder.
    /// Work the backend cannot run is `Unsupported` naming what it needs
    /// ([`Work::unsupported`]).
    fn enqueue(&self, work: Work<'_, Self::Memory>, stream: &Self::Stream) -> Result<()>;
    /// `ncclGroupStart`: operations until the matching `group_end` are launched together.
    /// Groups are per thread and span communicators of the same backend.
    fn group_start(&self) -> Result<()>;
    /// `ncclGroupEnd`.
    fn group_end(&self) -> Result<()>;

    /// `ncclCommSplit`: collective over this communicator. The ranks that pass the same
    /// `color` form one new communicator, ranked by `key` (ties by their rank here); a rank
    /// that passes `None` (`NCCL_SPLIT_NOCOLOR`) takes part and gets `None`. The child is a
    /// communicator of its own on the same device, with `config` (NCCL: a `None` field is
    /// the parent's setting where NCCL inherits it). Where the library lacks
    /// `ncclCommSplit`, the members create the child from a fresh unique id. Default:
    /// `Unsupported`.
    fn split(&self, color: Option<u32>, key: i32, config: &CommConfig) -> Result<Option<Self>> {
        let _ = (color, key, config);
        Err(crate::Error::unsupported(
            "splitting a communicator",
            "a backend with ncclCommSplit or a rendezvous",
            self.capabilities().backend,
        ))
    }

    /// A communicator of the ranks left after excluding `exclude` (sorted, checked, never
    /// this rank); see [`Comm::shrink`](crate::Comm::shrink). Default: `Unsupported`.
    fn shrink(
        &self,
        exclude: &[usize],
        mode: crate::shrink::ShrinkMode,
        config: &CommConfig,
    ) -> Result<Self> {
        let _ = (exclude, mode, config);
        Err(crate::Error::unsupported(
            "shrinking a communicator",
            "a backend with ncclCommShrink or a way for the survivors to meet",
            self.capabilities().backend,
        ))
    }

    /// `ncclCommRevoke` (NCCL >= 2.28.7): stops the operations in flight on this rank's
    /// communicator without destroying it, and returns once it is quiescent (bounded by its
    /// deadline); it can then be shrunk ([`ShrinkMode::Default`](crate::shrink::ShrinkMode)),
    /// finalized or aborted, and new collectives on it fail. Default: `Unsupported`.
    fn revoke(&self) -> Result<()> {
        Err(crate::Error::unsupported(
            "revoking a communicator",
            "ncclCommRevoke (NCCL >= 2.28.7)",
            self.capabilities().backend,
        ))
    }

    /// An id for growing this communicator's world (`ncclCommGetUniqueId`, NCCL >= 2.29.2),
    /// made on the rank that will pass it to [`Collective::grow`] and sent to the new
    /// ranks; one at a time, each used once (NCCL's rule). Default: `Unsupported`.
    fn grow_id(&self) -> Result<[u8; 128]> {
        Err(crate::Error::unsupported(
            "growing a communicator",
            "ncclCommGrow (NCCL >= 2.29.2)",
            self.capabilities().backend,
        ))
    }

    /// This rank's communicator in a world grown to `world` ranks (`ncclCommGrow`, NCCL >=
    /// 2.29.2), with the ranks it had and the new ones after them: `id` on the rank that made
    /// it, `None` on the others (see [`Comm::grow`](crate::Comm::grow)). Default:
    /// `Unsupported`.
    fn grow(&self, world: usize, id: Option<&[u8; 128]>, config: &CommConfig) -> Result<Self> {
        let _ = (world, id, config);
        Err(crate::Error::unsupported(
            "growing a communicator",
            "ncclCommGrow (NCCL >= 2.29.2)",
            self.capabilities().backend,
        ))
    }

    /// What the library says of this communicator (`ncclCommQueryProperties`, NCCL >=
    /// 2.29.2). Default: `Unsupported`.
    fn properties(&self) -> Result<crate::state::Properties> {
        Err(crate::Error::unsupported(
            "a communicator's properties",
            "ncclCommQueryProperties (NCCL >= 2.29.2)",
            self.capabilities().backend,
        ))
    }

    /// Frees the library's dynamic device memory of this communicator until
    /// [`Collective::resume`]; calls on it meanwhile are refused (`ncclCommSuspend`, NCCL >=
    /// 2.29.7). Default: `Unsupported`.
    fn suspend(&self) -> Result<()> {
        Err(crate::Error::unsupported(
            "suspending a communicator",
            "ncclCommSuspend (NCCL >= 2.29.7)",
            self.capabilities().backend,
        ))
    }

    /// Gets back what [`Collective::suspend`] freed (`ncclCommResume`). Default:
    /// `Unsupported`.
    fn resume(&self) -> Result<()> {
        Err(crate::Error::unsupported(
            "resuming a communicator",
            "ncclCommResume (NCCL >= 2.29.7)",
            self.capabilities().backend,
        ))
    }

    /// The device memory the library holds for this communicator (`ncclCommMemStats`,
    /// NCCL >= 2.29.7). Default: `Unsupported`.
    fn mem_stats(&self) -> Result<crate::state::MemStats> {
        Err(crate::Error::unsupported(
            "a communicator's memory statistics",
            "ncclCommMemStats (NCCL >= 2.29.7)",
            self.capabilities().backend,
        ))
    }

    /// Where `peer`'s part of the window `handle` lies for this rank's kernels (NCCL
    /// 2.29.2's `ncclGetPeerDevicePointer`): `None` where the peer is outside this rank's
    /// NVLink domain. Default: `Unsupported`.
    fn window_peer_address(&self, handle: RawHandle, peer: usize) -> Result<Option<usize>> {
        let _ = (handle, peer);
        Err(crate::Error::unsupported(
            "a window's peer addresses",
            "ncclGetPeerDevicePointer (NCCL >= 2.29.2)",
            self.capabilities().backend,
        ))
    }

    /// Creates a device communicator (collective and host-blocking, as NCCL's
    /// `ncclDevCommCreate`): the struct an engine's kernel takes by value, filled in the
    /// layout `reqs` names. Default: `Unsupported`.
    fn create_device_comm(
        &self,
        reqs: &crate::device_api::DeviceCommRequirements,
    ) -> Result<crate::device_api::DeviceCommParts> {
        let _ = reqs;
        Err(crate::Error::unsupported(
            "a device communicator",
            DEVICE_API_NEEDS,
            self.capabilities().backend,
        ))
    }

    /// Ends a device communicator (`ncclDevCommDestroy`; collective where it deregisters
    /// the library's resource window). An unknown handle is `InvalidArgument`. Default:
    /// `Unsupported`.
    fn destroy_device_comm(&self, handle: RawHandle) -> Result<()> {
        let _ = handle;
        Err(crate::Error::unsupported(
            "a device communicator",
            DEVICE_API_NEEDS,
            self.capabilities().backend,
        ))
    }

    /// Allocates `bytes` of symmetric memory on every rank (collective and host-blocking:
    /// every rank calls it with the same size, in the same order; sizes that differ are
    /// `Mismatch` on every rank), every rank's mapped on this rank, with a signal pad per
    /// rank, zeroed; with `lamport`, the Lamport all-reduce's workspace for that element
    /// type, filled with its poison. Default: `Unsupported`.
    fn alloc_symmetric(
        &self,
        bytes: usize,
        lamport: Option<crate::DataType>,
    ) -> Result<crate::symmetric::SymmetricParts<Self::Memory>> {
        let _ = (bytes, lamport);
        Err(crate::Error::unsupported(
            "symmetric memory",
            "a backend with unicomm's symmetric kernels (the mock)",
            self.capabilities().backend,
        ))
    }

    /// Releases this rank's view of a symmetric allocation: local, not waiting; the work
    /// still pending on it keeps what it uses. An unknown handle is `InvalidArgument`.
    /// Default: `Unsupported`.
    fn free_symmetric(&self, handle: RawHandle) -> Result<()> {
        let _ = handle;
        Err(crate::Error::unsupported(
            "symmetric memory",
            "a backend with unicomm's symmetric kernels (the mock)",
            self.capabilities().backend,
        ))
    }

    /// Opens an expert library's group for `group` (collective and host-blocking: every
    /// rank with the same capacities and engine, which are compared: `Mismatch` on every
    /// rank where they differ); its handle goes in the dispatches' and combines'
    /// [`ExpertGroupParts::recv`](crate::symmetric::ExpertGroupParts). Default:
    /// `Unsupported` naming the engine.
    fn open_expert_engine(&self, group: &crate::symmetric::ExpertGroupParts) -> Result<RawHandle> {
        Err(crate::Error::unsupported(
            format!("expert parallelism on {}", group.engine.name()),
            "NCCL 2.30.7 or newer with NCCL EP's library (libnccl_ep.so, NVIDIA's nccl-extensions)",
            self.capabilities().backend,
        ))
    }

    /// Releases an expert library's group ([`Collective::open_expert_engine`]): local, the
    /// library's teardown on a helper thread within the deadline. Default: nothing held.
    fn close_expert_engine(&self, handle: RawHandle) -> Result<()> {
        let _ = handle;
        Ok(())
    }

    /// A captured graph that uses this communicator is launched on `stream`: the stream's
    /// waits watch this communicator from now on (its deadline, its asynchronous errors),
    /// as they do after an eager call. Default: nothing to do.
    fn graph_launched(&self, stream: &Self::Stream) {
        let _ = stream;
    }

    /// A graph that captured this communicator's work now lives (the first of them): from
    /// now until [`Collective::graphs_released`], NCCL's and RCCL's abort does not return
    /// (it waits for the graphs' destruction), so a backend bounds that wait by a short
    /// grace instead of the whole deadline. Default: nothing to do.
    fn graphs_held(&self) {}

    /// The last live graph that captured this communicator's work was destroyed. A library
    /// teardown that waited for it may return now (NCCL's and RCCL's abort waits until every
    /// graph that captured the communicator's work is destroyed): the backend waits for it,
    /// at most the communicator's deadline, so that a process exiting next does not exit
    /// while the library tears the communicator down on another thread. Default: nothing
    /// to wait for.
    fn graphs_released(&self) {}

    /// This communicator's flight recorder ([`crate::flight`]), where the backend keeps one.
    fn flight(&self) -> Option<&std::sync::Arc<crate::flight::FlightRecorder>> {
        None
    }

    /// `ncclCommFinalize` + `ncclCommDestroy`: flushes pending work, then frees the
    /// communicator. After it, the communicator must not be used; dropping it is a no-op.
    fn finalize(&mut self) -> Result<()>;
    /// `ncclCommAbort`: frees the communicator without waiting for pending work. Callable
    /// from any thread while others use the communicator (that is what it is for: a rank
    /// that failed, or a watchdog, aborts so that peers stop waiting); every later call on
    /// it is an error.
    fn abort(&self) -> Result<()>;

    /// Registers `bytes` at `mem[offset..]` for the automatic policy: collective like a
    /// window; every later call whose buffers are so registered takes the path the policy
    /// picks for its collective and size. Default (a backend with one path): a window.
    fn register_auto(&self, mem: &Self::Memory, offset: usize, bytes: usize) -> Result<RawHandle> {
        self.register_window(mem, offset, bytes)
    }
    /// Ends an automatic registration (collective). Default: a window's deregistration.
    fn deregister_auto(&self, handle: RawHandle) -> Result<()> {
        self.deregister_window(handle)
    }
    /// The first asynchronous error of the communicator (`ncclCommGetAsyncError`): a
    /// failure of work already enqueued (a peer that died, a network error), which NCCL
    /// reports here and not at the call. `Ok` while nothing failed (work still running
    /// included). After an error the communicator cannot be used: abort it. Never blocks
    /// for long (it waits for a call of another thread on this communicator at most).
    /// Default: `Ok` (a backend whose errors all surface at the call or the wait).
    fn poll_async_error(&self) -> Result<()> {
        Ok(())
    }
    /// Sets the deadline of this rank's waits (stream synchronize, copies to and from the
    /// host; on the GPU backends also non-blocking calls still in progress), 1 ms..=1 day.
    /// At the deadline the wait aborts the communicator and returns `Timeout`. Default:
    /// `Unsupported`.
    fn set_timeout(&self, timeout: std::time::Duration) -> Result<()> {
        let _ = timeout;
        Err(crate::Error::unsupported(
            "setting the deadline of waits",
            "a backend with per-communicator deadlines",
            self.capabilities().backend,
        ))
    }
    /// The deadline of this rank's waits, where the backend has one per communicator.
    fn timeout(&self) -> Option<std::time::Duration> {
        None
    }
    /// Which device this rank drives (index, name, PCI bus id), as benchmarks report it.
    /// Default: `Unsupported`.
    fn device_info(&self) -> Result<DeviceInfo> {
        Err(crate::Error::unsupported(
            "device information",
            "a GPU backend",
            self.capabilities().backend,
        ))
    }
    /// Device memory `(free, total)` bytes of this rank's device, for measuring what a mode
    /// costs. Default: `Unsupported`.
    fn device_memory(&self) -> Result<(usize, usize)> {
        Err(crate::Error::unsupported(
            "device memory figures",
            "a GPU backend",
            self.capabilities().backend,
        ))
    }

    /// Turns the copy-engine path for all-to-all, all-to-all-v and all-gather on or off (see
    /// [`Capabilities::copy_engine`]); call it on every rank, before registering the windows
    /// the path writes into. Default: `Unsupported`.
    fn set_copy_engine(&self, on: bool) -> Result<()> {
        if !on {
            return Ok(());
        }
        Err(crate::Error::unsupported(
            "the copy-engine path",
            "a GPU backend with ranks in one process",
            self.capabilities().backend,
        ))
    }
}

/// `f` between the backend's `group_start` and `group_end`, the one bracket every group
/// uses ([`crate::Comm::group`], a backend's lowered collectives): the group is ended even
/// when `f` fails (its error first) or panics (a guard ends it while unwinding, so a caller
/// that catches the panic does not leave this thread's later calls deferred to a group
/// that never ends).
pub fn grouped<C: Collective, R>(c: &C, f: impl FnOnce() -> Result<R>) -> Result<R> {
    struct Open<'a, C: Collective>(&'a C);
    impl<C: Collective> Drop for Open<'_, C> {
        fn drop(&mut self) {
            // Reached only while unwinding (the normal path forgets the guard); the error
            // cannot be reported from here.
            let _ = self.0.group_end();
        }
    }
    c.group_start()?;
    let guard = Open(c);
    let r = f();
    std::mem::forget(guard);
    let end = c.group_end();
    let r = r?;
    end?;
    Ok(r)
}
