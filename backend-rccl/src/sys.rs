//! The raw HIP table: the C types, constants and functions of `libamdhip64` that the
//! runtime calls, resolved with libloading (cudarc's `sys` level).

#![allow(unsafe_code, reason = "the HIP runtime through its loaded table")]

use std::ffi::{c_char, c_int, c_uint, c_void};

use unicomm_nccl_api::search::Search;

pub(crate) type HipError = c_int;
pub(crate) type HipStream = *mut c_void;

pub(crate) const HIP_SUCCESS: HipError = 0;
/// `hipErrorNoDevice`.
pub(crate) const HIP_ERROR_NO_DEVICE: HipError = 100;
/// `hipErrorInvalidDevice` (some runtimes answer this instead when no GPU exists).
pub(crate) const HIP_ERROR_INVALID_DEVICE: HipError = 101;
/// `hipErrorInsufficientDriver`: the kernel driver (amdgpu/KFD) is missing.
pub(crate) const HIP_ERROR_INSUFFICIENT_DRIVER: HipError = 35;
pub(crate) const HIP_MEMCPY_HOST_TO_DEVICE: c_int = 1;
pub(crate) const HIP_MEMCPY_DEVICE_TO_HOST: c_int = 2;
pub(crate) const HIP_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;
pub(crate) const HIP_STREAM_NON_BLOCKING: c_uint = 1;
/// `hipErrorPeerAccessAlreadyEnabled`.
pub(crate) const HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED: HipError = 704;
pub(crate) type HipEvent = *mut c_void;

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
    pub device_synchronize: unsafe extern "C" fn() -> HipError,
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
    /// `hipEventQuery`: whether an event was reached, without waiting (the flight
    /// recorder's completion tracking).
    pub event_query: Option<unsafe extern "C" fn(HipEvent) -> HipError>,
    /// Virtual memory management (the copy-engine path across processes): optional, so a
    /// runtime without it still loads (that path is then `Unsupported`).
    pub vmm: Option<HipVmm>,
    /// Stream memory operations (the copy-engine path's signals): optional; without them
    /// the path orders itself with RCCL barriers.
    pub mem_ops: Option<HipMemOps>,
    /// `hipLaunchHostFunc(stream, fn, arg)`: optional (host functions are then refused).
    pub launch_host_func: Option<
        unsafe extern "C" fn(HipStream, unsafe extern "C" fn(*mut c_void), *mut c_void) -> HipError,
    >,
    /// `hipStreamIsCapturing(stream, status)`: optional (graphs are then never seen).
    pub stream_is_capturing: Option<unsafe extern "C" fn(HipStream, *mut c_int) -> HipError>,
    /// HIP graphs (stream capture, instantiation, launch): optional; without them graph
    /// capture is `Unsupported`, naming the call.
    pub graphs: Option<HipGraphs>,
    /// `hipDeviceGetStreamPriorityRange(least, greatest)` and
    /// `hipStreamCreateWithPriority(stream, flags, priority)`: optional (prioritised streams
    /// are then `Unsupported`).
    pub priorities: Option<HipPriorities>,
    /// Host memory the device maps and modules of kernels (unicomm's symmetric kernels):
    /// optional, all or none (the kernels are then `Unsupported`, naming the calls).
    pub kernels: Option<HipKernels>,
}

/// `hipModule_t` and `hipFunction_t`.
pub(crate) type HipModule = *mut c_void;
/// `hipHostMallocPortable | hipHostMallocMapped`.
pub(crate) const HIP_HOST_MALLOC_PORTABLE_MAPPED: c_uint = 0x1 | 0x2;

/// The HIP calls of [`HipKernels`], in its fields' order.
pub const KERNEL_CALLS: [&str; 6] = [
    "hipHostMalloc",
    "hipHostGetDevicePointer",
    "hipHostFree",
    "hipModuleLoadData",
    "hipModuleGetFunction",
    "hipModuleLaunchKernel",
];

/// HIP's host-memory and module calls, each the function of the same name.
#[expect(
    missing_docs,
    reason = "each field is the HIP function of the same name"
)]
#[derive(Clone, Copy)]
pub struct HipKernels {
    pub host_malloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> HipError,
    pub host_get_device_pointer:
        unsafe extern "C" fn(*mut *mut c_void, *mut c_void, c_uint) -> HipError,
    pub host_free: unsafe extern "C" fn(*mut c_void) -> HipError,
    pub module_load_data: unsafe extern "C" fn(*mut HipModule, *const c_void) -> HipError,
    pub module_get_function:
        unsafe extern "C" fn(*mut HipModule, HipModule, *const c_char) -> HipError,
    #[allow(
        clippy::type_complexity,
        reason = "hipModuleLaunchKernel's C signature"
    )]
    pub module_launch_kernel: unsafe extern "C" fn(
        HipModule,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        HipStream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> HipError,
}

/// HIP's stream priority calls, each the function of the same name.
#[expect(
    missing_docs,
    reason = "each field is the HIP function of the same name"
)]
#[derive(Clone, Copy)]
pub struct HipPriorities {
    pub device_get_stream_priority_range: unsafe extern "C" fn(*mut c_int, *mut c_int) -> HipError,
    pub stream_create_with_priority:
        unsafe extern "C" fn(*mut HipStream, c_uint, c_int) -> HipError,
}

/// `hipGraph_t` and `hipGraphExec_t`.
pub(crate) type HipGraphT = *mut c_void;
/// `hipStreamCaptureModeThreadLocal` (CUDA's value too).
pub(crate) const HIP_STREAM_CAPTURE_MODE_THREAD_LOCAL: c_int = 1;

/// HIP's graph calls, each the function of the same name.
#[expect(
    missing_docs,
    reason = "each field is the HIP function of the same name"
)]
#[derive(Clone, Copy)]
pub struct HipGraphs {
    pub stream_begin_capture: unsafe extern "C" fn(HipStream, c_int) -> HipError,
    pub stream_end_capture: unsafe extern "C" fn(HipStream, *mut HipGraphT) -> HipError,
    pub graph_instantiate_with_flags:
        unsafe extern "C" fn(*mut HipGraphT, HipGraphT, u64) -> HipError,
    pub graph_launch: unsafe extern "C" fn(HipGraphT, HipStream) -> HipError,
    pub graph_exec_destroy: unsafe extern "C" fn(HipGraphT) -> HipError,
    pub graph_destroy: unsafe extern "C" fn(HipGraphT) -> HipError,
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
pub(crate) const HIP_STREAM_WAIT_VALUE_EQ: c_uint = 0x1;
/// `hipStreamWriteValueDefault`.
pub(crate) const HIP_STREAM_WRITE_VALUE_DEFAULT: c_uint = 0;

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
pub(crate) const HIP_MEM_HANDLE_TYPE_POSIX_FD: c_int = 1;

/// `hipMemAccessDesc`: `{ hipMemLocation { type, id }, flags }`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HipMemAccessDesc {
    pub(crate) location_type: c_int,
    pub(crate) location_id: c_int,
    pub(crate) flags: c_int,
}
/// `hipMemLocationTypeDevice`.
pub(crate) const HIP_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
/// `hipMemAccessFlagsProtReadWrite`.
pub(crate) const HIP_MEM_ACCESS_FLAGS_PROT_READ_WRITE: c_int = 3;

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
