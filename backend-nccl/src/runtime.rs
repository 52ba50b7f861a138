//! The CUDA runtime through cudarc's driver API.
//!
//! cudarc is built however the program around unicomm builds it (`dynamic-loading`,
//! `fallback-dynamic-loading`, `dynamic-linking`: cargo unifies its features per binary, and
//! unicomm forces none of them, docs/cuda.md). Loaded at run time, cudarc panics where
//! libcuda is absent or lacks a symbol, so [`CudaRuntime::new`] first opens the driver
//! itself (`driver_library`) and returns `LibraryNotFound` instead, and optional entry points
//! are looked up there before any call.

#![allow(unsafe_code, reason = "the CUDA driver through cudarc's result layer")]

use std::sync::{Arc, OnceLock};

use cudarc::driver::{result, sys, CudaContext, CudaStream, DriverError};
use unicomm_core::{Error, Result, StreamPriority};
use unicomm_nccl_api::runtime::Exported;
use unicomm_nccl_api::Runtime;

use crate::driver_error::cuda_err;

/// The names the CUDA driver is opened by, in order (the system loader searches them).
const DRIVER_NAMES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

/// The CUDA driver library, opened once by unicomm itself (whatever way cudarc was built:
/// with `dynamic-linking` it is already mapped and this finds it), or `LibraryNotFound`
/// naming what was tried.
fn driver_library() -> Result<&'static libloading::Library> {
    static DRIVER: OnceLock<Option<libloading::Library>> = OnceLock::new();
    let lib = DRIVER.get_or_init(|| {
        DRIVER_NAMES.iter().find_map(|name| {
            // SAFETY: the CUDA driver's initialisers are safe to run on load (it is the
            // library every CUDA program loads).
            unsafe { libloading::Library::new(*name) }.ok()
        })
    });
    lib.as_ref().ok_or_else(|| Error::LibraryNotFound {
        library: "CUDA driver",
        tried: DRIVER_NAMES
            .iter()
            .map(|n| format!("{n} (system loader)"))
            .collect(),
    })
}

/// The CUDA driver, with one primary context per device (the one NCCL and the CUDA runtime
/// use).
pub struct CudaRuntime {
    /// Retained on first use; lock-free afterwards (this sits on every collective's path).
    contexts: Vec<OnceLock<Arc<CudaContext>>>,
    count: usize,
    /// The driver exports the stream memory operations (cudarc panics on a missing
    /// symbol, so they are looked up once, here, before any call).
    pub(crate) mem_ops: bool,
    /// unicomm's kernel modules this runtime loaded, by module and device: each one's
    /// functions (f32, f16, bf16, the empty kernel) and how many blocks of it the device holds at once, or
    /// why it could not be loaded (kept: a device that
    /// refuses a module once refuses it again). Loaded into primary contexts, which live as
    /// long as the process, and never unloaded (a kernel may still run at any drop).
    pub(crate) modules: std::sync::Mutex<ModuleTable>,
}

/// [`CudaRuntime::modules`]' table.
pub(crate) type ModuleTable =
    std::collections::BTreeMap<(&'static str, usize), Result<([usize; 4], u32)>>;

impl std::fmt::Debug for CudaRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaRuntime({} devices)", self.count)
    }
}

