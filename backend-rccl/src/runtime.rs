//! The HIP runtime through a libloading table of `libamdhip64` (not hip-sys: it needs ROCm
//! headers to build and links the library at build time; see docs/dev/decisions.md).

#![allow(unsafe_code, reason = "the HIP runtime through its loaded table")]

use std::ffi::{c_char, c_int, c_void};

use unicomm_core::{Error, Result, StreamPriority};

use crate::graph;
use crate::streams;
pub use crate::sys::hip_search;
use crate::sys::*;
use unicomm_nccl_api::runtime::Exported;
use unicomm_nccl_api::Runtime;

pub use crate::interop::{HipEventHandle, HipStreamHandle};

pub use crate::load::HipRuntime;

impl Runtime for HipRuntime {
    const NAME: &'static str = "HIP";
    const VENDOR: &'static str = "ROCm";
    type Stream = HipStreamHandle;
    type Event = HipEventHandle;
    type Graph = graph::HipGraph;

    fn has_graphs(&self) -> bool {
        self.fns.graphs.is_some()
    }

    fn begin_capture(&self, dev: usize, s: &HipStreamHandle) -> Result<()> {
        let g = graph::table(self.fns.graphs, &self.path)?;
        self.with_device(dev, || graph::begin(&g, &|c, e| self.check(c, e), s.0))
    }

    fn end_capture(&self, dev: usize, s: &HipStreamHandle) -> Result<graph::HipGraph> {
        let g = graph::table(self.fns.graphs, &self.path)?;
        self.with_device(dev, || graph::end(&g, &|c, e| self.check(c, e), s.0))
    }

    fn launch_graph(&self, dev: usize, gr: &graph::HipGraph, s: &HipStreamHandle) -> Result<()> {
        let g = graph::table(self.fns.graphs, &self.path)?;
        self.with_device(dev, || graph::launch(&g, &|c, e| self.check(c, e), gr, s.0))
    }

    fn record(&self, s: &HipStreamHandle) -> Result<HipEventHandle> {
        self.with_device(s.1, || {
            let mut ev = std::ptr::null_mut();
            // SAFETY: writes one event handle.
            self.check("hipEventCreate", unsafe {
                (self.fns.event_create)(&mut ev)
            })?;
            let ev = HipEventHandle(ev, s.1);
            // SAFETY: a live event and a live stream of the same device.
            self.check("hipEventRecord", unsafe {
                (self.fns.event_record)(ev.0, s.0)
            })?;
            Ok(ev)
        })
    }

    fn record_again(&self, e: &mut HipEventHandle, s: &HipStreamHandle) -> Result<()> {
        if e.1 != s.1 {
            // An event of another device: a new one for this stream's.
            *e = self.record(s)?;
            return Ok(());
        }
        self.with_device(s.1, || {
            // SAFETY: a live event and a live stream of the same device.
            self.check("hipEventRecord", unsafe {
                (self.fns.event_record)(e.0, s.0)
            })
        })
    }

    fn event_done(&self, e: &HipEventHandle) -> Option<bool> {
        let query = self.fns.event_query?;
        // SAFETY: a live event; hipEventQuery only reads its state.
        match unsafe { query(e.0) } {
            0 => Some(true),
            // hipErrorNotReady.
            600 => Some(false),
            _ => None,
        }
    }

    fn elapsed_ms(&self, a: &HipEventHandle, b: &HipEventHandle) -> Result<f64> {
        self.with_device(a.1, || {
            let mut ms = 0f32;
            for e in [a, b] {
                // SAFETY: a live, recorded event.
                self.check("hipEventSynchronize", unsafe {
                    (self.fns.event_synchronize)(e.0)
                })?;
            }
            // SAFETY: two live events, both complete; writes one float.
            self.check("hipEventElapsedTime", unsafe {
                (self.fns.event_elapsed_time)(&mut ms, a.0, b.0)
            })?;
            Ok(f64::from(ms))
        })
    }

    fn wait_event(&self, dev: usize, s: &HipStreamHandle, e: &HipEventHandle) -> Result<()> {
        self.with_device(dev, || {
            // SAFETY: a live stream and a live, recorded event of the same device.
            self.check("hipStreamWaitEvent", unsafe {
                (self.fns.stream_wait_event)(s.0, e.0, 0)
            })
        })
    }

    fn mem_info(&self, dev: usize) -> Result<(usize, usize)> {
        self.with_device(dev, || {
            let (mut free, mut total) = (0usize, 0usize);
            // SAFETY: writes two size_t values.
            self.check("hipMemGetInfo", unsafe {
                (self.fns.mem_get_info)(&mut free, &mut total)
            })?;
            Ok((free, total))
        })
    }

    fn export_memory(&self, dev: usize, addr: usize) -> Result<Exported> {
        self.export_on(dev, addr)
    }

