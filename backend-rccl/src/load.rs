//! Loading HIP: the library searched for and its table resolved, the devices counted, and
//! every HIP result checked (cudarc's `result` level).

#![allow(unsafe_code, reason = "the HIP runtime through its loaded table")]

use std::ffi::{c_int, CStr};

use unicomm_core::{Error, Result};
use unicomm_nccl_api::search::open_library;

use crate::sys::*;
use unicomm_nccl_api::Runtime;

/// The HIP runtime: the loaded library, its table and the device count.
pub struct HipRuntime {
    /// Where `libamdhip64` was loaded from.
    pub path: String,
    pub(crate) fns: HipFns,
    pub(crate) count: usize,
    pub(crate) _lib: libloading::Library,
}

impl std::fmt::Debug for HipRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HipRuntime(libamdhip64 at {}, {} devices)",
            self.path, self.count
        )
    }
}

impl HipRuntime {
    /// Loads HIP and counts devices: `LibraryNotFound` (every path tried) without the
    /// library, `NoDevice` when it sees no AMD GPU.
    pub fn new() -> Result<Self> {
        let (lib, path) = hip_search().load(|cand| {
            open_library("HIP runtime", cand).map(|l| (l, cand.display().to_string()))
        })?;
        Self::from_library(lib, path)
    }

