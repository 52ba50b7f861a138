//! HIP on CUDA, for tests: the HIP runtime calls backend-rccl makes, each forwarded to the
//! CUDA driver API. HIP's result codes are CUDA's where the two agree (0 success, 600 not
//! ready, 704 peer access already enabled, ...); the driver's code is returned as it is.
//! Every device works in its primary context (what the CUDA runtime inside NCCL uses), made
//! current by `hipSetDevice` on the calling thread. A symbol the backend needs and this
//! library lacks makes the backend's loader fail with `MissingSymbol`: nothing is a silent
//! no-op.
#![allow(clippy::missing_safety_doc, non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

type R = c_int;
type Dev = c_int;
type Ctx = *mut c_void;
type Stream = *mut c_void;
type Event = *mut c_void;
type Handle = u64;

const NOT_INITIALIZED: R = 3;

extern "C" {
    fn dlopen(name: *const c_char, flags: c_int) -> *mut c_void;
    fn dlsym(lib: *mut c_void, name: *const c_char) -> *mut c_void;
}

/// The driver library, opened once.
fn cuda() -> *mut c_void {
    static LIB: OnceLock<usize> = OnceLock::new();
    *LIB.get_or_init(|| {
        // RTLD_NOW | RTLD_GLOBAL.
        // SAFETY: loading the driver runs its initialisers, as the CUDA runtime does.
        let l = unsafe { dlopen(c"libcuda.so.1".as_ptr(), 2 | 0x100) };
        l as usize
    }) as *mut c_void
}

/// A driver function by name (`None` where the driver lacks it).
macro_rules! cu {
    ($name:literal : fn($($a:ty),*)) => {{
        static F: OnceLock<usize> = OnceLock::new();
        let p = *F.get_or_init(|| {
            let lib = cuda();
            if lib.is_null() {
                return 0;
            }
            // SAFETY: a NUL-terminated name; dlsym only looks it up.
            #[allow(unused_unsafe)]
            unsafe { dlsym(lib, concat!($name, "\0").as_ptr().cast()) as usize }
        });
        if p == 0 {
            None
        } else {
            // SAFETY: the driver's function of that name has this signature (cuda.h).
            #[allow(unused_unsafe)]
            Some(unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($a),*) -> R>(p) })
        }
    }};
}

/// Calls the driver function, or returns "not initialized" where it is absent.
macro_rules! call {
    ($name:literal : fn($($a:ty),*) ($($v:expr),*)) => {
        match cu!($name: fn($($a),*)) {
            Some(f) => f($($v),*),
            None => NOT_INITIALIZED,
        }
    };
}

fn init() -> R {
    static DONE: OnceLock<R> = OnceLock::new();
    // SAFETY: cuInit takes flags 0.
    *DONE.get_or_init(|| unsafe { call!("cuInit": fn(c_uint) (0)) })
}

/// The primary context of device `d`, retained once.
unsafe fn primary(d: Dev) -> Result<Ctx, R> {
    static CTXS: std::sync::Mutex<Vec<(Dev, usize)>> = std::sync::Mutex::new(Vec::new());
    let r = init();
    if r != 0 {
        return Err(r);
    }
    let mut ctxs = CTXS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, c)) = ctxs.iter().find(|(x, _)| *x == d) {
        return Ok(c as Ctx);
    }
    let dev = device(d)?;
    let mut c: Ctx = std::ptr::null_mut();
    let r = call!("cuDevicePrimaryCtxRetain": fn(*mut Ctx, c_int) (&mut c, dev));
    if r != 0 {
        return Err(r);
    }
    ctxs.push((d, c as usize));
    Ok(c)
}

thread_local! {
    static CURRENT: std::cell::Cell<Dev> = const { std::cell::Cell::new(0) };
}

/// Makes the calling thread's device current (device 0 until `hipSetDevice`).
unsafe fn current() -> R {
    match primary(CURRENT.with(|c| c.get())) {
        Ok(c) => call!("cuCtxSetCurrent": fn(Ctx) (c)),
        Err(r) => r,
    }
}

macro_rules! in_ctx {
    ($e:expr) => {{
        let r = current();
        if r != 0 {
            return r;
        }
        $e
    }};
}

#[no_mangle]
pub unsafe extern "C" fn hipGetDeviceCount(n: *mut c_int) -> R {
    let r = init();
    if r != 0 {
        *n = 0;
        // hipErrorNoDevice, as HIP reports a machine without its GPUs.
        return 100;
    }
    call!("cuDeviceGetCount": fn(*mut c_int) (n))
}

#[no_mangle]
pub unsafe extern "C" fn hipSetDevice(d: c_int) -> R {
    CURRENT.with(|c| c.set(d));
    current()
}