impl CudaRuntime {
    /// Loads the driver and counts devices: `LibraryNotFound` without libcuda, `NoDevice`
    /// when it sees no GPU.
    pub fn new() -> Result<Self> {
        let driver = driver_library()?;
        match result::init() {
            Ok(()) => {}
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE => {
                return Err(Error::NoDevice {
                    vendor: "CUDA",
                    detail: "the driver reports no device (cuInit: CUDA_ERROR_NO_DEVICE)".into(),
                })
            }
            Err(e) => return Err(cuda_err("cuInit", e)),
        }
        let count =
            result::device::get_count().map_err(|e| cuda_err("cuDeviceGetCount", e))? as usize;
        if count == 0 {
            return Err(Error::NoDevice {
                vendor: "CUDA",
                detail: "cuDeviceGetCount returned 0".into(),
            });
        }
        let mem_ops = ["cuStreamWaitValue32_v2\0", "cuStreamWriteValue32_v2\0"]
            .iter()
            .all(|name| {
                // SAFETY: looks a symbol up without calling it.
                unsafe { driver.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_ok()
            });
        Ok(CudaRuntime {
            contexts: (0..count).map(|_| OnceLock::new()).collect(),
            count,
            mem_ops,
            modules: Default::default(),
        })
    }

    /// The primary context of `dev`.
    pub fn context(&self, dev: usize) -> Result<Arc<CudaContext>> {
        self.ctx(dev).cloned()
    }

    fn ctx(&self, dev: usize) -> Result<&Arc<CudaContext>> {
        let slot = self.contexts.get(dev).ok_or_else(|| Error::NoDevice {
            vendor: "CUDA",
            detail: format!("device {dev} asked for, {} visible", self.count),
        })?;
        if let Some(c) = slot.get() {
            return Ok(c);
        }
        let c = CudaContext::new(dev).map_err(|e| cuda_err("cuDevicePrimaryCtxRetain", e))?;
        Ok(slot.get_or_init(|| c))
    }
}

/// A CUDA stream (cudarc's), with the context it belongs to.
#[derive(Debug, Clone)]
pub struct CudaStreamHandle(pub Arc<CudaStream>);

impl Runtime for CudaRuntime {
    const NAME: &'static str = "CUDA";
    const VENDOR: &'static str = "CUDA";
    type Stream = CudaStreamHandle;
    type Event = cudarc::driver::CudaEvent;

    fn record(&self, s: &CudaStreamHandle) -> Result<cudarc::driver::CudaEvent> {
        // Timing events: cudarc's default disables timing.
        s.0.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| cuda_err("cuEventRecord", e))
    }

