//! The device runtime a NCCL-API backend needs: CUDA (cudarc) for NCCL, HIP (our own
//! table) for RCCL. Everything vendor-specific below the NCCL API goes through this trait.

#![allow(
    unsafe_code,
    reason = "calls the NCCL-API library or the device runtime at its call sites (the architecture test's UNSAFE_FILES lists them)"
)]

use unicomm_core::Result;

/// One vendor's device runtime.
pub trait Runtime: Send + Sync + Sized + 'static {
    /// "CUDA" or "HIP" (in error messages).
    const NAME: &'static str;
    /// "CUDA" or "ROCm" (in `NoDevice`).
    const VENDOR: &'static str;
    /// An owned stream.
    type Stream: Send + Sync + std::fmt::Debug;

    /// Number of visible devices (`NoDevice` when the driver sees none).
    fn device_count(&self) -> Result<usize>;
    /// Runs `f` with `dev` current on this thread, restoring the previous device after.
    fn with_device<T>(&self, dev: usize, f: impl FnOnce() -> Result<T>) -> Result<T>;
    /// A new stream on `dev`.
    fn create_stream(&self, dev: usize) -> Result<Self::Stream>;
    /// The raw handle (`cudaStream_t` / `hipStream_t`).
    fn raw_stream(s: &Self::Stream) -> *mut std::ffi::c_void;
    /// Blocks until the stream is idle (unicomm calls it once `query` said so: it returns
    /// the stream's error, if any, and never waits long).
    fn synchronize(&self, s: &Self::Stream) -> Result<()>;
    /// Whether all work enqueued on `s` has finished (`cuStreamQuery` / `hipStreamQuery`:
    /// not-ready is `false`, any other failure an error); never blocks.
    fn query(&self, s: &Self::Stream) -> Result<bool>;
    /// Blocks until every stream of device `dev` is idle (`cuCtxSynchronize` /
    /// `hipDeviceSynchronize`): what an owned allocation's free waits for first, since
    /// unmapping virtual memory (`ncclMemFree`'s `cuMemUnmap`) does not wait for the work
    /// that still writes it.
    fn synchronize_device(&self, dev: usize) -> Result<()>;
    /// Device memory without the collective library (`cuMemAlloc` / `hipMalloc`).
    fn malloc(&self, dev: usize, bytes: usize) -> Result<usize>;
    /// Frees what `malloc` returned.
    ///
    /// # Safety
    /// `ptr` came from `malloc` on `dev` and no pending work uses it.
    unsafe fn free(&self, dev: usize, ptr: usize) -> Result<()>;
    /// Copies host bytes to device memory, ordered on `s`; returns when `src` was consumed.
    ///
    /// # Safety
    /// `dst` is device memory of `dev` with `src.len()` writable bytes.
    unsafe fn htod(&self, dev: usize, dst: usize, src: &[u8], s: &Self::Stream) -> Result<()>;
    /// Copies device bytes to the host after the work on `s`; returns when `dst` holds them.
    ///
    /// # Safety
    /// `src` is device memory of `dev` with `dst.len()` readable bytes.
    unsafe fn dtoh(&self, dev: usize, dst: &mut [u8], src: usize, s: &Self::Stream) -> Result<()>;
    /// One line about the driver and runtime (versions), for `doctor` and errors.
    fn describe(&self) -> String;
    /// Device `dev`'s name and PCI bus id (`0000:1b:00`), where the runtime reports them.
    fn device_info(&self, dev: usize) -> Result<(String, Option<String>)> {
        let _ = dev;
        Err(unicomm_core::Error::unsupported(
            "device information",
            "a runtime that reports device names",
            Self::NAME,
        ))
    }

    /// `(free, total)` bytes of device `dev`'s memory (`cuMemGetInfo` / `hipMemGetInfo`).
    fn mem_info(&self, dev: usize) -> Result<(usize, usize)>;

    /// CUDA's compute capability of device `dev` (`(9, 0)` for sm90), where the runtime has
    /// one and could read it; `None` otherwise (what depends on it is then not refused
    /// early: the library decides).
    fn compute_capability(&self, _dev: usize) -> Option<(u32, u32)> {
        None
    }

    /// A timing event (`cudaEvent_t` / `hipEvent_t`), destroyed on drop.
    type Event: Send + Sync + 'static;
    /// Records a timing event on `s` (`cuEventRecord` / `hipEventRecord`).
    fn record(&self, s: &Self::Stream) -> Result<Self::Event>;
    /// Records `e` again on `s`, in place (`cuEventRecord` / `hipEventRecord` on the existing
    /// event): what a per-call marker costs without creating an event per call. Waits
    /// already enqueued on `e` keep the recording they saw.
    fn record_again(&self, e: &mut Self::Event, s: &Self::Stream) -> Result<()> {
        *e = self.record(s)?;
        Ok(())
    }
    /// An event not yet recorded, without timing, for a call's launch completion (NCCL
    /// 2.32's `launchCompletionEvent`; CUDA takes only events created with
    /// `CU_EVENT_DISABLE_TIMING`), with its handle as an address (what `ncclCollConfig_t`
    /// carries), valid while the event lives. `Unsupported` where the runtime's library has
    /// no per-call options (HIP: RCCL has no `ncclCollConfig_t`).
    fn launch_event(&self, dev: usize) -> Result<(Self::Event, usize)> {
        let _ = dev;
        Err(unicomm_core::Error::unsupported(
            "a launch marker",
            "NCCL >= 2.32 on CUDA (ncclCollConfig_t's launchCompletionEvent)",
            Self::NAME,
        ))
    }
    /// Makes `s` wait, on the device, for the work recorded in `e` (`cuStreamWaitEvent`);
    /// the host does not wait.
    fn wait_event(&self, dev: usize, s: &Self::Stream, e: &Self::Event) -> Result<()>;
    /// Milliseconds from `a` to `b`, waiting for both (`cuEventElapsedTime`).
    fn elapsed_ms(&self, a: &Self::Event, b: &Self::Event) -> Result<f64>;
    /// Whether `e` was reached, without waiting (`cuEventQuery` / `hipEventQuery`); `None`
    /// where the runtime cannot tell.
    fn event_done(&self, e: &Self::Event) -> Option<bool> {
        let _ = e;
        None
    }

    /// Lets device `dev` read and write device `peer`'s memory directly (`cuCtxEnablePeerAccess`
    /// / `hipDeviceEnablePeerAccess`); already enabled is success. An error when the two
    /// devices cannot reach each other.
    fn enable_peer_access(&self, dev: usize, peer: usize) -> Result<()>;
    /// Copies `bytes` from device address `src` to device address `dst`, ordered on `s`
    /// (`cuMemcpyDtoDAsync`): with unified addressing and peer access the two may be on
    /// different devices, and the copy engines move the bytes (no SMs).
    ///
    /// # Safety
    /// `src..src+bytes` is readable and `dst..dst+bytes` writable device memory, reachable
    /// from `dev`, until the copy completes.
    unsafe fn copy_async(
        &self,
        dev: usize,
        dst: usize,
        src: usize,
        bytes: usize,
        s: &Self::Stream,
    ) -> Result<()>;

    /// Runs `f` on a host thread in stream order on `s` (`cuLaunchHostFunc` /
    /// `hipLaunchHostFunc`). A runtime without the call refuses it, naming it.
    fn launch_host_fn(
        &self,
        dev: usize,
        s: &Self::Stream,
        f: Box<dyn FnOnce() + Send + 'static>,
    ) -> Result<()> {
        let _ = (dev, s, f);
        Err(unicomm_core::Error::unsupported(
            "a host function on a stream",
            format!("{}'s host function launch", Self::NAME),
            "a runtime without it",
        ))
    }

    /// Whether this runtime captures and launches graphs ([`Runtime::begin_capture`]): it
    /// has the calls.
    fn has_graphs(&self) -> bool {
        false
    }
    /// A new stream on `dev` of `priority` (`cuStreamCreateWithPriority` /
    /// `hipStreamCreateWithPriority` at the device's greatest priority for `High`). A
    /// runtime without priorities refuses, naming the call.
    fn create_stream_with(
        &self,
        dev: usize,
        priority: unicomm_core::StreamPriority,
    ) -> Result<Self::Stream> {
        match priority {
            unicomm_core::StreamPriority::Normal => self.create_stream(dev),
            p => Err(unicomm_core::Error::unsupported(
                "stream priorities",
                format!("{}'s prioritised streams", Self::NAME),
                format!("a runtime without them ({p:?} asked for)"),
            )),
        }
    }

    /// An instantiated graph (`CUgraphExec` / `hipGraphExec_t`), destroyed on drop.
    type Graph: Send + Sync + 'static;
    /// Starts capturing `s` in thread-local mode (`cuStreamBeginCapture` /
    /// `hipStreamBeginCapture`): what this thread enqueues on it is recorded, not run.
    fn begin_capture(&self, dev: usize, s: &Self::Stream) -> Result<()> {
        let _ = (dev, s);
        Err(no_graphs::<Self>())
    }
    /// Ends the capture of `s` and instantiates the graph (`cuStreamEndCapture`,
    /// `cuGraphInstantiate`; the captured template is destroyed once instantiated).
    fn end_capture(&self, dev: usize, s: &Self::Stream) -> Result<Self::Graph> {
        let _ = (dev, s);
        Err(no_graphs::<Self>())
    }
    /// Launches one replay of `g` on `s` (`cuGraphLaunch` / `hipGraphLaunch`).
    fn launch_graph(&self, dev: usize, g: &Self::Graph, s: &Self::Stream) -> Result<()> {
        let _ = (dev, g, s);
        Err(no_graphs::<Self>())
    }
    /// Whether streams of `dev` can wait on and write 32-bit words in device memory
    /// (`cuStreamWaitValue32` / `hipStreamWaitValue32` and the writes): what orders the
    /// copy-engine path between ranks without a kernel (`signals.rs`). `false` where the
    /// runtime lacks the calls; the path then orders itself with NCCL barriers.
    fn stream_memory_ops(&self, dev: usize) -> bool {
        let _ = dev;
        false
    }
    /// Enqueues on `s` a wait until the 32-bit word at `addr` equals `value`
    /// (`cuStreamWaitValue32(.., CU_STREAM_WAIT_VALUE_EQ)`): the work after it on `s` starts
    /// once the word holds `value`; no SM spins, the host does not wait.
    ///
    /// # Safety
    /// `addr` is a 4-byte aligned word of device memory reachable from `dev` that stays
    /// allocated until the wait has completed.
    unsafe fn wait_value32(
        &self,
        dev: usize,
        addr: usize,
        value: u32,
        s: &Self::Stream,
    ) -> Result<()> {
        let _ = (dev, addr, value, s);
        Err(no_mem_ops(Self::NAME))
    }
    /// Enqueues on `s` a write of `value` into the 32-bit word at `addr`, after the work
    /// before it on `s` (`cuStreamWriteValue32`, default flags: with a memory barrier).
    ///
    /// # Safety
    /// As [`Runtime::wait_value32`], and nothing else reads the word as anything but a flag.
    unsafe fn write_value32(
        &self,
        dev: usize,
        addr: usize,
        value: u32,
        s: &Self::Stream,
    ) -> Result<()> {
        let _ = (dev, addr, value, s);
        Err(no_mem_ops(Self::NAME))
    }
    /// Whether the copy-engine path signals a peer with a stream write into the peer's flag
    /// (`cuStreamWriteValue32` on peer or imported memory) rather than a 4-byte copy of a
    /// constant: the write runs on the stream's front end and costs less than a copy-engine
    /// copy. `false` (copies) where the runtime does not document writes into a peer's
    /// memory.
    fn signal_by_write(&self, dev: usize) -> bool {
        let _ = dev;
        false
    }
    /// Whether `s` is being captured into a graph (`cuStreamIsCapturing`): events recorded
    /// during a capture are graph nodes, not something the host can wait for later.
    fn capturing(&self, s: &Self::Stream) -> Result<bool> {
        let _ = s;
        Ok(false)
    }

    /// Host memory the device reads and writes (`cuMemHostAlloc` with
    /// `CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE`), zeroed, at one address for
    /// the host and the device (unified addressing): the control block unicomm's kernels
    /// watch. `Unsupported` where the runtime has no symmetric kernels.
    fn alloc_host_mapped(&self, dev: usize, bytes: usize) -> Result<usize> {
        let _ = (dev, bytes);
        Err(no_kernels(Self::NAME))
    }
    /// The driver's CUDA (or HIP) version as `cuDriverGetVersion` numbers it (`12080` is
    /// 12.8), where the runtime knows it: which build of a library made per CUDA major
    /// (NCCL EP's `cu12`, `cu13`) to load.
    fn driver_version(&self) -> Option<u32> {
        None
    }
    /// Whether this runtime loads and launches unicomm's kernels ([`Runtime::launch`],
    /// [`Runtime::alloc_host_mapped`]): what a communicator's capabilities say before any
    /// memory is made.
    fn has_kernels(&self) -> bool {
        false
    }
    /// Frees what `alloc_host_mapped` returned.
    ///
    /// # Safety
    /// `addr` came from `alloc_host_mapped`, is freed once, and no device work uses it.
    unsafe fn free_host_mapped(&self, addr: usize) -> Result<()> {
        let _ = addr;
        Err(no_kernels(Self::NAME))
    }
    /// Launches one of unicomm's kernels of `dtype` (f32, f16, bf16) on `s`: `launch` says
    /// which, with its arguments (the module loaded on `dev` at first use). The one launch
    /// call of every kernel. `Unsupported` where the runtime has no build of it.
    ///
    /// # Safety
    /// The symmetric kernels: every address in the parameters is device memory reachable
    /// from `dev` (or the mapped control block), inside its allocation for the sizes they
    /// give, live until the kernel completes; the pads and workspaces follow comm-core's
    /// layout. The device-API kernel: `dev_comm` is a live device communicator's struct as
    /// the library filled it, of at least the kernel's layout's size, with at least `blocks`
    /// LSA barriers; the windows in its arguments are live windows of its communicator,
    /// holding `count` elements past their offsets, until the kernel completes.
    unsafe fn launch(
        &self,
        dev: usize,
        dtype: unicomm_core::DataType,
        launch: super::kernel_args::Launch<'_>,
        s: &Self::Stream,
    ) -> Result<()> {
        let _ = (dev, dtype, launch, s);
        Err(no_kernels(Self::NAME))
    }

    /// Exports the device allocation holding `addr` for another process (the copy-engine
    /// path with one rank per process): a POSIX file descriptor of the allocation's
    /// physical memory (`cuMemRetainAllocationHandle` + `cuMemExportToShareableHandle`, or
    /// HIP's), with the allocation's base address and size. `Unsupported` where the memory
    /// cannot be exported (not cuMem/VMM memory, a runtime without the calls).
    fn export_memory(&self, dev: usize, addr: usize) -> Result<Exported> {
        let _ = (dev, addr);
        Err(unicomm_core::Error::unsupported(
            "exporting device memory to another process",
            "a runtime with virtual memory management (cuMem / hipMem)",
            Self::NAME,
        ))
    }
    /// Maps memory another process exported (`export_memory`'s descriptor and size) into
    /// this process, readable and writable from device `dev`; returns its address here.
    /// The mapping keeps the memory alive until [`Runtime::unmap_imported`], whatever its
    /// owner does meanwhile.
    fn import_memory(
        &self,
        dev: usize,
        fd: std::os::fd::BorrowedFd<'_>,
        size: usize,
    ) -> Result<usize> {
        let _ = (dev, fd, size);
        Err(unicomm_core::Error::unsupported(
            "importing another process's device memory",
            "a runtime with virtual memory management (cuMem / hipMem)",
            Self::NAME,
        ))
    }
    /// Unmaps what `import_memory` returned.
    ///
    /// # Safety
    /// `addr`/`size` came from `import_memory` on `dev`, are unmapped once, and no pending
    /// device work uses them.
    unsafe fn unmap_imported(&self, dev: usize, addr: usize, size: usize) -> Result<()> {
        let _ = (dev, addr, size);
        Ok(())
    }
}