#[no_mangle]
pub unsafe extern "C" fn hipGetDevice(d: *mut c_int) -> R {
    *d = CURRENT.with(|c| c.get());
    0
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamCreateWithFlags(s: *mut Stream, flags: c_uint) -> R {
    // hipStreamNonBlocking = CU_STREAM_NON_BLOCKING = 1.
    in_ctx!(call!("cuStreamCreate": fn(*mut Stream, c_uint) (s, flags)))
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamDestroy(s: Stream) -> R {
    call!("cuStreamDestroy_v2": fn(Stream) (s))
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamSynchronize(s: Stream) -> R {
    in_ctx!(call!("cuStreamSynchronize": fn(Stream) (s)))
}

#[no_mangle]
pub unsafe extern "C" fn hipDeviceSynchronize() -> R {
    in_ctx!(call!("cuCtxSynchronize": fn() ()))
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamQuery(s: Stream) -> R {
    in_ctx!(call!("cuStreamQuery": fn(Stream) (s)))
}

#[no_mangle]
pub unsafe extern "C" fn hipMalloc(p: *mut *mut c_void, n: usize) -> R {
    in_ctx!(call!("cuMemAlloc_v2": fn(*mut *mut c_void, usize) (p, n)))
}

#[no_mangle]
pub unsafe extern "C" fn hipFree(p: *mut c_void) -> R {
    in_ctx!(call!("cuMemFree_v2": fn(*mut c_void) (p)))
}

#[no_mangle]
pub unsafe extern "C" fn hipMemcpyAsync(dst: *mut c_void, src: *const c_void, n: usize, _kind: c_int, s: Stream) -> R {
    // Unified addressing: the driver tells host from device memory by the pointers.
    in_ctx!(call!("cuMemcpyAsync": fn(*mut c_void, *const c_void, usize, Stream) (dst, src, n, s)))
}

#[no_mangle]
pub unsafe extern "C" fn hipGetErrorString(r: R) -> *const c_char {
    let mut s: *const c_char = std::ptr::null();
    if call!("cuGetErrorString": fn(R, *mut *const c_char) (r, &mut s)) == 0 && !s.is_null() {
        return s;
    }
    c"hip-on-cuda: unknown error".as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn hipGetErrorName(r: R) -> *const c_char {
    let mut s: *const c_char = std::ptr::null();
    if call!("cuGetErrorName": fn(R, *mut *const c_char) (r, &mut s)) == 0 && !s.is_null() {
        return s;
    }
    c"hipErrorUnknown".as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn hipRuntimeGetVersion(v: *mut c_int) -> R {
    call!("cuDriverGetVersion": fn(*mut c_int) (v))
}

#[no_mangle]
pub unsafe extern "C" fn hipDriverGetVersion(v: *mut c_int) -> R {
    call!("cuDriverGetVersion": fn(*mut c_int) (v))
}

/// The driver's device of HIP's ordinal `d`.
unsafe fn device(d: c_int) -> Result<c_int, R> {
    let mut dev = 0;
    match call!("cuDeviceGet": fn(*mut c_int, c_int) (&mut dev, d)) {
        0 => Ok(dev),
        r => Err(r),
    }
}

#[no_mangle]
pub unsafe extern "C" fn hipDeviceGetName(name: *mut c_char, len: c_int, d: c_int) -> R {
    match device(d) {
        Ok(dev) => call!("cuDeviceGetName": fn(*mut c_char, c_int, c_int) (name, len, dev)),
        Err(r) => r,
    }
}

#[no_mangle]
pub unsafe extern "C" fn hipDeviceGetPCIBusId(id: *mut c_char, len: c_int, d: c_int) -> R {
    match device(d) {
        Ok(dev) => call!("cuDeviceGetPCIBusId": fn(*mut c_char, c_int, c_int) (id, len, dev)),
        Err(r) => r,
    }
}

#[no_mangle]
pub unsafe extern "C" fn hipEventCreate(e: *mut Event) -> R {
    in_ctx!(call!("cuEventCreate": fn(*mut Event, c_uint) (e, 0)))
}

#[no_mangle]
pub unsafe extern "C" fn hipEventRecord(e: Event, s: Stream) -> R {
    in_ctx!(call!("cuEventRecord": fn(Event, Stream) (e, s)))
}

#[no_mangle]
pub unsafe extern "C" fn hipEventSynchronize(e: Event) -> R {
    in_ctx!(call!("cuEventSynchronize": fn(Event) (e)))
}

#[no_mangle]
pub unsafe extern "C" fn hipEventQuery(e: Event) -> R {
    in_ctx!(call!("cuEventQuery": fn(Event) (e)))
}

#[no_mangle]
pub unsafe extern "C" fn hipEventElapsedTime(ms: *mut f32, a: Event, b: Event) -> R {
    in_ctx!(call!("cuEventElapsedTime": fn(*mut f32, Event, Event) (ms, a, b)))
}

#[no_mangle]
pub unsafe extern "C" fn hipEventDestroy(e: Event) -> R {
    call!("cuEventDestroy_v2": fn(Event) (e))
}

#[no_mangle]
pub unsafe extern "C" fn hipDeviceEnablePeerAccess(peer: c_int, flags: c_uint) -> R {
    let c = match primary(peer) {
        Ok(c) => c,
        Err(r) => return r,
    };
    in_ctx!(call!("cuCtxEnablePeerAccess": fn(Ctx, c_uint) (c, flags)))
}

#[no_mangle]
pub unsafe extern "C" fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> R {
    in_ctx!(call!("cuMemGetInfo_v2": fn(*mut usize, *mut usize) (free, total)))
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamWaitEvent(s: Stream, e: Event, flags: c_uint) -> R {
    in_ctx!(call!("cuStreamWaitEvent": fn(Stream, Event, c_uint) (s, e, flags)))
}

#[no_mangle]
pub unsafe extern "C" fn hipLaunchHostFunc(s: Stream, f: unsafe extern "C" fn(*mut c_void), arg: *mut c_void) -> R {
    in_ctx!(call!("cuLaunchHostFunc": fn(Stream, unsafe extern "C" fn(*mut c_void), *mut c_void) (s, f, arg)))
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamIsCapturing(s: Stream, status: *mut c_int) -> R {
    in_ctx!(call!("cuStreamIsCapturing": fn(Stream, *mut c_int) (s, status)))
}

#[no_mangle]
pub unsafe extern "C" fn hipDeviceGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) -> R {
    in_ctx!(call!("cuCtxGetStreamPriorityRange": fn(*mut c_int, *mut c_int) (least, greatest)))
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamCreateWithPriority(s: *mut Stream, flags: c_uint, priority: c_int) -> R {
    in_ctx!(call!("cuStreamCreateWithPriority": fn(*mut Stream, c_uint, c_int) (s, flags, priority)))
}

// Graphs: HIP's capture modes, graph handles and flags are CUDA's.
#[no_mangle]
pub unsafe extern "C" fn hipStreamBeginCapture(s: Stream, mode: c_int) -> R {
    in_ctx!(call!("cuStreamBeginCapture_v2": fn(Stream, c_int) (s, mode)))
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamEndCapture(s: Stream, g: *mut *mut c_void) -> R {
    in_ctx!(call!("cuStreamEndCapture": fn(Stream, *mut *mut c_void) (s, g)))
}

#[no_mangle]
pub unsafe extern "C" fn hipGraphInstantiateWithFlags(e: *mut *mut c_void, g: *mut c_void, flags: u64) -> R {
    in_ctx!(call!("cuGraphInstantiateWithFlags": fn(*mut *mut c_void, *mut c_void, u64) (e, g, flags)))
}

#[no_mangle]
pub unsafe extern "C" fn hipGraphLaunch(e: *mut c_void, s: Stream) -> R {
    in_ctx!(call!("cuGraphLaunch": fn(*mut c_void, Stream) (e, s)))
}

#[no_mangle]
pub unsafe extern "C" fn hipGraphExecDestroy(e: *mut c_void) -> R {
    call!("cuGraphExecDestroy": fn(*mut c_void) (e))
}

#[no_mangle]
pub unsafe extern "C" fn hipGraphDestroy(g: *mut c_void) -> R {
    call!("cuGraphDestroy": fn(*mut c_void) (g))
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamWaitValue32(s: Stream, p: *mut c_void, v: u32, flags: c_uint, mask: u32) -> R {
    if mask != u32::MAX {
        // CUDA's wait has no mask: hipErrorInvalidValue rather than another comparison.
        return 1;
    }
    in_ctx!(call!("cuStreamWaitValue32_v2": fn(Stream, *mut c_void, u32, c_uint) (s, p, v, flags)))
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamWriteValue32(s: Stream, p: *mut c_void, v: u32, flags: c_uint) -> R {
    in_ctx!(call!("cuStreamWriteValue32_v2": fn(Stream, *mut c_void, u32, c_uint) (s, p, v, flags)))
}

// Virtual memory: HIP's structures and values are CUDA's here (the handle type POSIX file
// descriptor = 1, location type device = 1, read-write access = 3, the access descriptor
// { { type, id }, flags }).

#[no_mangle]
pub unsafe extern "C" fn hipMemGetAddressRange(base: *mut usize, size: *mut usize, p: usize) -> R {
    in_ctx!(call!("cuMemGetAddressRange_v2": fn(*mut usize, *mut usize, usize) (base, size, p)))
}

#[no_mangle]
pub unsafe extern "C" fn hipMemRetainAllocationHandle(h: *mut Handle, p: *mut c_void) -> R {
    in_ctx!(call!("cuMemRetainAllocationHandle": fn(*mut Handle, *mut c_void) (h, p)))
}

#[no_mangle]
pub unsafe extern "C" fn hipMemExportToShareableHandle(out: *mut c_void, h: Handle, kind: c_int, flags: u64) -> R {
    in_ctx!(call!("cuMemExportToShareableHandle": fn(*mut c_void, Handle, c_int, u64) (out, h, kind, flags)))
}

#[no_mangle]
pub unsafe extern "C" fn hipMemImportFromShareableHandle(h: *mut Handle, os: *mut c_void, kind: c_int) -> R {
    in_ctx!(call!("cuMemImportFromShareableHandle": fn(*mut Handle, *mut c_void, c_int) (h, os, kind)))
}

#[no_mangle]
pub unsafe extern "C" fn hipMemAddressReserve(p: *mut *mut c_void, size: usize, align: usize, addr: *mut c_void, flags: u64) -> R {
    in_ctx!(call!("cuMemAddressReserve": fn(*mut *mut c_void, usize, usize, *mut c_void, u64) (p, size, align, addr, flags)))
}

#[no_mangle]
pub unsafe extern "C" fn hipMemMap(p: *mut c_void, size: usize, offset: usize, h: Handle, flags: u64) -> R {
    in_ctx!(call!("cuMemMap": fn(*mut c_void, usize, usize, Handle, u64) (p, size, offset, h, flags)))
}

#[no_mangle]
pub unsafe extern "C" fn hipMemSetAccess(p: *mut c_void, size: usize, desc: *const c_void, n: usize) -> R {
    in_ctx!(call!("cuMemSetAccess": fn(*mut c_void, usize, *const c_void, usize) (p, size, desc, n)))
}

#[no_mangle]
pub unsafe extern "C" fn hipMemRelease(h: Handle) -> R {
    in_ctx!(call!("cuMemRelease": fn(Handle) (h)))
}

#[no_mangle]
pub unsafe extern "C" fn hipMemUnmap(p: *mut c_void, size: usize) -> R {
    in_ctx!(call!("cuMemUnmap": fn(*mut c_void, usize) (p, size)))
}

#[no_mangle]
pub unsafe extern "C" fn hipMemAddressFree(p: *mut c_void, size: usize) -> R {
    in_ctx!(call!("cuMemAddressFree": fn(*mut c_void, usize) (p, size)))
}

// Host memory the device maps and kernel modules (unicomm's symmetric kernels): HIP's
// flags hipHostMallocPortable (1) and hipHostMallocMapped (2) are CUDA's
// CU_MEMHOSTALLOC_PORTABLE and CU_MEMHOSTALLOC_DEVICEMAP; a module's image is PTX.

#[no_mangle]
pub unsafe extern "C" fn hipHostMalloc(p: *mut *mut c_void, size: usize, flags: c_uint) -> R {
    in_ctx!(call!("cuMemHostAlloc": fn(*mut *mut c_void, usize, c_uint) (p, size, flags)))
}

#[no_mangle]
pub unsafe extern "C" fn hipHostGetDevicePointer(d: *mut *mut c_void, h: *mut c_void, flags: c_uint) -> R {
    in_ctx!(call!("cuMemHostGetDevicePointer_v2": fn(*mut *mut c_void, *mut c_void, c_uint) (d, h, flags)))
}

#[no_mangle]
pub unsafe extern "C" fn hipHostFree(p: *mut c_void) -> R {
    in_ctx!(call!("cuMemFreeHost": fn(*mut c_void) (p)))
}

#[no_mangle]
pub unsafe extern "C" fn hipModuleLoadData(m: *mut *mut c_void, image: *const c_void) -> R {
    in_ctx!(call!("cuModuleLoadData": fn(*mut *mut c_void, *const c_void) (m, image)))
}

#[no_mangle]
pub unsafe extern "C" fn hipModuleGetFunction(f: *mut *mut c_void, m: *mut c_void, name: *const c_char) -> R {
    in_ctx!(call!("cuModuleGetFunction": fn(*mut *mut c_void, *mut c_void, *const c_char) (f, m, name)))
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn hipModuleLaunchKernel(
    f: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    s: Stream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> R {
    in_ctx!(call!("cuLaunchKernel": fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Stream, *mut *mut c_void, *mut *mut c_void) (f, gx, gy, gz, bx, by, bz, shared, s, params, extra)))
}