    fn launch_event(&self, dev: usize) -> Result<(cudarc::driver::CudaEvent, usize)> {
        // CUDA takes a launch completion event only without timing.
        let ev = self
            .ctx(dev)?
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| cuda_err("cuEventCreate", e))?;
        let handle = ev.cu_event() as usize;
        Ok((ev, handle))
    }

    fn record_again(&self, e: &mut cudarc::driver::CudaEvent, s: &CudaStreamHandle) -> Result<()> {
        e.record(&s.0).map_err(|e| cuda_err("cuEventRecord", e))
    }

    fn event_done(&self, e: &cudarc::driver::CudaEvent) -> Option<bool> {
        Some(e.is_complete())
    }

    fn elapsed_ms(
        &self,
        a: &cudarc::driver::CudaEvent,
        b: &cudarc::driver::CudaEvent,
    ) -> Result<f64> {
        a.elapsed_ms(b)
            .map(f64::from)
            .map_err(|e| cuda_err("cuEventElapsedTime", e))
    }

    fn wait_event(
        &self,
        _dev: usize,
        s: &CudaStreamHandle,
        e: &cudarc::driver::CudaEvent,
    ) -> Result<()> {
        s.0.wait(e).map_err(|e| cuda_err("cuStreamWaitEvent", e))
    }

    fn mem_info(&self, dev: usize) -> Result<(usize, usize)> {
        self.with_device(dev, || {
            result::mem_get_info().map_err(|e| cuda_err("cuMemGetInfo", e))
        })
    }

    fn export_memory(&self, dev: usize, addr: usize) -> Result<Exported> {
        self.with_device(dev, || crate::vmm::export(addr))
    }

    fn import_memory(
        &self,
        dev: usize,
        fd: std::os::fd::BorrowedFd<'_>,
        size: usize,
    ) -> Result<usize> {
        self.with_device(dev, || crate::vmm::import(dev, fd, size))
    }

    unsafe fn unmap_imported(&self, dev: usize, addr: usize, size: usize) -> Result<()> {
        // SAFETY: the trait's contract is `vmm::unmap`'s.
        self.with_device(dev, || unsafe { crate::vmm::unmap(addr, size) })
    }

    fn has_kernels(&self) -> bool {
        true
    }
    fn alloc_host_mapped(&self, dev: usize, bytes: usize) -> Result<usize> {
        self.host_mapped(dev, bytes)
    }
    unsafe fn free_host_mapped(&self, addr: usize) -> Result<()> {
        // SAFETY: the trait's contract is `free_mapped`'s.
        unsafe { self.free_mapped(addr) }
    }
    unsafe fn launch(
        &self,
        dev: usize,
        dtype: unicomm_core::DataType,
        launch: unicomm_nccl_api::sys::kernel_args::Launch<'_>,
        s: &CudaStreamHandle,
    ) -> Result<()> {
        // SAFETY: the trait's contract is `launch_kind`'s, `s` a stream of `dev`.
        unsafe { self.launch_kind(dev, dtype, launch, s.0.cu_stream()) }
    }

    fn stream_memory_ops(&self, _dev: usize) -> bool {
        // 32-bit waits and writes are supported on every device since CUDA 12 (the
        // device attribute that gated them is deprecated); the symbols are what can miss.
        self.mem_ops
    }

    fn signal_by_write(&self, _dev: usize) -> bool {
        // Any device address the context reaches (peer memory, imported cuMem mappings).
        // 1x H200, NCCL 2.28.9, `overhead`'s latency A/B, 500 operations, ten runs: 11-17
        // us per operation by writes against 24-31 us by 4-byte copies.
        self.mem_ops
    }

    unsafe fn wait_value32(
        &self,
        dev: usize,
        addr: usize,
        value: u32,
        s: &CudaStreamHandle,
    ) -> Result<()> {
        let eq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as std::ffi::c_uint;
        // SAFETY: the trait contract: `addr` is an aligned device word reachable from
        // `dev`, allocated until the wait completes; `s` is a live stream of `dev`.
        self.mem_op(dev, "cuStreamWaitValue32", || unsafe {
            sys::cuStreamWaitValue32_v2(s.0.cu_stream(), addr as sys::CUdeviceptr, value, eq)
        })
    }

    unsafe fn write_value32(
        &self,
        dev: usize,
        addr: usize,
        value: u32,
        s: &CudaStreamHandle,
    ) -> Result<()> {
        // Default flags: a memory barrier before the write (the work before it on the
        // stream is visible first).
        let dflt = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as std::ffi::c_uint;
        // SAFETY: as for the wait: an aligned device word reachable from `dev`.
        self.mem_op(dev, "cuStreamWriteValue32", || unsafe {
            sys::cuStreamWriteValue32_v2(s.0.cu_stream(), addr as sys::CUdeviceptr, value, dflt)
        })
    }

    fn capturing(&self, s: &CudaStreamHandle) -> Result<bool> {
        let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: a live stream; writes one enum value.
        unsafe { sys::cuStreamIsCapturing(s.0.cu_stream(), &mut st) }
            .result()
            .map_err(|e| cuda_err("cuStreamIsCapturing", e))?;
        Ok(st != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    fn enable_peer_access(&self, dev: usize, peer: usize) -> Result<()> {
        let peer_ctx = self.ctx(peer)?.cu_ctx();
        self.with_device(dev, || {
            // SAFETY: `peer_ctx` is the retained primary context of `peer`; the call only
            // maps it into the current (dev's) context.
            let r = unsafe { sys::cuCtxEnablePeerAccess(peer_ctx, 0) };
            match r {
                sys::cudaError_enum::CUDA_SUCCESS
                | sys::cudaError_enum::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
                e => Err(cuda_err("cuCtxEnablePeerAccess", DriverError(e))),
            }
        })
    }

    unsafe fn copy_async(
        &self,
        dev: usize,
        dst: usize,
        src: usize,
        bytes: usize,
        s: &CudaStreamHandle,
    ) -> Result<()> {
        self.with_device(dev, || {
            // SAFETY: the trait contract: both ranges are live device memory reachable from
            // `dev` (unified addressing, peer access enabled) until the copy completes.
            unsafe {
                result::memcpy_dtod_async(
                    dst as sys::CUdeviceptr,
                    src as sys::CUdeviceptr,
                    bytes,
                    s.0.cu_stream(),
                )
            }
            .map_err(|e| cuda_err("cuMemcpyDtoDAsync", e))
        })
    }

    type Graph = crate::graph::CudaGraph;

    fn has_graphs(&self) -> bool {
        true
    }

    fn begin_capture(&self, dev: usize, s: &CudaStreamHandle) -> Result<()> {
        self.with_device(dev, || crate::graph::begin(s.0.cu_stream()))
    }

    fn end_capture(&self, dev: usize, s: &CudaStreamHandle) -> Result<crate::graph::CudaGraph> {
        self.with_device(dev, || crate::graph::end(s.0.cu_stream()))
    }

    fn launch_graph(
        &self,
        dev: usize,
        g: &crate::graph::CudaGraph,
        s: &CudaStreamHandle,
    ) -> Result<()> {
        self.with_device(dev, || crate::graph::launch(g, s.0.cu_stream()))
    }

    fn launch_host_fn(
        &self,
        dev: usize,
        s: &CudaStreamHandle,
        f: Box<dyn FnOnce() + Send + 'static>,
    ) -> Result<()> {
        unicomm_nccl_api::runtime::launch_host_fn_with(f, |run, arg| {
            self.with_device(dev, || {
                // SAFETY: `run` takes back `arg` (given to the driver once) exactly once, when
                // the stream reaches it.
                unsafe { result::stream::launch_host_function(s.0.cu_stream(), run, arg) }
                    .map_err(|e| cuda_err("cuLaunchHostFunc", e))
            })
        })
    }

    fn device_count(&self) -> Result<usize> {
        Ok(self.count)
    }

    fn with_device<T>(&self, dev: usize, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let want = self.ctx(dev)?.cu_ctx();
        let prev = result::ctx::get_current().map_err(|e| cuda_err("cuCtxGetCurrent", e))?;
        if prev == Some(want) {
            // The common case (one thread per GPU): one driver call, nothing to restore.
            return f();
        }
        // SAFETY: `want` is the retained primary context of `dev`, alive as long as `self`.
        unsafe { result::ctx::set_current(want) }.map_err(|e| cuda_err("cuCtxSetCurrent", e))?;
        let r = f();
        if let Some(p) = prev {
            // SAFETY: `p` was current on this thread a moment ago, so it is a live context.
            unsafe { result::ctx::set_current(p) }.map_err(|e| cuda_err("cuCtxSetCurrent", e))?;
        }
        r
    }

    fn create_stream(&self, dev: usize) -> Result<CudaStreamHandle> {
        let ctx = self.context(dev)?;
        ctx.new_stream()
            .map(CudaStreamHandle)
            .map_err(|e| cuda_err("cuStreamCreate", e))
    }

    fn create_stream_with(&self, dev: usize, p: StreamPriority) -> Result<CudaStreamHandle> {
        if p == StreamPriority::Normal {
            return self.create_stream(dev);
        }
        // The range is the current context's: `dev`'s, made current for the query.
        let range = || result::stream::get_priority_range();
        let (_least, greatest) = self.with_device(dev, || {
            range().map_err(|e| cuda_err("cuCtxGetStreamPriorityRange", e))
        })?;
        self.context(dev)?
            .new_stream_with_priority(greatest)
            .map(CudaStreamHandle)
            .map_err(|e| cuda_err("cuStreamCreateWithPriority", e))
    }

    fn raw_stream(s: &CudaStreamHandle) -> *mut std::ffi::c_void {
        s.0.cu_stream() as *mut std::ffi::c_void
    }

    fn synchronize(&self, s: &CudaStreamHandle) -> Result<()> {
        s.0.synchronize()
            .map_err(|e| cuda_err("cuStreamSynchronize", e))
    }

    fn synchronize_device(&self, dev: usize) -> Result<()> {
        self.with_device(dev, || {
            result::ctx::synchronize().map_err(|e| cuda_err("cuCtxSynchronize", e))
        })
    }

    fn query(&self, s: &CudaStreamHandle) -> Result<bool> {
        // SAFETY: a live stream of its context (cudarc keeps both alive); no out-pointer.
        match unsafe { sys::cuStreamQuery(s.0.cu_stream()) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(cuda_err("cuStreamQuery", DriverError(e))),
        }
    }

    fn malloc(&self, dev: usize, bytes: usize) -> Result<usize> {
        self.with_device(dev, || {
            // SAFETY: cuMemAlloc on the device made current by with_device.
            unsafe { result::malloc_sync(bytes) }
                .map(|p| p as usize)
                .map_err(|e| cuda_err("cuMemAlloc", e))
        })
    }

    unsafe fn free(&self, dev: usize, ptr: usize) -> Result<()> {
        self.with_device(dev, || {
            // SAFETY: per the trait contract, `ptr` came from malloc on `dev`.
            unsafe { result::free_sync(ptr as sys::CUdeviceptr) }
                .map_err(|e| cuda_err("cuMemFree", e))
        })
    }

    unsafe fn htod(&self, dev: usize, dst: usize, src: &[u8], s: &CudaStreamHandle) -> Result<()> {
        self.with_device(dev, || {
            // SAFETY: `dst` holds `src.len()` device bytes (trait contract); the copy is
            // awaited below, before `src` can be released.
            unsafe { result::memcpy_htod_async(dst as sys::CUdeviceptr, src, s.0.cu_stream()) }
                .map_err(|e| cuda_err("cuMemcpyHtoDAsync", e))?;
            s.0.synchronize()
                .map_err(|e| cuda_err("cuStreamSynchronize", e))
        })
    }

    unsafe fn dtoh(
        &self,
        dev: usize,
        dst: &mut [u8],
        src: usize,
        s: &CudaStreamHandle,
    ) -> Result<()> {
        self.with_device(dev, || {
            // SAFETY: `src` holds `dst.len()` device bytes (trait contract); awaited below.
            unsafe { result::memcpy_dtoh_async(dst, src as sys::CUdeviceptr, s.0.cu_stream()) }
                .map_err(|e| cuda_err("cuMemcpyDtoHAsync", e))?;
            s.0.synchronize()
                .map_err(|e| cuda_err("cuStreamSynchronize", e))
        })
    }

    fn device_info(&self, dev: usize) -> Result<(String, Option<String>)> {
        self.name_and_bus(dev)
    }

    fn compute_capability(&self, dev: usize) -> Option<(u32, u32)> {
        self.capability(dev)
    }

    fn driver_version(&self) -> Option<u32> {
        let mut v = 0;
        // SAFETY: writes one int.
        let r = unsafe { sys::cuDriverGetVersion(&mut v) }.result();
        r.ok().and_then(|_| u32::try_from(v).ok())
    }

    fn describe(&self) -> String {
        let drv = (self.driver_version()).map_or_else(
            || "unknown".into(),
            |v| format!("{}.{}", v / 1000, (v % 1000) / 10),
        );
        let names: Vec<String> = (0..self.count)
            .map(|d| {
                self.context(d)
                    .and_then(|c| c.name().map_err(|e| cuda_err("cuDeviceGetName", e)))
                    .unwrap_or_else(|e| e.to_string())
            })
            .collect();
        format!(
            "CUDA driver API {drv}, {} device(s): {}",
            self.count,
            names.join(", ")
        )
    }
}
