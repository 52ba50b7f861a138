//! The HIP runtime through a libloading table of `libamdhip64` (not hip-sys: it needs ROCm
//! headers to build and links the library at build time; see docs/decisions.md).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use std::os::fd::{AsRawFd, FromRawFd};
use unicomm_core::{Error, Result};
use unicomm_nccl_api::search::{open_library, Search};

use unicomm_nccl_api::runtime::Exported;
use unicomm_nccl_api::Runtime;

type HipError = c_int;
type HipStream = *mut c_void;

const HIP_SUCCESS: HipError = 0;
/// `hipErrorNoDevice`.
const HIP_ERROR_NO_DEVICE: HipError = 100;
/// `hipErrorInvalidDevice` (some runtimes answer this instead when no GPU exists).
const HIP_ERROR_INVALID_DEVICE: HipError = 101;
/// `hipErrorInsufficientDriver`: the kernel driver (amdgpu/KFD) is missing.
const HIP_ERROR_INSUFFICIENT_DRIVER: HipError = 35;
const HIP_MEMCPY_HOST_TO_DEVICE: c_int = 1;
const HIP_MEMCPY_DEVICE_TO_HOST: c_int = 2;
const HIP_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;
const HIP_STREAM_NON_BLOCKING: c_uint = 1;
/// `hipErrorPeerAccessAlreadyEnabled`.
const HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED: HipError = 704;
type HipEvent = *mut c_void;

/// The HIP calls unicomm makes, resolved from `libamdhip64`: required are exactly those
/// the runtime calls; the diagnostics are optional.
#[expect(
    missing_docs,
    reason = "each field is the HIP function of the same name"
)]
pub struct HipFns {
    pub get_device_count: unsafe extern "C" fn(*mut c_int) -> HipError,
    pub set_device: unsafe extern "C" fn(c_int) -> HipError,
    pub get_device: unsafe extern "C" fn(*mut c_int) -> HipError,
    pub stream_create_with_flags: unsafe extern "C" fn(*mut HipStream, c_uint) -> HipError,
    pub stream_destroy: unsafe extern "C" fn(HipStream) -> HipError,
    pub stream_synchronize: unsafe extern "C" fn(HipStream) -> HipError,
    pub stream_query: unsafe extern "C" fn(HipStream) -> HipError,
    pub malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError,
    pub free: unsafe extern "C" fn(*mut c_void) -> HipError,
    pub memcpy_async:
        unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, HipStream) -> HipError,
    pub get_error_string: unsafe extern "C" fn(HipError) -> *const c_char,
    pub event_create: unsafe extern "C" fn(*mut HipEvent) -> HipError,
    pub event_record: unsafe extern "C" fn(HipEvent, HipStream) -> HipError,
    pub event_synchronize: unsafe extern "C" fn(HipEvent) -> HipError,
    pub event_elapsed_time: unsafe extern "C" fn(*mut f32, HipEvent, HipEvent) -> HipError,
    pub event_destroy: unsafe extern "C" fn(HipEvent) -> HipError,
    pub device_enable_peer_access: unsafe extern "C" fn(c_int, c_uint) -> HipError,
    pub mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> HipError,
    pub stream_wait_event: unsafe extern "C" fn(HipStream, HipEvent, c_uint) -> HipError,
    // Diagnostics only: optional, so a runtime without them still loads.
    pub get_error_name: Option<unsafe extern "C" fn(HipError) -> *const c_char>,
    pub runtime_get_version: Option<unsafe extern "C" fn(*mut c_int) -> HipError>,
    pub driver_get_version: Option<unsafe extern "C" fn(*mut c_int) -> HipError>,
    /// `hipDeviceGetName(name, len, device)` and `hipDeviceGetPCIBusId(id, len, device)`:
    /// what a benchmark reports of each rank's device.
    pub device_get_name: Option<unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipError>,
    pub device_get_pci_bus_id: Option<unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipError>,
    /// Virtual memory management (the copy-engine path across processes): optional, so a
    /// runtime without it still loads (that path is then `Unsupported`).
    pub vmm: Option<HipVmm>,
    /// Stream memory operations (the copy-engine path's signals): optional; without them
    /// the path orders itself with RCCL barriers.
    pub mem_ops: Option<HipMemOps>,
    /// `hipStreamIsCapturing(stream, status)`: optional (graphs are then never seen).
    pub stream_is_capturing: Option<unsafe extern "C" fn(HipStream, *mut c_int) -> HipError>,
}