    fn from_library(lib: libloading::Library, path: String) -> Result<Self> {
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: the symbol is declared with hip_runtime_api.h's signature.
                let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) };
                *s.map_err(|_| Error::MissingSymbol {
                    library: "HIP runtime",
                    path: path.clone(),
                    symbol: $name,
                })?
            }};
        }
        macro_rules! opt {
            ($name:literal) => {{
                // SAFETY: the symbol is declared with hip_runtime_api.h's signature.
                let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) };
                s.ok().map(|s| *s)
            }};
        }
        let fns = HipFns {
            get_device_count: sym!("hipGetDeviceCount"),
            set_device: sym!("hipSetDevice"),
            get_device: sym!("hipGetDevice"),
            stream_create_with_flags: sym!("hipStreamCreateWithFlags"),
            stream_destroy: sym!("hipStreamDestroy"),
            stream_synchronize: sym!("hipStreamSynchronize"),
            device_synchronize: sym!("hipDeviceSynchronize"),
            stream_query: sym!("hipStreamQuery"),
            malloc: sym!("hipMalloc"),
            free: sym!("hipFree"),
            memcpy_async: sym!("hipMemcpyAsync"),
            get_error_string: sym!("hipGetErrorString"),
            event_create: sym!("hipEventCreate"),
            event_record: sym!("hipEventRecord"),
            event_synchronize: sym!("hipEventSynchronize"),
            event_elapsed_time: sym!("hipEventElapsedTime"),
            event_destroy: sym!("hipEventDestroy"),
            device_enable_peer_access: sym!("hipDeviceEnablePeerAccess"),
            mem_get_info: sym!("hipMemGetInfo"),
            stream_wait_event: sym!("hipStreamWaitEvent"),
            get_error_name: opt!("hipGetErrorName"),
            runtime_get_version: opt!("hipRuntimeGetVersion"),
            driver_get_version: opt!("hipDriverGetVersion"),
            device_get_name: opt!("hipDeviceGetName"),
            device_get_pci_bus_id: opt!("hipDeviceGetPCIBusId"),
            event_query: opt!("hipEventQuery"),
            vmm: optional_vmm(&lib),
            mem_ops: optional_mem_ops(&lib),
            stream_is_capturing: opt!("hipStreamIsCapturing"),
            priorities: optional_priorities(&lib),
            graphs: optional_graphs(&lib),
            kernels: optional_kernels(&lib),
            launch_host_func: opt!("hipLaunchHostFunc"),
        };
        let rt = HipRuntime {
            path,
            fns,
            count: 0,
            _lib: lib,
        };
        rt.with_devices()
    }

    /// The runtime with its device count, or `NoDevice` naming why there is none.
    fn with_devices(mut self) -> Result<Self> {
        let rt = &mut self;
        let mut n: c_int = 0;
        // SAFETY: writes one int.
        let r = unsafe { (rt.fns.get_device_count)(&mut n) };
        match r {
            HIP_SUCCESS if n > 0 => {
                rt.count = n as usize;
                Ok(self)
            }
            HIP_SUCCESS | HIP_ERROR_NO_DEVICE | HIP_ERROR_INVALID_DEVICE | HIP_ERROR_INSUFFICIENT_DRIVER => Err(Error::NoDevice {
                vendor: "ROCm",
                detail: format!(
                    "HIP runtime at {} (runtime {}) sees no AMD GPU: hipGetDeviceCount returned {} ({n} devices)",
                    rt.path,
                    rt.runtime_version(),
                    rt.err_name(r)
                ),
            }),
            e => Err(rt.err("hipGetDeviceCount", e)),
        }
    }

    /// The virtual-memory calls, or `Unsupported` when this runtime lacks them.
    pub(crate) fn vmm(&self) -> Result<HipVmm> {
        self.fns.vmm.ok_or_else(|| {
            Error::unsupported(
                "sharing device memory between processes",
                "HIP's virtual memory calls (hipMemExportToShareableHandle and friends)",
                format!("the HIP runtime at {}", self.path),
            )
        })
    }

    /// A stream memory operation on `dev` (`op` makes the call), or `Unsupported` when
    /// this runtime lacks them.
    pub(crate) fn mem_op(
        &self,
        dev: usize,
        call: &'static str,
        op: impl FnOnce(HipMemOps) -> HipError,
    ) -> Result<()> {
        let ops = self.fns.mem_ops.ok_or_else(|| {
            Error::unsupported(
                "stream memory operations",
                "hipStreamWaitValue32 and hipStreamWriteValue32",
                format!("the HIP runtime at {}", self.path),
            )
        })?;
        self.with_device(dev, || self.check(call, op(ops)))
    }

    fn err_name(&self, e: HipError) -> String {
        let Some(name) = self.fns.get_error_name else {
            return format!("hipError {e}");
        };
        // SAFETY: returns a static C string for any code.
        let p = unsafe { name(e) };
        if p.is_null() {
            return format!("hipError {e}");
        }
        // SAFETY: NUL-terminated, static.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    pub(crate) fn err(&self, call: &'static str, e: HipError) -> Error {
        // SAFETY: returns a static C string for any code.
        let p = unsafe { (self.fns.get_error_string)(e) };
        let message = if p.is_null() {
            String::new()
        } else {
            // SAFETY: NUL-terminated, static.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        Error::Device {
            runtime: "HIP",
            call,
            code: e,
            name: self.err_name(e),
            message,
        }
    }

    pub(crate) fn check(&self, call: &'static str, e: HipError) -> Result<()> {
        if e == HIP_SUCCESS {
            Ok(())
        } else {
            Err(self.err(call, e))
        }
    }

    fn version(&self, f: Option<unsafe extern "C" fn(*mut c_int) -> HipError>) -> String {
        let Some(f) = f else {
            return "unknown".into();
        };
        let mut v: c_int = 0;
        // SAFETY: writes one int.
        if unsafe { f(&mut v) } != HIP_SUCCESS {
            return "unknown".into();
        }
        // HIP encodes versions as major*10000000 + minor*100000 + patch.
        format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000)
    }

    /// `hipRuntimeGetVersion`, decoded.
    pub fn runtime_version(&self) -> String {
        self.version(self.fns.runtime_get_version)
    }

    /// `hipDriverGetVersion`, decoded.
    pub fn driver_version(&self) -> String {
        self.version(self.fns.driver_get_version)
    }
}

