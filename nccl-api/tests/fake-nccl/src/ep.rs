//! A fake NCCL EP (`nccl_ep.h`, API version 2) for a world of one rank over host memory:
//! every structure's size and magic checked as the library checks them, the group's
//! configuration kept for the test to read (`unicommFakeEpConfig`), a dispatch that
//! places each routed token in its expert's next slot in `(token, k)` order with the
//! counts, and a combine that sums each token's rows weighted, in f32, rounded once to
//! bf16. Exported only by the fakes of NCCL 2.30 and newer (NCCL EP is built against
//! 2.30.7).

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

use super::{count, fail, R, INVALID_ARGUMENT, OK};

const MAGIC: c_uint = 0xC00F_FFEE;
const TENSOR_MAGIC: c_uint = 0xCAFE_CAFE;

#[repr(C)]
pub struct Tensor {
    size: c_uint,
    magic: c_uint,
    ndim: c_uint,
    datatype: c_int,
    data: *mut c_void,
    win_hdl: *mut c_void,
    win_offset: u64,
    sizes: *mut usize,
}

/// The group configuration's words the fake reads (its V1 prefix and `num_topk`).
#[repr(C)]
pub struct GroupConfig {
    size: c_uint,
    magic: c_uint,
    version: c_uint,
    algorithm: c_int,
    num_experts: c_uint,
    max_dispatch_tokens_per_rank: c_uint,
    max_recv_tokens_per_rank: c_uint,
    max_token_bytes: c_uint,
    rest: [u8; 72],
    num_topk: c_uint,
    padding: [u8; 4],
}

#[repr(C)]
pub struct Head {
    size: c_uint,
    magic: c_uint,
}

#[repr(C)]
pub struct Args {
    head: Head,
    tokens: *mut Tensor,
    topk_weights: *mut Tensor,
    scales: *mut Tensor,
}

#[repr(C)]
pub struct LayoutInfo {
    head: Head,
    expert_counters: *mut Tensor,
}

/// A group: `[experts, max tokens, token bytes, top-k]`.
pub struct Group([usize; 4]);

/// A handle: its group's capacities and the routing of the last update.
pub struct Handle {
    caps: [usize; 4],
    ids: Vec<i32>,
    /// Per `(token, k)`, the slot its row went to (`None`: not routed).
    slots: Vec<Option<usize>>,
}

static CONFIG: Mutex<[u32; 6]> = Mutex::new([0; 6]);

unsafe fn head_ok(h: *const Head, min: c_uint) -> bool {
    !h.is_null() && (*h).size >= min && (*h).magic == MAGIC
}

unsafe fn tensor_ok(t: *const Tensor, dtype: c_int, dims: &[usize]) -> bool {
    if t.is_null() || (*t).magic != TENSOR_MAGIC || (*t).size != 48 {
        return false;
    }
    let t = &*t;
    t.datatype == dtype
        && t.ndim as usize == dims.len()
        && std::slice::from_raw_parts(t.sizes, dims.len()) == dims
}

#[no_mangle]
pub unsafe extern "C" fn ncclEpGetVersion(v: *mut c_int) -> R {
    count("ncclEpGetVersion");
    *v = 200;
    OK
}

/// The last group's `[size, version, experts, max tokens, token bytes, top-k]`.
#[no_mangle]
pub unsafe extern "C" fn unicommFakeEpConfig(out: *mut [u32; 6]) {
    *out = *CONFIG.lock().unwrap();
}

#[no_mangle]
pub unsafe extern "C" fn ncclEpCreateGroup(
    g: *mut *mut Group,
    comm: *mut c_void,
    c: *const GroupConfig,
) -> R {
    count("ncclEpCreateGroup");
    if comm.is_null() || c.is_null() || (*c).size < 96 || (*c).magic != MAGIC {
        return fail(INVALID_ARGUMENT, "ncclEpCreateGroup: a bad configuration");
    }
    let c = &*c;
    *CONFIG.lock().unwrap() = [
        c.size,
        c.version,
        c.num_experts,
        c.max_dispatch_tokens_per_rank,
        c.max_token_bytes,
        c.num_topk,
    ];
    let caps = [c.num_experts, c.max_dispatch_tokens_per_rank, c.max_token_bytes, c.num_topk];
    *g = Box::into_raw(Box::new(Group(caps.map(|x| x as usize))));
    OK
}

#[no_mangle]
pub unsafe extern "C" fn ncclEpGroupDestroy(g: *mut Group) -> R {
    count("ncclEpGroupDestroy");
    drop(Box::from_raw(g));
    OK
}

