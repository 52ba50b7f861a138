//! NCCL 2.32's `nccl*Config` entry points: each checks the `ncclCollConfig_t` header NCCL
//! checks (size, magic), counts one line naming the fields it received (the tests read them
//! with `unicommFakeCalls`), then runs the plain call.

use std::ffi::{c_char, c_int, c_void, CStr};

use super::*;

/// `ncclCollConfig_v23200`.
#[repr(C)]
pub struct CollConfig {
    size: usize,
    magic: u32,
    version: u32,
    ext: *mut c_void,
    min_ctas: c_int,
    max_ctas: c_int,
    nvls_ctas: c_int,
    cga_cluster_size: c_int,
    alg_selection: *const c_char,
    force_alg_selection: c_int,
    cta_policy: c_int,
    user_profiler_tag: u64,
    launch_completion_event: *mut c_void,
}

/// Records `cfg` for `call`; an error code where NCCL would refuse its header.
unsafe fn seen(call: &str, cfg: *const CollConfig) -> Option<R> {
    count(call);
    if cfg.is_null() {
        return None;
    }
    let c = &*cfg;
    if c.magic != 0xcafe_beef || c.size != std::mem::size_of::<CollConfig>() || c.version < 23200 {
        return Some(fail(INVALID_ARGUMENT, "fake: an ncclCollConfig_t NCCL 2.32 does not take"));
    }
    let alg = if c.alg_selection.is_null() {
        "-".to_string()
    } else {
        CStr::from_ptr(c.alg_selection).to_string_lossy().into_owned()
    };
    let int = |x: c_int| if x == c_int::MIN { "-".to_string() } else { x.to_string() };
    count(&format!(
        "collconfig version={} min={} max={} nvls={} cga={} alg={alg} force={} policy={} tag={} event={}",
        c.version,
        int(c.min_ctas),
        int(c.max_ctas),
        int(c.nvls_ctas),
        int(c.cga_cluster_size),
        c.force_alg_selection,
        int(c.cta_policy),
        c.user_profiler_tag,
        if c.launch_completion_event.is_null() { "-" } else { "set" }
    ));
    None
}

#[no_mangle]
pub unsafe extern "C" fn ncclAllReduceConfig(s: *const c_void, r: *mut c_void, n: usize, t: c_int, op: c_int, c: *mut Comm, st: *mut c_void, cfg: *const CollConfig) -> R {
    seen("ncclAllReduceConfig", cfg).unwrap_or_else(|| ncclAllReduce(s, r, n, t, op, c, st))
}

#[no_mangle]
pub unsafe extern "C" fn ncclBroadcastConfig(s: *const c_void, r: *mut c_void, n: usize, t: c_int, root: c_int, c: *mut Comm, st: *mut c_void, cfg: *const CollConfig) -> R {
    seen("ncclBroadcastConfig", cfg).unwrap_or_else(|| ncclBroadcast(s, r, n, t, root, c, st))
}

#[no_mangle]
pub unsafe extern "C" fn ncclReduceConfig(s: *const c_void, r: *mut c_void, n: usize, t: c_int, op: c_int, root: c_int, c: *mut Comm, st: *mut c_void, cfg: *const CollConfig) -> R {
    seen("ncclReduceConfig", cfg).unwrap_or_else(|| ncclReduce(s, r, n, t, op, root, c, st))
}

#[no_mangle]
pub unsafe extern "C" fn ncclAllGatherConfig(s: *const c_void, r: *mut c_void, n: usize, t: c_int, c: *mut Comm, st: *mut c_void, cfg: *const CollConfig) -> R {
    seen("ncclAllGatherConfig", cfg).unwrap_or_else(|| ncclAllGather(s, r, n, t, c, st))
}

#[no_mangle]
pub unsafe extern "C" fn ncclReduceScatterConfig(s: *const c_void, r: *mut c_void, n: usize, t: c_int, op: c_int, c: *mut Comm, st: *mut c_void, cfg: *const CollConfig) -> R {
    seen("ncclReduceScatterConfig", cfg).unwrap_or_else(|| ncclReduceScatter(s, r, n, t, op, c, st))
}

#[no_mangle]
pub unsafe extern "C" fn ncclAlltoAllConfig(s: *const c_void, r: *mut c_void, n: usize, t: c_int, c: *mut Comm, st: *mut c_void, cfg: *const CollConfig) -> R {
    seen("ncclAlltoAllConfig", cfg).unwrap_or_else(|| ncclAlltoAll(s, r, n, t, c, st))
}

#[no_mangle]
pub unsafe extern "C" fn ncclGatherConfig(s: *const c_void, r: *mut c_void, n: usize, t: c_int, root: c_int, c: *mut Comm, st: *mut c_void, cfg: *const CollConfig) -> R {
    seen("ncclGatherConfig", cfg).unwrap_or_else(|| ncclGather(s, r, n, t, root, c, st))
}

#[no_mangle]
pub unsafe extern "C" fn ncclScatterConfig(s: *const c_void, r: *mut c_void, n: usize, t: c_int, root: c_int, c: *mut Comm, st: *mut c_void, cfg: *const CollConfig) -> R {
    seen("ncclScatterConfig", cfg).unwrap_or_else(|| ncclScatter(s, r, n, t, root, c, st))
}