    fn import_memory(
        &self,
        dev: usize,
        fd: std::os::fd::BorrowedFd<'_>,
        size: usize,
    ) -> Result<usize> {
        self.import_on(dev, fd, size)
    }

    unsafe fn unmap_imported(&self, dev: usize, addr: usize, size: usize) -> Result<()> {
        // SAFETY: the trait's contract is `unmap_on`'s.
        unsafe { self.unmap_on(dev, addr, size) }
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
        s: &HipStreamHandle,
    ) -> Result<()> {
        use unicomm_nccl_api::sys::kernel_args::Launch;
        match launch {
            // SAFETY: the trait's contract is `launch_symmetric_on`'s.
            Launch::Symmetric(params) => unsafe {
                self.launch_symmetric_on(dev, dtype, params, s.0)
            },
            Launch::DeviceApi { .. } => Err(unicomm_core::Error::unsupported(
                "unicomm's kernel on the device API",
                "NCCL's device API (the CUDA backend)",
                "RCCL",
            )),
        }
    }

    fn stream_memory_ops(&self, _dev: usize) -> bool {
        self.fns.mem_ops.is_some()
    }

    unsafe fn wait_value32(
        &self,
        dev: usize,
        addr: usize,
        value: u32,
        s: &HipStreamHandle,
    ) -> Result<()> {
        let ptr = addr as *mut c_void;
        // SAFETY: the trait contract: an aligned device word reachable from `dev`,
        // allocated until the wait completes; all 32 bits compared.
        self.mem_op(dev, "hipStreamWaitValue32", |ops| unsafe {
            (ops.wait_value32)(s.0, ptr, value, HIP_STREAM_WAIT_VALUE_EQ, u32::MAX)
        })
    }

    unsafe fn write_value32(
        &self,
        dev: usize,
        addr: usize,
        value: u32,
        s: &HipStreamHandle,
    ) -> Result<()> {
        let ptr = addr as *mut c_void;
        // SAFETY: as for the wait: an aligned device word reachable from `dev`.
        self.mem_op(dev, "hipStreamWriteValue32", |ops| unsafe {
            (ops.write_value32)(s.0, ptr, value, HIP_STREAM_WRITE_VALUE_DEFAULT)
        })
    }

    fn capturing(&self, s: &HipStreamHandle) -> Result<bool> {
        let Some(f) = self.fns.stream_is_capturing else {
            return Ok(false);
        };
        let mut st: c_int = 0;
        // SAFETY: a live stream; writes one enum value (hipStreamCaptureStatusNone is 0).
        self.check("hipStreamIsCapturing", unsafe { f(s.0, &mut st) })?;
        Ok(st != 0)
    }

    fn enable_peer_access(&self, dev: usize, peer: usize) -> Result<()> {
        self.with_device(dev, || {
            // SAFETY: maps `peer`'s memory into the current device (`dev`); no pointers.
            match unsafe { (self.fns.device_enable_peer_access)(peer as c_int, 0) } {
                HIP_SUCCESS | HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
                e => Err(self.err("hipDeviceEnablePeerAccess", e)),
            }
        })
    }

    unsafe fn copy_async(
        &self,
        dev: usize,
        dst: usize,
        src: usize,
        bytes: usize,
        s: &HipStreamHandle,
    ) -> Result<()> {
        self.with_device(dev, || {
            // SAFETY: the trait contract: both ranges are live device memory reachable from
            // `dev` until the copy completes.
            self.check("hipMemcpyAsync", unsafe {
                (self.fns.memcpy_async)(
                    dst as *mut c_void,
                    src as *const c_void,
                    bytes,
                    HIP_MEMCPY_DEVICE_TO_DEVICE,
                    s.0,
                )
            })
        })
    }

    fn device_count(&self) -> Result<usize> {
        Ok(self.count)
    }

    fn with_device<T>(&self, dev: usize, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let mut prev: c_int = 0;
        // SAFETY: writes one int.
        self.check("hipGetDevice", unsafe { (self.fns.get_device)(&mut prev) })?;
        if prev as usize == dev {
            return f();
        }
        // SAFETY: selects a device index below the count.
        self.check("hipSetDevice", unsafe {
            (self.fns.set_device)(dev as c_int)
        })?;
        let r = f();
        // SAFETY: restores the device that was current.
        self.check("hipSetDevice", unsafe { (self.fns.set_device)(prev) })?;
        r
    }

    fn create_stream(&self, dev: usize) -> Result<HipStreamHandle> {
        self.with_device(dev, || {
            let mut s = std::ptr::null_mut();
            // SAFETY: writes one stream handle.
            self.check("hipStreamCreateWithFlags", unsafe {
                (self.fns.stream_create_with_flags)(&mut s, HIP_STREAM_NON_BLOCKING)
            })?;
            Ok(HipStreamHandle::owned(s, dev))
        })
    }