#[no_mangle]
pub unsafe extern "C" fn ncclEpInitHandle(
    h: *mut *mut Handle,
    g: *mut Group,
    layout: c_int,
    config: *const Head,
    num_topk: c_int,
    _mem: *const Tensor,
) -> R {
    count("ncclEpInitHandle");
    if layout != 1 || !head_ok(config, 16) || num_topk as usize != (*g).0[3] {
        return fail(INVALID_ARGUMENT, "ncclEpInitHandle: layout, config or top-k");
    }
    let handle = Handle { caps: (*g).0, ids: Vec::new(), slots: Vec::new() };
    *h = Box::into_raw(Box::new(handle));
    OK
}

#[no_mangle]
pub unsafe extern "C" fn ncclEpHandleDestroy(h: *mut Handle) -> R {
    count("ncclEpHandleDestroy");
    drop(Box::from_raw(h));
    OK
}

#[no_mangle]
pub unsafe extern "C" fn ncclEpUpdateHandle(
    h: *mut Handle,
    ids: *const Tensor,
    layout: *const c_void,
    _stream: *mut c_void,
) -> R {
    count("ncclEpUpdateHandle");
    let h = &mut *h;
    let n = if ids.is_null() { 0 } else { *(*ids).sizes };
    if !layout.is_null() || !tensor_ok(ids, 2, &[n, h.caps[3]]) || n > h.caps[1] {
        return fail(INVALID_ARGUMENT, "ncclEpUpdateHandle: the routing");
    }
    h.ids = match n {
        0 => Vec::new(),
        _ => std::slice::from_raw_parts((*ids).data as *const i32, n * h.caps[3]).to_vec(),
    };
    OK
}

#[no_mangle]
pub unsafe extern "C" fn ncclEpDispatch(
    h: *mut Handle,
    inputs: *const Args,
    outputs: *const Args,
    layout: *const LayoutInfo,
    _config: *const c_void,
    _stream: *mut c_void,
) -> R {
    count("ncclEpDispatch");
    let h = &mut *h;
    let [experts, m, bytes, k] = h.caps;
    let n = h.ids.len() / k;
    let row = bytes;
    let ok = head_ok(&(*inputs).head, 32)
        && head_ok(&(*outputs).head, 40)
        && head_ok(&(*layout).head, 40)
        && tensor_ok((*inputs).tokens, 9, &[n, row / 2])
        && tensor_ok((*outputs).tokens, 9, &[experts, m, row / 2])
        && tensor_ok((*layout).expert_counters, 2, &[experts]);
    if !ok {
        return fail(INVALID_ARGUMENT, "ncclEpDispatch: a descriptor");
    }
    let src = (*(*inputs).tokens).data as *const u8;
    let out = (*(*outputs).tokens).data as *mut u8;
    let counts = (*(*layout).expert_counters).data as *mut i32;
    let mut have = vec![0usize; experts];
    h.slots = vec![None; n * k];
    for (i, &e) in h.ids.iter().enumerate() {
        if e < 0 || e as usize >= experts {
            continue;
        }
        let (e, t) = (e as usize, i / k);
        let slot = e * m + have[e];
        std::ptr::copy_nonoverlapping(src.add(t * row), out.add(slot * row), row);
        h.slots[i] = Some(slot);
        have[e] += 1;
    }
    for (e, &c) in have.iter().enumerate() {
        *counts.add(e) = c as i32;
    }
    OK
}

fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

fn f32_to_bf16(f: f32) -> u16 {
    let b = f.to_bits();
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

#[no_mangle]
pub unsafe extern "C" fn ncclEpCombine(
    h: *mut Handle,
    inputs: *const Args,
    outputs: *const Args,
    _config: *const c_void,
    _stream: *mut c_void,
) -> R {
    count("ncclEpCombine");
    let h = &*h;
    let [experts, m, bytes, k] = h.caps;
    let (n, hidden) = (h.ids.len() / k, bytes / 2);
    // The outputs' second field is the weights (`ncclEpCombineOutputs_t`).
    let weights = (*outputs).topk_weights;
    let ok = head_ok(&(*inputs).head, 24)
        && head_ok(&(*outputs).head, 24)
        && tensor_ok((*inputs).tokens, 9, &[experts, m, hidden])
        && tensor_ok((*outputs).tokens, 9, &[n, hidden])
        && tensor_ok(weights, 7, &[n, k]);
    if !ok {
        return fail(INVALID_ARGUMENT, "ncclEpCombine: a descriptor");
    }
    let rows = (*(*inputs).tokens).data as *const u16;
    let out = (*(*outputs).tokens).data as *mut u16;
    let w = (*weights).data as *const f32;
    for t in 0..n {
        for x in 0..hidden {
            let mut acc = 0f32;
            for j in 0..k {
                if let Some(slot) = h.slots[t * k + j] {
                    acc += *w.add(t * k + j) * bf16_to_f32(*rows.add(slot * hidden + x));
                }
            }
            *out.add(t * hidden + x) = f32_to_bf16(acc);
        }
    }
    OK
}