/// HIP's stream memory operations, each the function of the same name.
#[derive(Clone, Copy)]
pub struct HipMemOps {
    /// `hipStreamWaitValue32(stream, ptr, value, flags, mask)`.
    pub wait_value32: unsafe extern "C" fn(HipStream, *mut c_void, u32, c_uint, u32) -> HipError,
    /// `hipStreamWriteValue32(stream, ptr, value, flags)`.
    pub write_value32: unsafe extern "C" fn(HipStream, *mut c_void, u32, c_uint) -> HipError,
}

/// `hipStreamWaitValueEq` (the same value as CUDA's `CU_STREAM_WAIT_VALUE_EQ`).
const HIP_STREAM_WAIT_VALUE_EQ: c_uint = 0x1;
/// `hipStreamWriteValueDefault`.
const HIP_STREAM_WRITE_VALUE_DEFAULT: c_uint = 0;

/// HIP's virtual-memory calls (`hipMem*`), each the function of the same name.
#[expect(
    missing_docs,
    reason = "each field is the HIP function of the same name"
)]
#[derive(Clone, Copy)]
pub struct HipVmm {
    pub mem_get_address_range: unsafe extern "C" fn(*mut usize, *mut usize, usize) -> HipError,
    pub mem_retain_allocation_handle:
        unsafe extern "C" fn(*mut HipMemHandle, *mut c_void) -> HipError,
    pub mem_export_to_shareable_handle:
        unsafe extern "C" fn(*mut c_void, HipMemHandle, c_int, u64) -> HipError,
    pub mem_import_from_shareable_handle:
        unsafe extern "C" fn(*mut HipMemHandle, *mut c_void, c_int) -> HipError,
    pub mem_address_reserve:
        unsafe extern "C" fn(*mut *mut c_void, usize, usize, *mut c_void, u64) -> HipError,
    pub mem_map: unsafe extern "C" fn(*mut c_void, usize, usize, HipMemHandle, u64) -> HipError,
    pub mem_set_access:
        unsafe extern "C" fn(*mut c_void, usize, *const HipMemAccessDesc, usize) -> HipError,
    pub mem_release: unsafe extern "C" fn(HipMemHandle) -> HipError,
    pub mem_unmap: unsafe extern "C" fn(*mut c_void, usize) -> HipError,
    pub mem_address_free: unsafe extern "C" fn(*mut c_void, usize) -> HipError,
}

/// `hipMemGenericAllocationHandle_t` (an opaque pointer).
pub type HipMemHandle = *mut c_void;
/// `hipMemHandleTypePosixFileDescriptor`.
const HIP_MEM_HANDLE_TYPE_POSIX_FD: c_int = 1;

/// `hipMemAccessDesc`: `{ hipMemLocation { type, id }, flags }`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HipMemAccessDesc {
    location_type: c_int,
    location_id: c_int,
    flags: c_int,
}
/// `hipMemLocationTypeDevice`.
const HIP_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
/// `hipMemAccessFlagsProtReadWrite`.
const HIP_MEM_ACCESS_FLAGS_PROT_READ_WRITE: c_int = 3;