    fn create_stream_with(&self, dev: usize, p: StreamPriority) -> Result<HipStreamHandle> {
        if p == StreamPriority::Normal {
            return self.create_stream(dev);
        }
        let table = streams::priorities(self.fns.priorities, &self.path)?;
        let s = self.with_device(dev, || streams::greatest(&table, &|c, e| self.check(c, e)))?;
        Ok(HipStreamHandle::owned(s, dev))
    }

    fn launch_host_fn(
        &self,
        dev: usize,
        s: &HipStreamHandle,
        f: Box<dyn FnOnce() + Send + 'static>,
    ) -> Result<()> {
        let launch = streams::host_fn_call(self.fns.launch_host_func, &self.path)?;
        unicomm_nccl_api::runtime::launch_host_fn_with(f, |run, arg| {
            self.with_device(dev, || {
                streams::launch(launch, &|c, e| self.check(c, e), s.0, (run, arg))
            })
        })
    }

    fn raw_stream(s: &HipStreamHandle) -> *mut c_void {
        s.0
    }

    fn synchronize(&self, s: &HipStreamHandle) -> Result<()> {
        // SAFETY: a live stream.
        self.check("hipStreamSynchronize", unsafe {
            (self.fns.stream_synchronize)(s.0)
        })
    }

    fn synchronize_device(&self, dev: usize) -> Result<()> {
        self.with_device(dev, || {
            // SAFETY: no arguments; the device is current (with_device).
            self.check("hipDeviceSynchronize", unsafe {
                (self.fns.device_synchronize)()
            })
        })
    }

    fn query(&self, s: &HipStreamHandle) -> Result<bool> {
        /// `hipErrorNotReady`.
        const NOT_READY: HipError = 600;
        // SAFETY: a live stream; no out-pointer.
        match unsafe { (self.fns.stream_query)(s.0) } {
            HIP_SUCCESS => Ok(true),
            NOT_READY => Ok(false),
            e => Err(self.err("hipStreamQuery", e)),
        }
    }

    fn malloc(&self, dev: usize, bytes: usize) -> Result<usize> {
        self.with_device(dev, || {
            let mut p = std::ptr::null_mut();
            // SAFETY: writes one pointer.
            self.check("hipMalloc", unsafe { (self.fns.malloc)(&mut p, bytes) })?;
            Ok(p as usize)
        })
    }

    unsafe fn free(&self, dev: usize, ptr: usize) -> Result<()> {
        self.with_device(dev, || {
            // SAFETY: per the trait contract.
            self.check("hipFree", unsafe { (self.fns.free)(ptr as *mut c_void) })
        })
    }

    unsafe fn htod(&self, dev: usize, dst: usize, src: &[u8], s: &HipStreamHandle) -> Result<()> {
        self.with_device(dev, || {
            // SAFETY: `dst` holds `src.len()` device bytes (trait contract); awaited below.
            self.check("hipMemcpyAsync", unsafe {
                (self.fns.memcpy_async)(
                    dst as *mut c_void,
                    src.as_ptr().cast(),
                    src.len(),
                    HIP_MEMCPY_HOST_TO_DEVICE,
                    s.0,
                )
            })?;
            self.synchronize(s)
        })
    }

    unsafe fn dtoh(
        &self,
        dev: usize,
        dst: &mut [u8],
        src: usize,
        s: &HipStreamHandle,
    ) -> Result<()> {
        self.with_device(dev, || {
            // SAFETY: `src` holds `dst.len()` device bytes (trait contract); awaited below.
            self.check("hipMemcpyAsync", unsafe {
                (self.fns.memcpy_async)(
                    dst.as_mut_ptr().cast(),
                    src as *const c_void,
                    dst.len(),
                    HIP_MEMCPY_DEVICE_TO_HOST,
                    s.0,
                )
            })?;
            self.synchronize(s)
        })
    }

    fn device_info(&self, dev: usize) -> Result<(String, Option<String>)> {
        let read = |f: Option<unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipError>,
                    what: &'static str|
         -> Result<String> {
            let f = f.ok_or_else(|| {
                Error::unsupported("device information", what, "this HIP runtime")
            })?;
            let dev = c_int::try_from(dev)
                .map_err(|_| Error::invalid("device", format!("{dev} is out of range")))?;
            let mut buf = [0 as c_char; 256];
            // SAFETY: HIP writes at most `len` bytes, NUL-terminated, into `buf`.
            self.check(what, unsafe {
                f(buf.as_mut_ptr(), buf.len() as c_int, dev)
            })?;
            let bytes: Vec<u8> = buf
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        };
        let name = read(self.fns.device_get_name, "hipDeviceGetName")?;
        Ok((
            name,
            read(self.fns.device_get_pci_bus_id, "hipDeviceGetPCIBusId").ok(),
        ))
    }

    fn describe(&self) -> String {
        format!(
            "HIP runtime {} (driver {}) at {}, {} device(s)",
            self.runtime_version(),
            self.driver_version(),
            self.path,
            self.count
        )
    }
}