fn no_kernels(runtime: &'static str) -> unicomm_core::Error {
    unicomm_core::Error::unsupported(
        "unicomm's symmetric kernels",
        "CUDA on sm_90 or newer (the kernels' PTX, backend-nccl/kernels)",
        format!("{runtime}: no build of them for this runtime"),
    )
}

fn no_mem_ops(runtime: &'static str) -> unicomm_core::Error {
    unicomm_core::Error::unsupported(
        "stream memory operations",
        "a runtime with cuStreamWaitValue32 / hipStreamWaitValue32 and the writes",
        runtime,
    )
}

/// Device memory exported by [`Runtime::export_memory`].
#[derive(Debug)]
pub struct Exported {
    /// The shareable handle (a POSIX file descriptor), closed on drop.
    pub fd: std::os::fd::OwnedFd,
    /// The allocation's base address in the exporting process.
    pub base: usize,
    /// The allocation's size in bytes (what the importer maps).
    pub size: usize,
}

/// Gives `f` to a host function launch (`cuLaunchHostFunc`, `hipLaunchHostFunc`): `launch`
/// makes the library call with the callback and its argument; if it fails, the library
/// never took the argument and the closure is freed here. What every runtime's
/// [`Runtime::launch_host_fn`] is made of.
pub fn launch_host_fn_with(
    f: Box<dyn FnOnce() + Send + 'static>,
    launch: impl FnOnce(
        unsafe extern "C" fn(*mut std::ffi::c_void),
        *mut std::ffi::c_void,
    ) -> Result<()>,
) -> Result<()> {
    let arg = Box::into_raw(Box::new(f)).cast::<std::ffi::c_void>();
    let r = launch(run_host_fn, arg);
    if r.is_err() {
        // SAFETY: the launch failed, so the library never took `arg`: the box is still ours,
        // freed once here.
        drop(unsafe { Box::from_raw(arg.cast::<Box<dyn FnOnce() + Send>>()) });
    }
    r
}

/// The library's callback of a host function: runs the boxed closure once; a panic stops
/// here (it must not unwind into the driver).
///
/// # Safety
/// `arg` is the box [`launch_host_fn_with`] gave to a successful launch, passed here once.
unsafe extern "C" fn run_host_fn(arg: *mut std::ffi::c_void) {
    // SAFETY: the caller's contract: the box leaked for this one call.
    let f = unsafe { Box::from_raw(arg.cast::<Box<dyn FnOnce() + Send>>()) };
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        tracing::error!("a host function enqueued on a stream panicked");
    }
}

#[cold]
fn no_graphs<R: Runtime>() -> unicomm_core::Error {
    unicomm_core::Error::unsupported(
        "graph capture",
        format!("{}'s stream capture and graph launch", R::NAME),
        "a runtime without them",
    )
}