/// The HIP runtime: the loaded library, its table and the device count.
pub struct HipRuntime {
    /// Where `libamdhip64` was loaded from.
    pub path: String,
    fns: HipFns,
    count: usize,
    _lib: libloading::Library,
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

/// Where `libamdhip64` is searched: `UNICOMM_HIP_LIBRARY`, `ROCM_PATH/lib`, `HIP_PATH/lib`,
/// `/opt/rocm/lib`, then the sonames (ROCm 6/7's `.so.6`/`.so.7`, Debian's `.so.5`).
pub fn hip_search() -> Search {
    Search {
        library: "HIP runtime",
        env_var: "UNICOMM_HIP_LIBRARY",
        dirs: crate::rocm_dirs(),
        names: &[
            "libamdhip64.so",
            "libamdhip64.so.7",
            "libamdhip64.so.6",
            "libamdhip64.so.5",
        ],
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
            vmm: (|| {
                Some(HipVmm {
                    mem_get_address_range: opt!("hipMemGetAddressRange")?,
                    mem_retain_allocation_handle: opt!("hipMemRetainAllocationHandle")?,
                    mem_export_to_shareable_handle: opt!("hipMemExportToShareableHandle")?,
                    mem_import_from_shareable_handle: opt!("hipMemImportFromShareableHandle")?,
                    mem_address_reserve: opt!("hipMemAddressReserve")?,
                    mem_map: opt!("hipMemMap")?,
                    mem_set_access: opt!("hipMemSetAccess")?,
                    mem_release: opt!("hipMemRelease")?,
                    mem_unmap: opt!("hipMemUnmap")?,
                    mem_address_free: opt!("hipMemAddressFree")?,
                })
            })(),
            mem_ops: (|| {
                Some(HipMemOps {
                    wait_value32: opt!("hipStreamWaitValue32")?,
                    write_value32: opt!("hipStreamWriteValue32")?,
                })
            })(),
            stream_is_capturing: opt!("hipStreamIsCapturing"),
        };
        let mut rt = HipRuntime {
            path,
            fns,
            count: 0,
            _lib: lib,
        };
        let mut n: c_int = 0;
        // SAFETY: writes one int.
        let r = unsafe { (rt.fns.get_device_count)(&mut n) };
        match r {
            HIP_SUCCESS if n > 0 => {
                rt.count = n as usize;
                Ok(rt)
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
    fn vmm(&self) -> Result<HipVmm> {
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
    fn mem_op(
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

    fn err(&self, call: &'static str, e: HipError) -> Error {
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

    fn check(&self, call: &'static str, e: HipError) -> Result<()> {
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

/// An owned HIP stream.
#[derive(Debug)]
pub struct HipStreamHandle(pub *mut c_void, usize);

// SAFETY: a hipStream_t may be used from any thread (HIP streams are not thread-bound).
unsafe impl Send for HipStreamHandle {}
// SAFETY: HIP's stream calls are thread-safe.
unsafe impl Sync for HipStreamHandle {}

/// A HIP timing event of one device, destroyed on drop.
#[derive(Debug)]
pub struct HipEventHandle(HipEvent, usize);

// SAFETY: a hipEvent_t may be recorded, awaited and destroyed from any thread (HIP's
// event calls are thread-safe).
unsafe impl Send for HipEventHandle {}
// SAFETY: as above.
unsafe impl Sync for HipEventHandle {}

impl Drop for HipEventHandle {
    fn drop(&mut self) {
        if let Ok(rt) = crate::hip() {
            let _ = rt.with_device(self.1, || {
                // SAFETY: an event created by hipEventCreate, destroyed once.
                rt.check("hipEventDestroy", unsafe { (rt.fns.event_destroy)(self.0) })
            });
        }
    }
}

impl Runtime for HipRuntime {
    const NAME: &'static str = "HIP";
    const VENDOR: &'static str = "ROCm";
    type Stream = HipStreamHandle;
    type Event = HipEventHandle;

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
        let v = self.vmm()?;
        self.with_device(dev, || {
            let (mut base, mut size) = (0usize, 0usize);
            // SAFETY: writes the base and size of the allocation holding `addr`.
            self.check("hipMemGetAddressRange", unsafe {
                (v.mem_get_address_range)(&mut base, &mut size, addr)
            })?;
            let mut h: HipMemHandle = std::ptr::null_mut();
            // SAFETY: writes the handle backing `addr` (an error for non-VMM memory).
            self.check("hipMemRetainAllocationHandle", unsafe {
                (v.mem_retain_allocation_handle)(&mut h, addr as *mut c_void)
            })?;
            let mut fd: c_int = -1;
            // SAFETY: `h` was retained above; a POSIX descriptor is written as an int.
            let r = unsafe {
                (v.mem_export_to_shareable_handle)(
                    (&mut fd as *mut c_int).cast(),
                    h,
                    HIP_MEM_HANDLE_TYPE_POSIX_FD,
                    0,
                )
            };
            // SAFETY: releases the reference retained above; the owner's mapping stays.
            let _ = unsafe { (v.mem_release)(h) };
            self.check("hipMemExportToShareableHandle", r)?;
            if fd < 0 {
                return Err(Error::invalid(
                    "export",
                    "the runtime returned no descriptor",
                ));
            }
            // SAFETY: a descriptor the runtime just created for us; owned from here.
            let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
            Ok(Exported { fd, base, size })
        })
    }

    fn import_memory(
        &self,
        dev: usize,
        fd: std::os::fd::BorrowedFd<'_>,
        size: usize,
    ) -> Result<usize> {
        let v = self.vmm()?;
        self.with_device(dev, || {
            let mut h: HipMemHandle = std::ptr::null_mut();
            // SAFETY: `fd` was exported by hipMemExportToShareableHandle (the runtime checks
            // it); for POSIX descriptors the handle argument is the descriptor's value (as in
            // HIP's own IPC tests).
            self.check("hipMemImportFromShareableHandle", unsafe {
                (v.mem_import_from_shareable_handle)(
                    &mut h,
                    fd.as_raw_fd() as isize as *mut c_void,
                    HIP_MEM_HANDLE_TYPE_POSIX_FD,
                )
            })?;
            let mut va: *mut c_void = std::ptr::null_mut();
            // SAFETY: reserves address space only.
            let r = unsafe { (v.mem_address_reserve)(&mut va, size, 0, std::ptr::null_mut(), 0) };
            if r != HIP_SUCCESS {
                // SAFETY: the imported handle, released once.
                let _ = unsafe { (v.mem_release)(h) };
                return Err(self.err("hipMemAddressReserve", r));
            }
            // SAFETY: maps the whole imported allocation at the reservation above.
            let mapped = unsafe { (v.mem_map)(va, size, 0, h, 0) };
            // SAFETY: the imported handle, released once (the mapping keeps the memory).
            let _ = unsafe { (v.mem_release)(h) };
            let desc = HipMemAccessDesc {
                location_type: HIP_MEM_LOCATION_TYPE_DEVICE,
                location_id: dev as c_int,
                flags: HIP_MEM_ACCESS_FLAGS_PROT_READ_WRITE,
            };
            let access = if mapped == HIP_SUCCESS {
                // SAFETY: grants `dev` access to the mapping made above.
                unsafe { (v.mem_set_access)(va, size, &desc, 1) }
            } else {
                mapped
            };
            if access != HIP_SUCCESS {
                if mapped == HIP_SUCCESS {
                    // SAFETY: the mapping made above, unused, unmapped once.
                    let _ = unsafe { (v.mem_unmap)(va, size) };
                }
                // SAFETY: the reservation made above, freed once.
                let _ = unsafe { (v.mem_address_free)(va, size) };
                let call = if mapped == HIP_SUCCESS {
                    "hipMemSetAccess"
                } else {
                    "hipMemMap"
                };
                return Err(self.err(call, access));
            }
            Ok(va as usize)
        })
    }

    unsafe fn unmap_imported(&self, dev: usize, addr: usize, size: usize) -> Result<()> {
        let v = self.vmm()?;
        self.with_device(dev, || {
            // SAFETY: the trait contract: a mapping of `import_memory`, idle, unmapped once.
            self.check("hipMemUnmap", unsafe {
                (v.mem_unmap)(addr as *mut c_void, size)
            })?;
            // SAFETY: its reservation, freed once.
            self.check("hipMemAddressFree", unsafe {
                (v.mem_address_free)(addr as *mut c_void, size)
            })
        })
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
            Ok(HipStreamHandle(s, dev))
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

impl Drop for HipStreamHandle {
    fn drop(&mut self) {
        // The runtime is process-wide (crate::hip()); a stream outliving it cannot exist
        // because every stream holds the runtime through its ApiStream.
        if let Ok(rt) = crate::hip() {
            let _ = rt.with_device(self.1, || {
                // SAFETY: a stream created by hipStreamCreateWithFlags, destroyed once.
                rt.check("hipStreamDestroy", unsafe {
                    (rt.fns.stream_destroy)(self.0)
                })
            });
        }
    }
}