/// Symbol `name` of `lib` as `T`, or `None` where the library lacks it.
///
/// # Safety
/// `T` is the symbol's type as hip_runtime_api.h declares it.
unsafe fn opt<T: Copy>(lib: &libloading::Library, name: &[u8]) -> Option<T> {
    // SAFETY: the caller's: `T` is the declared type of the symbol.
    unsafe { lib.get::<T>(name) }.ok().map(|s| *s)
}

/// The virtual-memory calls (the copy-engine path's export and import), all or none.
fn optional_vmm(lib: &libloading::Library) -> Option<HipVmm> {
    // SAFETY: each field's type is hip_runtime_api.h's signature of its name.
    unsafe {
        Some(HipVmm {
            mem_get_address_range: opt(lib, b"hipMemGetAddressRange\0")?,
            mem_retain_allocation_handle: opt(lib, b"hipMemRetainAllocationHandle\0")?,
            mem_export_to_shareable_handle: opt(lib, b"hipMemExportToShareableHandle\0")?,
            mem_import_from_shareable_handle: opt(lib, b"hipMemImportFromShareableHandle\0")?,
            mem_address_reserve: opt(lib, b"hipMemAddressReserve\0")?,
            mem_map: opt(lib, b"hipMemMap\0")?,
            mem_set_access: opt(lib, b"hipMemSetAccess\0")?,
            mem_release: opt(lib, b"hipMemRelease\0")?,
            mem_unmap: opt(lib, b"hipMemUnmap\0")?,
            mem_address_free: opt(lib, b"hipMemAddressFree\0")?,
        })
    }
}

/// The stream memory operations (the copy-engine path's signals), both or none.
fn optional_mem_ops(lib: &libloading::Library) -> Option<HipMemOps> {
    // SAFETY: both fields' types are hip_runtime_api.h's signatures of their names.
    unsafe {
        Some(HipMemOps {
            wait_value32: opt(lib, b"hipStreamWaitValue32\0")?,
            write_value32: opt(lib, b"hipStreamWriteValue32\0")?,
        })
    }
}

/// Prioritised streams, both calls or none.
fn optional_priorities(lib: &libloading::Library) -> Option<HipPriorities> {
    // SAFETY: both fields' types are hip_runtime_api.h's signatures of their names.
    unsafe {
        Some(HipPriorities {
            device_get_stream_priority_range: opt(lib, b"hipDeviceGetStreamPriorityRange\0")?,
            stream_create_with_priority: opt(lib, b"hipStreamCreateWithPriority\0")?,
        })
    }
}

/// Graph capture and launch, every call or none.
fn optional_graphs(lib: &libloading::Library) -> Option<HipGraphs> {
    // SAFETY: every field's type is hip_runtime_api.h's signature of its name.
    unsafe {
        Some(HipGraphs {
            stream_begin_capture: opt(lib, b"hipStreamBeginCapture\0")?,
            stream_end_capture: opt(lib, b"hipStreamEndCapture\0")?,
            graph_instantiate_with_flags: opt(lib, b"hipGraphInstantiateWithFlags\0")?,
            graph_launch: opt(lib, b"hipGraphLaunch\0")?,
            graph_exec_destroy: opt(lib, b"hipGraphExecDestroy\0")?,
            graph_destroy: opt(lib, b"hipGraphDestroy\0")?,
        })
    }
}

/// Host memory the device maps and kernel modules, every call or none (the names in
/// [`KERNEL_CALLS`]' order).
fn optional_kernels(lib: &libloading::Library) -> Option<HipKernels> {
    let name = |i: usize| format!("{}\0", KERNEL_CALLS[i]).into_bytes();
    // SAFETY: every field's type is hip_runtime_api.h's signature of its name.
    unsafe {
        Some(HipKernels {
            host_malloc: opt(lib, &name(0))?,
            host_get_device_pointer: opt(lib, &name(1))?,
            host_free: opt(lib, &name(2))?,
            module_load_data: opt(lib, &name(3))?,
            module_get_function: opt(lib, &name(4))?,
            module_launch_kernel: opt(lib, &name(5))?,
        })
    }
}
