//! Fake NCCL: one-rank worlds over host memory. Every entry point counts its calls
//! (`unicommFakeCalls`) so tests can see which path the layer took.
#![expect(
    clippy::missing_safety_doc,
    reason = "each export mirrors the NCCL function of the same name; nccl.h is its contract"
)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Mutex;

type R = c_int;
const OK: R = 0;
const INVALID_ARGUMENT: R = 4;
const INVALID_USAGE: R = 5;
const INTERNAL_ERROR: R = 3;
/// A count the fake refuses, to test error translation.
const REFUSED_COUNT: usize = 2989;

static CALLS: Mutex<Vec<(String, c_int)>> = Mutex::new(Vec::new());
static LAST: Mutex<String> = Mutex::new(String::new());
static GROUP: Mutex<(usize, Vec<(bool, usize, usize)>)> = Mutex::new((0, Vec::new()));

fn count(name: &str) {
    let mut c = CALLS.lock().unwrap();
    match c.iter_mut().find(|(n, _)| n == name) {
        Some((_, k)) => *k += 1,
        None => c.push((name.to_string(), 1)),
    }
}

fn fail(code: R, msg: &str) -> R {
    *LAST.lock().unwrap() = msg.to_string();
    code
}

/// `ncclUniqueId`, passed by value.
#[repr(C)]
pub struct Id {
    internal: [u8; 128],
}

#[repr(C)]
pub struct Comm {
    nranks: c_int,
    rank: c_int,
    /// Made by ncclCommSplit (calls on it are also counted as `<name>:split`).
    split: bool,
    /// Created by ncclCommInitRankConfig with `blocking = 0`: calls return ncclInProgress
    /// and settle after a few polls of ncclCommGetAsyncError.
    nonblocking: bool,
    /// Polls of ncclCommGetAsyncError still answered ncclInProgress (`u32::MAX`: forever).
    pending: u32,
    /// What ncclCommGetAsyncError reports once settled (`unicommFakeSetAsyncError`).
    async_error: R,
    /// A non-blocking communicator whose calls answer ncclSuccess at once, as NCCL's do once
    /// its connections exist (`unicommFakeAnswerSuccess`).
    answers_success: bool,
}

const IN_PROGRESS: R = 7;

impl Comm {
    fn new(nranks: c_int, split: bool, nonblocking: bool) -> Self {
        Comm { nranks, rank: 0, split, nonblocking, pending: 0, async_error: OK, answers_success: false }
    }
}

/// A non-blocking communicator's call: done, but reported as still running for 3 polls.
unsafe fn in_progress(c: *mut Comm, code: R) -> R {
    if code == OK && !c.is_null() && (*c).nonblocking && !(*c).answers_success {
        if (*c).pending != u32::MAX {
            (*c).pending = 3;
        }
        count("inProgress");
        return IN_PROGRESS;
    }
    code
}

/// Test control: `c`'s calls answer ncclSuccess at once from now on (non-blocking mode once
/// connected).
#[no_mangle]
pub unsafe extern "C" fn unicommFakeAnswerSuccess(c: *mut Comm) {
    (*c).answers_success = true;
}

/// Test control: what ncclCommGetAsyncError reports for `c` from now on.
#[no_mangle]
pub unsafe extern "C" fn unicommFakeSetAsyncError(c: *mut Comm, code: R) {
    (*c).async_error = code;
}

static INIT_DELAY_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static FINALIZE_DELAY_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static COLLECTIVE_DELAY_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static SPLIT_DELAY_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Test control: blocking ncclCommInitRank, ncclCommFinalize, ncclCommWindowRegister and
/// ncclCommSplit take this long (a peer that is late or never comes, as NCCL's blocking
/// calls wait for it).
#[no_mangle]
pub extern "C" fn unicommFakeDelay(init_ms: u64, finalize_ms: u64, window_ms: u64, split_ms: u64) {
    SPLIT_DELAY_MS.store(split_ms, std::sync::atomic::Ordering::SeqCst);
    INIT_DELAY_MS.store(init_ms, std::sync::atomic::Ordering::SeqCst);
    FINALIZE_DELAY_MS.store(finalize_ms, std::sync::atomic::Ordering::SeqCst);
    COLLECTIVE_DELAY_MS.store(window_ms, std::sync::atomic::Ordering::SeqCst);
}

static ALL_REDUCE_DELAY_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Test control: every ncclAllReduce of a world of one takes this long (a library call
/// stuck in the driver, with the communicator's lock held by its caller).
#[no_mangle]
pub extern "C" fn unicommFakeDelayAllReduce(ms: u64) {
    ALL_REDUCE_DELAY_MS.store(ms, std::sync::atomic::Ordering::SeqCst);
}

fn delay(d: &std::sync::atomic::AtomicU64) {
    let ms = d.load(std::sync::atomic::Ordering::SeqCst);
    if ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// The test's count of signal waits in progress (the host runtime's), or null.
static ABORT_WAITS_FOR: std::sync::atomic::AtomicPtr<std::sync::atomic::AtomicUsize> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// Test control: ncclCommAbort returns only once `*waiting` is 0 (at most 20 s), as NCCL
/// 2.28's abort synchronizes with the device before it returns, which a stream held in a
/// signal wait never lets it do. `waiting` must live as long as the library (a static).
#[no_mangle]
pub unsafe extern "C" fn unicommFakeAbortWaitsFor(waiting: *const std::sync::atomic::AtomicUsize) {
    ABORT_WAITS_FOR.store(waiting.cast_mut(), std::sync::atomic::Ordering::SeqCst);
}

/// Test control: `c`'s calls never settle (ncclInProgress forever).
#[no_mangle]
pub unsafe extern "C" fn unicommFakeStickInProgress(c: *mut Comm) {
    (*c).pending = u32::MAX;
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(c: *mut Comm, out: *mut R) -> R {
    count("ncclCommGetAsyncError");
    let c = &mut *c;
    *out = if c.pending > 0 {
        if c.pending != u32::MAX {
            c.pending -= 1;
        }
        IN_PROGRESS
    } else {
        c.async_error
    };
    OK
}

/// `ncclConfig_t` up to the fields of NCCL 2.27 (what the fake reads).
#[repr(C)]
pub struct Config {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
    split_share: c_int,
    traffic_class: c_int,
    comm_name: *const c_char,
}

/// What the last configuration named as `commName` and `maxCTAs` ("" / -1: unset).
static LAST_CONFIG: Mutex<(String, c_int)> = Mutex::new((String::new(), -1));

/// Records what a configuration of a release with these fields (2.27) set.
#[cfg_attr(feature = "nccl217", allow(dead_code))]
unsafe fn record_config(cfg: &Config) {
    let name = if cfg.version >= 22700 && !cfg.comm_name.is_null() {
        CStr::from_ptr(cfg.comm_name).to_string_lossy().into_owned()
    } else {
        String::new()
    };
    let max = if cfg.max_ctas == c_int::MIN { -1 } else { cfg.max_ctas };
    *LAST_CONFIG.lock().unwrap() = (name, max);
}

/// Test control: the last configuration's `maxCTAs` (-1: unset); its `commName` is copied
/// into `name` (`cap` bytes, NUL-terminated).
#[no_mangle]
pub unsafe extern "C" fn unicommFakeLastConfig(name: *mut c_char, cap: usize) -> c_int {
    let (n, max) = LAST_CONFIG.lock().unwrap().clone();
    let b = n.as_bytes();
    let k = b.len().min(cap.saturating_sub(1));
    std::ptr::copy_nonoverlapping(b.as_ptr(), name as *mut u8, k);
    *name.add(k) = 0;
    max
}

/// The `ncclDataType_t` of the last data movement (-1: none yet).
static LAST_TYPE: Mutex<c_int> = Mutex::new(-1);

#[no_mangle]
pub extern "C" fn unicommFakeLastType() -> c_int {
    *LAST_TYPE.lock().unwrap()
}

fn size(dtype: c_int) -> usize {
    match dtype {
        // The 8-bit floats exist from 2.24 (the 2.18-like fake does not know them).
        10 | 11 if cfg!(feature = "nccl228") => 1,
        0 | 1 => 1,
        6 | 9 => 2,
        2 | 3 | 7 => 4,
        _ => 8,
    }
}

unsafe fn copy(src: *const c_void, dst: *mut c_void, count: usize, dtype: c_int) -> R {
    *LAST_TYPE.lock().unwrap() = dtype;
    if !(0..=9).contains(&dtype) && size(dtype) != 1 {
        return fail(INVALID_ARGUMENT, "fake: a data type this version does not have");
    }
    if count == REFUSED_COUNT {
        return fail(INVALID_USAGE, "fake: count 2989 refused on purpose");
    }
    if src != dst as *const c_void && count > 0 {
        std::ptr::copy(src as *const u8, dst as *mut u8, count * size(dtype));
    }
    OK
}

#[no_mangle]
pub unsafe extern "C" fn unicommFakeCalls(name: *const c_char) -> c_int {
    let n = CStr::from_ptr(name).to_string_lossy();
    CALLS.lock().unwrap().iter().find(|(k, _)| *k == n).map_or(0, |(_, c)| *c)
}

#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(v: *mut c_int) -> R {
    count("ncclGetVersion");
    *v = if cfg!(feature = "nccl232") {
        23203
    } else if cfg!(feature = "nccl230") {
        23007
    } else if cfg!(feature = "nccl228") {
        22809
    } else if cfg!(feature = "nccl217") {
        21703
    } else {
        21803
    };
    OK
}

#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(id: *mut [u8; 128]) -> R {
    count("ncclGetUniqueId");
    (*id) = [7; 128];
    OK
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(comm: *mut *mut Comm, nranks: c_int, _id: Id, rank: c_int) -> R {
    count("ncclCommInitRank");
    // FAKE_NCCL_BARRIER_WORLDS=1: worlds of several ranks whose only collective is the
    // one-element in-place all-reduce (a barrier that returns at once: the host "streams"
    // are synchronous), for the copy-engine tests across ranks.
    let many = std::env::var_os("FAKE_NCCL_BARRIER_WORLDS").is_some() && nranks >= 1 && rank >= 0 && rank < nranks;
    if !many && (nranks != 1 || rank != 0) {
        return fail(INVALID_ARGUMENT, "fake: only worlds of one rank");
    }
    delay(&INIT_DELAY_MS);
    let mut c = Comm::new(nranks, false, false);
    c.rank = rank;
    *comm = Box::into_raw(Box::new(c));
    OK
}

#[cfg(feature = "nccl228")]
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankConfig(comm: *mut *mut Comm, nranks: c_int, _id: Id, rank: c_int, config: *mut Config) -> R {
    count("ncclCommInitRankConfig");
    if nranks != 1 || rank != 0 {
        return fail(INVALID_ARGUMENT, "fake: only worlds of one rank");
    }
    let cfg = &*config;
    if cfg.magic != 0xcafe_beef || cfg.size < std::mem::size_of::<Config>() || cfg.version < 21400 {
        return fail(INVALID_ARGUMENT, "fake: config not from NCCL_CONFIG_INITIALIZER");
    }
    record_config(cfg);
    let c = Box::into_raw(Box::new(Comm::new(nranks, false, cfg.blocking == 0)));
    *comm = c;
    in_progress(c, OK)
}

/// `ncclCommInitRankScalable` (NCCL 2.23+: only the 2.28-like fake): counts the call under
/// `ncclCommInitRankScalable:<nId>:<first byte of each id>` so a test sees the ids passed
/// in order; a rank of any world under `FAKE_NCCL_BARRIER_WORLDS`, else one rank.
#[cfg(feature = "nccl228")]
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankScalable(comm: *mut *mut Comm, nranks: c_int, rank: c_int, n_id: c_int, ids: *mut Id, config: *mut Config) -> R {
    if n_id < 1 || n_id > nranks || ids.is_null() {
        return fail(INVALID_ARGUMENT, "fake: nId must be 1..=nranks with ids");
    }
    let firsts: Vec<String> = (0..n_id as usize).map(|k| (*ids.add(k)).internal[0].to_string()).collect();
    count("ncclCommInitRankScalable");
    count(&format!("ncclCommInitRankScalable:{n_id}:{}", firsts.join(",")));
    let many = std::env::var_os("FAKE_NCCL_BARRIER_WORLDS").is_some() && rank >= 0 && rank < nranks;
    if !many && (nranks != 1 || rank != 0) {
        return fail(INVALID_ARGUMENT, "fake: only worlds of one rank");
    }
    let nonblocking = !config.is_null() && (*config).blocking == 0;
    if !config.is_null() {
        record_config(&*config);
    }
    let mut c = Comm::new(nranks, false, nonblocking);
    c.rank = rank;
    let c = Box::into_raw(Box::new(c));
    *comm = c;
    in_progress(c, OK)
}

/// `ncclCommSplit` (from 2.18: the 2.17-like fake has none). `NCCL_SPLIT_NOCOLOR` gives
/// NULL; a configuration's blocking field is honoured.
#[cfg(not(feature = "nccl217"))]
#[no_mangle]
pub unsafe extern "C" fn ncclCommSplit(c: *mut Comm, color: c_int, _key: c_int, out: *mut *mut Comm, config: *mut Config) -> R {
    count("ncclCommSplit");
    if !(*c).nonblocking {
        delay(&SPLIT_DELAY_MS);
    }
    if color == -1 {
        count("ncclCommSplit:nocolor");
        *out = std::ptr::null_mut();
        return in_progress(c, OK);
    }
    let nonblocking = if config.is_null() {
        (*c).nonblocking
    } else {
        record_config(&*config);
        (*config).blocking == 0 || ((*config).blocking == c_int::MIN && (*c).nonblocking)
    };
    let child = Box::into_raw(Box::new(Comm::new((*c).nranks, true, nonblocking)));
    *out = child;
    in_progress(child, OK)
}

/// NCCL 2.27's shrink: the survivors' communicator, ranked in their order (ncclCommUserRank
/// and ncclCommCount answer for it); the abort flag (1) counted apart. A rank that names
/// itself is refused, as NCCL documents.
#[cfg(feature = "nccl228")]
#[no_mangle]
pub unsafe extern "C" fn ncclCommShrink(c: *mut Comm, exclude: *mut c_int, n: c_int, out: *mut *mut Comm, config: *mut Config, flags: c_int) -> R {
    count("ncclCommShrink");
    if flags & 1 != 0 {
        count("ncclCommShrink:abort");
    }
    let gone: Vec<c_int> = (0..n.max(0) as usize).map(|i| *exclude.add(i)).collect();
    if gone.contains(&(*c).rank) {
        return fail(INVALID_USAGE, "fake: an excluded rank called ncclCommShrink");
    }
    // A configuration's blocking field is honoured, as by ncclCommSplit.
    let nonblocking = if config.is_null() {
        (*c).nonblocking
    } else {
        (*config).blocking == 0 || ((*config).blocking == c_int::MIN && (*c).nonblocking)
    };
    let mut child = Comm::new((*c).nranks - gone.len() as c_int, false, nonblocking);
    child.rank = (0..(*c).rank).filter(|r| !gone.contains(r)).count() as c_int;
    *out = Box::into_raw(Box::new(child));
    in_progress(*out, OK)
}

/// NCCL 2.28.7's revoke: quiescent after a few polls (ncclInProgress until then).
#[cfg(feature = "nccl228")]
#[no_mangle]
pub unsafe extern "C" fn ncclCommRevoke(c: *mut Comm, flags: c_int) -> R {
    count("ncclCommRevoke");
    if flags != 0 {
        return fail(INVALID_ARGUMENT, "fake: revoke flags must be 0");
    }
    (*c).pending = 3;
    OK
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommCount(c: *mut Comm, n: *mut c_int) -> R {
    count("ncclCommCount");
    *n = (*c).nranks;
    OK
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommUserRank(c: *mut Comm, r: *mut c_int) -> R {
    count("ncclCommUserRank");
    *r = (*c).rank;
    OK
}

/// Pre-multiplied sums created and not destroyed: (op, f32 scalar).
static RED_OPS: Mutex<Vec<(c_int, f32)>> = Mutex::new(Vec::new());

#[no_mangle]
pub unsafe extern "C" fn ncclRedOpCreatePreMulSum(op: *mut c_int, scalar: *mut c_void, t: c_int, residence: c_int, c: *mut Comm) -> R {
    count("ncclRedOpCreatePreMulSum");
    if c.is_null() || residence != 1 || t != 7 {
        return fail(INVALID_ARGUMENT, "fake: pre-multiplied sums of host f32 scalars only");
    }
    let mut ops = RED_OPS.lock().unwrap();
    let code = 5 + ops.len() as c_int + calls_of("ncclRedOpDestroy");
    ops.push((code, *(scalar as *const f32)));
    *op = code;
    OK
}

#[no_mangle]
pub unsafe extern "C" fn ncclRedOpDestroy(op: c_int, _c: *mut Comm) -> R {
    count("ncclRedOpDestroy");
    let mut ops = RED_OPS.lock().unwrap();
    match ops.iter().position(|(k, _)| *k == op) {
        Some(i) => {
            ops.remove(i);
            OK
        }
        None => fail(INVALID_ARGUMENT, "fake: destroying an operator that does not exist"),
    }
}

fn calls_of(name: &str) -> c_int {
    CALLS.lock().unwrap().iter().find(|(n, _)| n == name).map_or(0, |(_, c)| *c)
}

/// A one-rank all-reduce with a created operator: the input scaled by its scalar (f32).
unsafe fn scaled(s: *const c_void, r: *mut c_void, n: usize, op: c_int) -> Option<R> {
    if op < 5 {
        return None;
    }
    let ops = RED_OPS.lock().unwrap();
    let Some(&(_, k)) = ops.iter().find(|(c, _)| *c == op) else {
        return Some(fail(INVALID_ARGUMENT, "fake: an operator that was not created (or destroyed)"));
    };
    for i in 0..n {
        *(r as *mut f32).add(i) = *(s as *const f32).add(i) * k;
    }
    Some(OK)
}

#[cfg(feature = "nccl228")]
#[no_mangle]
pub unsafe extern "C" fn ncclGather(s: *const c_void, r: *mut c_void, n: usize, t: c_int, root: c_int, _c: *mut Comm, _st: *mut c_void) -> R {
    count("ncclGather");
    if root != 0 {
        return fail(INVALID_ARGUMENT, "fake: root out of range");
    }
    copy(s, r, n, t)
}

#[cfg(feature = "nccl228")]
#[no_mangle]
pub unsafe extern "C" fn ncclScatter(s: *const c_void, r: *mut c_void, n: usize, t: c_int, root: c_int, _c: *mut Comm, _st: *mut c_void) -> R {
    count("ncclScatter");
    if root != 0 {
        return fail(INVALID_ARGUMENT, "fake: root out of range");
    }
    copy(s, r, n, t)
}

/// RCCL's all-to-all-v, for one rank: the one block to itself.
#[cfg(feature = "rccl-old")]
#[no_mangle]
pub unsafe extern "C" fn ncclAllToAllv(s: *const c_void, sc: *const usize, sd: *const usize, r: *mut c_void, rc: *const usize, rd: *const usize, t: c_int, _c: *mut Comm, _st: *mut c_void) -> R {
    count("ncclAllToAllv");
    if *sc != *rc {
        return fail(INVALID_USAGE, "fake: send and receive counts differ");
    }
    let e = size(t);
    copy((s as *const u8).add(*sd * e).cast(), (r as *mut u8).add(*rd * e).cast(), *sc, t)
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommFinalize(c: *mut Comm) -> R {
    count("ncclCommFinalize");
    if !(*c).nonblocking {
        delay(&FINALIZE_DELAY_MS);
    }
    in_progress(c, OK)
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommDestroy(c: *mut Comm) -> R {
    count("ncclCommDestroy");
    drop(Box::from_raw(c));
    OK
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommAbort(c: *mut Comm) -> R {
    count("ncclCommAbort");
    let waiting = ABORT_WAITS_FOR.load(std::sync::atomic::Ordering::SeqCst);
    if !waiting.is_null() {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while (*waiting).load(std::sync::atomic::Ordering::SeqCst) > 0
            && std::time::Instant::now() < end
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    drop(Box::from_raw(c));
    OK
}

#[no_mangle]
pub unsafe extern "C" fn ncclGetErrorString(code: R) -> *const c_char {
    match code {
        4 => c"fake: invalid argument".as_ptr(),
        5 => c"fake: invalid usage".as_ptr(),
        _ => c"fake: other error".as_ptr(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ncclGetLastError(_c: *mut Comm) -> *const c_char {
    // Leaked on purpose: NCCL's is a static buffer too; tests read it at once.
    let s = std::ffi::CString::new(LAST.lock().unwrap().clone()).unwrap();
    s.into_raw()
}

/// The all-reduce of a barrier world: ranks arrived, generation, the values so far, the
/// last result; at most 10 s.
struct World {
    arrived: usize,
    gen: u64,
    acc: Vec<u64>,
    done: Vec<u64>,
}
static WORLD: Mutex<World> = Mutex::new(World { arrived: 0, gen: 0, acc: Vec::new(), done: Vec::new() });
static WORLD_CV: std::sync::Condvar = std::sync::Condvar::new();

/// An in-place all-reduce of a barrier world, a real barrier of its ranks (threads of this
/// process) on the host: one f32 summed as a barrier (its data left as it is), or up to 16
/// uint64 really reduced (sum, max, min), as the library's one-off agreements need.
unsafe fn world_all_reduce(n: usize, buf: *mut c_void, count: usize, dtype: c_int, op: c_int) -> R {
    let combine: Option<fn(u64, u64) -> u64> = match (dtype, op, count) {
        (7, 0, 1) => None,
        (5, 0, 1..=256) => Some(u64::wrapping_add),
        (5, 2, 1..=256) => Some(u64::max),
        (5, 3, 1..=256) => Some(u64::min),
        _ => return fail(INVALID_USAGE, "fake: a barrier world has only the one-element f32 sum and up to 256 uint64 (sum, max, min)"),
    };
    let words = buf as *mut u64;
    let mine: Vec<u64> = if combine.is_some() { (0..count).map(|i| *words.add(i)).collect() } else { Vec::new() };
    let mut w = WORLD.lock().unwrap();
    if w.arrived > 0 && w.acc.len() != mine.len() {
        return fail(INVALID_USAGE, "fake: the ranks' all-reduces differ in count or type");
    }
    w.acc = if w.arrived == 0 { mine } else { w.acc.iter().zip(&mine).map(|(a, b)| combine.map_or(0, |f| f(*a, *b))).collect() };
    w.arrived += 1;
    let gen = w.gen;
    if w.arrived == n {
        w.done = std::mem::take(&mut w.acc);
        w.arrived = 0;
        w.gen += 1;
        WORLD_CV.notify_all();
    } else {
        let (g, t) = WORLD_CV.wait_timeout_while(w, std::time::Duration::from_secs(10), |w| w.gen == gen).unwrap();
        w = g;
        if t.timed_out() {
            return fail(INTERNAL_ERROR, "fake: barrier timed out");
        }
    }
    // A later all-reduce completes only once this rank arrives again: `done` is this one's.
    for (i, v) in w.done.iter().enumerate() {
        *words.add(i) = *v;
    }
    OK
}

#[no_mangle]
pub unsafe extern "C" fn ncclAllReduce(s: *const c_void, r: *mut c_void, n: usize, t: c_int, op: c_int, c: *mut Comm, _st: *mut c_void) -> R {
    count("ncclAllReduce");
    if (*c).split {
        count("ncclAllReduce:split");
    }
    if (*c).nranks != 1 {
        // A barrier world: only small in-place all-reduces exist, each a real barrier of
        // the world's ranks (threads of this process), on the host.
        if s != r as *const c_void {
            return fail(INVALID_USAGE, "fake: a barrier world has only in-place all-reduces");
        }
        return in_progress(c, world_all_reduce((*c).nranks as usize, r, n, t, op));
    }
    delay(&ALL_REDUCE_DELAY_MS);
    if let Some(code) = scaled(s, r, n, op) {
        return in_progress(c, code);
    }
    in_progress(c, copy(s, r, n, t))
}

#[no_mangle]
pub unsafe extern "C" fn ncclBroadcast(s: *const c_void, r: *mut c_void, n: usize, t: c_int, _root: c_int, _c: *mut Comm, _st: *mut c_void) -> R {
    count("ncclBroadcast");
    copy(s, r, n, t)
}

#[no_mangle]
pub unsafe extern "C" fn ncclReduce(s: *const c_void, r: *mut c_void, n: usize, t: c_int, _op: c_int, _root: c_int, _c: *mut Comm, _st: *mut c_void) -> R {
    count("ncclReduce");
    copy(s, r, n, t)
}

#[no_mangle]
pub unsafe extern "C" fn ncclAllGather(s: *const c_void, r: *mut c_void, n: usize, t: c_int, _c: *mut Comm, _st: *mut c_void) -> R {
    count("ncclAllGather");
    copy(s, r, n, t)
}

#[no_mangle]
pub unsafe extern "C" fn ncclReduceScatter(s: *const c_void, r: *mut c_void, n: usize, t: c_int, _op: c_int, _c: *mut Comm, _st: *mut c_void) -> R {
    count("ncclReduceScatter");
    copy(s, r, n, t)
}

#[cfg(feature = "nccl228")]
#[no_mangle]
pub unsafe extern "C" fn ncclAlltoAll(s: *const c_void, r: *mut c_void, n: usize, t: c_int, c: *mut Comm, _st: *mut c_void) -> R {
    count("ncclAlltoAll");
    if (*c).split {
        count("ncclAlltoAll:split");
    }
    in_progress(c, copy(s, r, n, t))
}

#[cfg(feature = "rccl-old")]
#[no_mangle]
pub unsafe extern "C" fn ncclAllToAll(s: *const c_void, r: *mut c_void, n: usize, t: c_int, _c: *mut Comm, _st: *mut c_void) -> R {
    count("ncclAllToAll");
    copy(s, r, n, t)
}

#[no_mangle]
pub unsafe extern "C" fn ncclGroupStart() -> R {
    count("ncclGroupStart");
    GROUP.lock().unwrap().0 += 1;
    OK
}

#[no_mangle]
pub unsafe extern "C" fn ncclGroupEnd() -> R {
    count("ncclGroupEnd");
    let mut g = GROUP.lock().unwrap();
    if g.0 == 0 {
        return fail(INVALID_USAGE, "fake: group end without start");
    }
    g.0 -= 1;
    if g.0 > 0 {
        return OK;
    }
    // Match sends to self with receives, in order.
    let ops = std::mem::take(&mut g.1);
    let sends: Vec<_> = ops.iter().filter(|o| o.0).collect();
    let recvs: Vec<_> = ops.iter().filter(|o| !o.0).collect();
    if sends.len() != recvs.len() {
        return fail(INVALID_USAGE, "fake: unmatched send/recv in group");
    }
    for (s, r) in sends.iter().zip(recvs) {
        if s.2 != r.2 {
            return fail(INVALID_USAGE, "fake: send/recv sizes differ");
        }
        std::ptr::copy(s.1 as *const u8, r.1 as *mut u8, s.2);
    }
    OK
}

unsafe fn p2p(send: bool, buf: usize, n: usize, t: c_int, peer: c_int) -> R {
    if peer != 0 {
        return fail(INVALID_ARGUMENT, "fake: peer out of range");
    }
    let mut g = GROUP.lock().unwrap();
    if g.0 == 0 {
        return fail(INVALID_USAGE, "fake: a send to self outside a group would deadlock");
    }
    g.1.push((send, buf, n * size(t)));
    OK
}

#[no_mangle]
pub unsafe extern "C" fn ncclSend(s: *const c_void, n: usize, t: c_int, peer: c_int, _c: *mut Comm, _st: *mut c_void) -> R {
    count("ncclSend");
    p2p(true, s as usize, n, t, peer)
}

#[no_mangle]
pub unsafe extern "C" fn ncclRecv(r: *mut c_void, n: usize, t: c_int, peer: c_int, _c: *mut Comm, _st: *mut c_void) -> R {
    count("ncclRecv");
    p2p(false, r as usize, n, t, peer)
}

#[cfg(feature = "nccl228")]
mod registration {
    use super::*;

    #[no_mangle]
    pub unsafe extern "C" fn ncclMemAlloc(p: *mut *mut c_void, n: usize) -> R {
        count("ncclMemAlloc");
        let v = vec![0u8; n].into_boxed_slice();
        *p = Box::into_raw(v) as *mut c_void;
        // The size is needed to free: remember it.
        SIZES.lock().unwrap().push((*p as usize, n));
        OK
    }

    static SIZES: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

    #[no_mangle]
    pub unsafe extern "C" fn ncclMemFree(p: *mut c_void) -> R {
        count("ncclMemFree");
        let mut s = SIZES.lock().unwrap();
        match s.iter().position(|e| e.0 == p as usize) {
            Some(i) => {
                let (_, n) = s.swap_remove(i);
                drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(p as *mut u8, n)));
                OK
            }
            None => fail(INVALID_ARGUMENT, "fake: ncclMemFree of an unknown pointer"),
        }
    }

    #[no_mangle]
    pub unsafe extern "C" fn ncclCommRegister(_c: *mut Comm, b: *mut c_void, _n: usize, h: *mut *mut c_void) -> R {
        count("ncclCommRegister");
        *h = (b as usize | 1) as *mut c_void;
        OK
    }

    #[no_mangle]
    pub unsafe extern "C" fn ncclCommDeregister(_c: *mut Comm, h: *mut c_void) -> R {
        count("ncclCommDeregister");
        count(&format!("ncclCommDeregister:{:#x}", h as usize));
        // Slow on purpose, as a real deregistration can be: a second caller racing on the
        // same handle would arrive here before this one returns.
        std::thread::sleep(std::time::Duration::from_millis(20));
        OK
    }

    #[no_mangle]
    pub unsafe extern "C" fn ncclCommWindowRegister(c: *mut Comm, b: *mut c_void, _n: usize, w: *mut *mut c_void, flags: c_int) -> R {
        count("ncclCommWindowRegister");
        if !(*c).nonblocking {
            super::delay(&super::COLLECTIVE_DELAY_MS);
        }
        if flags != 1 {
            return fail(INVALID_ARGUMENT, "fake: expected NCCL_WIN_COLL_SYMMETRIC");
        }
        // FAKE_NCCL_NULL_WINDOW=1: what NCCL does where symmetric memory is unsupported.
        *w = if std::env::var_os("FAKE_NCCL_NULL_WINDOW").is_some() {
            std::ptr::null_mut()
        } else {
            (b as usize | 2) as *mut c_void
        };
        OK
    }

    #[no_mangle]
    pub unsafe extern "C" fn ncclCommWindowDeregister(_c: *mut Comm, _w: *mut c_void) -> R {
        count("ncclCommWindowDeregister");
        OK
    }
}

/// NCCL 2.29.7's suspend: only NCCL_SUSPEND_MEM; the fake's "memory" is 1 MiB while live.
#[cfg(feature = "nccl230")]
static SUSPENDED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

#[cfg(feature = "nccl230")]
#[no_mangle]
pub unsafe extern "C" fn ncclCommSuspend(c: *mut Comm, flags: c_int) -> R {
    count("ncclCommSuspend");
    if flags != 1 {
        return fail(INVALID_ARGUMENT, "fake: suspend flags must be NCCL_SUSPEND_MEM");
    }
    SUSPENDED.lock().unwrap().push(c as usize);
    OK
}

#[cfg(feature = "nccl230")]
#[no_mangle]
pub unsafe extern "C" fn ncclCommResume(c: *mut Comm) -> R {
    count("ncclCommResume");
    let mut s = SUSPENDED.lock().unwrap();
    match s.iter().position(|k| *k == c as usize) {
        Some(i) => {
            s.remove(i);
            OK
        }
        None => fail(INVALID_USAGE, "fake: resume of a communicator not suspended"),
    }
}

#[cfg(feature = "nccl230")]
#[no_mangle]
pub unsafe extern "C" fn ncclCommMemStats(c: *mut Comm, stat: c_int, v: *mut u64) -> R {
    count("ncclCommMemStats");
    let suspended = SUSPENDED.lock().unwrap().contains(&(c as usize));
    *v = match (stat, suspended) {
        (0, false) => 1 << 20,
        (0, true) => 0,
        (1, s) => u64::from(s),
        (2, _) => 4096,
        (3, s) => 4096 + if s { 0 } else { 1 << 20 },
        _ => return fail(INVALID_ARGUMENT, "fake: no such statistic"),
    };
    OK
}

/// NCCL 2.32's `ncclCommProperties_t` head, as far as the fake fills it.
#[cfg(feature = "nccl230")]
#[repr(C)]
pub struct Props {
    size: usize,
    magic: u32,
    version: u32,
    rank: c_int,
    n_ranks: c_int,
    cuda_dev: c_int,
    nvml_dev: c_int,
    device_api: bool,
    multimem: bool,
    gin_type: c_int,
    n_lsa_teams: c_int,
    host_rma: bool,
    railed_gin_type: c_int,
    comm_hash: u64,
    gin_min_stride: c_int,
    gin_connection_type: c_int,
    gin_support: [bool; 64],
    dev_comm_runtime_version_size: usize,
}

/// The runtime layout's size the 2.32 fake reports (`sizeof(ncclDevComm)` in 2.32.3).
#[cfg(feature = "nccl232")]
pub const DEV_COMM_RUNTIME_SIZE: usize = 248;

#[cfg(feature = "nccl230")]
#[no_mangle]
pub unsafe extern "C" fn ncclCommQueryProperties(c: *mut Comm, p: *mut Props) -> R {
    count("ncclCommQueryProperties");
    // NCCL's checks: the initializer's magic, a version no newer than the library's.
    let newest = if cfg!(feature = "nccl232") { 23203 } else { 23007 };
    if (*p).magic != 0xcafe_beef || (*p).version > newest || (*p).size < 152 {
        return fail(INVALID_USAGE, "fake: properties not initialised as NCCL_COMM_PROPERTIES_INITIALIZER");
    }
    (*p).rank = (*c).rank;
    (*p).n_ranks = (*c).nranks;
    (*p).cuda_dev = 0;
    (*p).device_api = true;
    (*p).multimem = false;
    if (*p).version > 22903 {
        (*p).n_lsa_teams = 1;
        (*p).host_rma = true;
    }
    #[cfg(feature = "nccl232")]
    if (*p).version >= 23102 {
        (*p).dev_comm_runtime_version_size = DEV_COMM_RUNTIME_SIZE;
    }
    OK
}

/// NCCL 2.31.2's device communicator, as far as its host side goes: the requirements'
/// header checked as NCCL checks it (magic, a version no newer than the library's), the
/// struct's header written (magic, the layout's version, rank, ranks), each creation counted
/// by what it asked for.
#[cfg(feature = "nccl232")]
mod device_api {
    use super::*;

    #[repr(C)]
    pub struct Reqs {
        size: usize,
        magic: u32,
        version: u32,
        lists: [usize; 2],
        lsa_multimem: bool,
        barrier_count: c_int,
        lsa_barrier_count: c_int,
        rest: [u8; 60],
        use_runtime_version: bool,
    }

    #[repr(C)]
    pub struct Team {
        n_ranks: c_int,
        rank: c_int,
        stride: c_int,
    }

    #[no_mangle]
    pub unsafe extern "C" fn ncclDevCommCreate(c: *mut Comm, r: *const Reqs, out: *mut u32) -> R {
        let r = &*r;
        if r.magic != 0xcafe_beef || r.version > 23203 || r.size < 120 {
            return fail(INVALID_USAGE, "fake: requirements not initialised as NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER");
        }
        count(&format!(
            "devcomm create v{} rt{} lsa{} mm{}",
            r.version, r.use_runtime_version as u8, r.lsa_barrier_count, r.lsa_multimem as u8
        ));
        *out = 0xcafe_beef;
        *out.add(1) = if r.use_runtime_version { 23203 } else { r.version };
        *out.add(2) = (*c).rank as u32;
        *out.add(3) = (*c).nranks as u32;
        in_progress(c, OK)
    }

    #[no_mangle]
    pub unsafe extern "C" fn ncclDevCommDestroy(c: *mut Comm, dc: *const u32) -> R {
        if *dc != 0xcafe_beef {
            return fail(INVALID_USAGE, "fake: not a device communicator");
        }
        count(&format!("devcomm destroy v{}", *dc.add(1)));
        in_progress(c, OK)
    }

    #[no_mangle]
    pub unsafe extern "C" fn ncclTeamWorld(c: *mut Comm) -> Team {
        Team { n_ranks: (*c).nranks, rank: (*c).rank, stride: 1 }
    }

    #[no_mangle]
    pub unsafe extern "C" fn ncclTeamLsa(c: *mut Comm) -> Team {
        Team { n_ranks: (*c).nranks, rank: (*c).rank, stride: 1 }
    }
}

#[cfg(feature = "nccl230")]
static KEYS: [&[u8]; 2] = [b"NCCL_PROTO\0", b"NCCL_MAX_CTAS\0"];

#[cfg(feature = "nccl230")]
#[no_mangle]
pub unsafe extern "C" fn ncclParamGetAllParameterKeys(t: *mut *const *const c_char, n: *mut c_int) -> R {
    count("ncclParamGetAllParameterKeys");
    static TABLE: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    let mut table = TABLE.lock().unwrap();
    *table = KEYS.iter().map(|k| k.as_ptr() as usize).collect();
    *t = table.as_ptr().cast();
    *n = KEYS.len() as c_int;
    OK
}

#[cfg(feature = "nccl230")]
#[no_mangle]
pub unsafe extern "C" fn ncclParamGetParameter(key: *const c_char, v: *mut *const c_char, len: *mut c_int) -> R {
    count("ncclParamGetParameter");
    let value: &[u8] = match CStr::from_ptr(key).to_bytes() {
        b"NCCL_PROTO" => b"LL,LL128,Simple\0",
        b"NCCL_MAX_CTAS" => b"8\0",
        _ => return fail(INVALID_ARGUMENT, "fake: no such parameter"),
    };
    *v = value.as_ptr().cast();
    *len = (value.len() - 1) as c_int;
    OK
}

/// NCCL 2.32's per-collective configuration.
#[cfg(feature = "nccl232")]
mod coll_config;

/// NCCL EP, as if installed beside NCCL 2.30.7 or newer.
#[cfg(feature = "nccl230")]
mod ep;

/// NCCL 2.29.2's grow: an id per communicator, one at a time; the grown communicator has
/// the new size, the existing rank's number or the new rank's.
#[cfg(feature = "nccl230")]
mod grow {
    use super::*;

    #[no_mangle]
    pub unsafe extern "C" fn ncclCommGetUniqueId(_c: *mut Comm, id: *mut [u8; 128]) -> R {
        count("ncclCommGetUniqueId");
        (*id) = [9; 128];
        OK
    }

    #[no_mangle]
    pub unsafe extern "C" fn ncclCommGrow(c: *mut Comm, n: c_int, id: *const [u8; 128], rank: c_int, out: *mut *mut Comm, _cfg: *mut c_void) -> R {
        count("ncclCommGrow");
        let who = match (c.is_null(), id.is_null()) {
            (false, false) if rank == -1 && *id == [9; 128] => "root".to_string(),
            (false, true) if rank == -1 => "existing".to_string(),
            (true, false) if rank >= 0 && rank < n && *id == [9; 128] => format!("new rank {rank}"),
            _ => return fail(INVALID_ARGUMENT, "fake: ncclCommGrow's parameter rules broken"),
        };
        if !c.is_null() && n <= (*c).nranks {
            return fail(INVALID_ARGUMENT, "fake: a grow to no more ranks");
        }
        count(&format!("grow {who} to {n}"));
        let mut g = Comm::new(n, false, false);
        g.rank = if c.is_null() { rank } else { (*c).rank };
        *out = Box::into_raw(Box::new(g));
        OK
    }
}

/// NCCL 2.29.2's one-sided calls at world 1 (a put to itself), over host memory: a put
/// copies into the window (`ncclCommWindowRegister`'s handle is the buffer | 2) and counts a
/// signal, as a bare signal does; a wait takes what its descriptors ask or refuses.
#[cfg(feature = "nccl230")]
mod one_sided {
    use super::*;

    static SIGNALS: Mutex<i64> = Mutex::new(0);
    static SHIFT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    fn rules(peer: c_int, sig: c_int, ctx: c_int, flags: u32, c: *mut Comm) -> Result<(), R> {
        // SAFETY: a communicator of this fake (nccl.h's contract).
        let n = unsafe { (*c).nranks };
        if sig != 0 || ctx != 0 || flags != 0 {
            return Err(fail(INVALID_ARGUMENT, "fake: signal index, context and flags must be 0"));
        }
        if peer < 0 || peer >= n {
            return Err(fail(INVALID_ARGUMENT, "fake: no such peer"));
        }
        Ok(())
    }

    /// The window handles' user pointers are reported `by` bytes off (a library that
    /// disagrees with the registration).
    #[no_mangle]
    pub extern "C" fn unicommFakeShiftWindows(by: usize) {
        SHIFT.store(by, std::sync::atomic::Ordering::SeqCst);
    }

    #[no_mangle]
    pub unsafe extern "C" fn ncclPutSignal(src: *const c_void, n: usize, t: c_int, peer: c_int, win: *mut c_void, off: usize, sig: c_int, ctx: c_int, flags: u32, c: *mut Comm, _s: *mut c_void) -> R {
        count("ncclPutSignal");
        if let Err(e) = rules(peer, sig, ctx, flags, c) {
            return e;
        }
        if t != 1 || (win as usize) & 2 == 0 {
            return fail(INVALID_ARGUMENT, "fake: a put moves ncclUint8 into a window");
        }
        count(&format!("put {n} bytes at {off}"));
        std::ptr::copy(src as *const u8, ((win as usize & !2) + off) as *mut u8, n);
        *SIGNALS.lock().unwrap() += 1;
        OK
    }

    #[no_mangle]
    pub unsafe extern "C" fn ncclSignal(peer: c_int, sig: c_int, ctx: c_int, flags: u32, c: *mut Comm, _s: *mut c_void) -> R {
        count("ncclSignal");
        if let Err(e) = rules(peer, sig, ctx, flags, c) {
            return e;
        }
        *SIGNALS.lock().unwrap() += 1;
        OK
    }

    #[no_mangle]
    pub unsafe extern "C" fn ncclWaitSignal(n: c_int, descs: *const [c_int; 4], c: *mut Comm, _s: *mut c_void) -> R {
        count("ncclWaitSignal");
        let mut need = 0i64;
        for d in std::slice::from_raw_parts(descs, n as usize) {
            let [op_cnt, peer, sig, ctx] = *d;
            if let Err(e) = rules(peer, sig, ctx, 0, c) {
                return e;
            }
            if op_cnt <= 0 {
                return fail(INVALID_ARGUMENT, "fake: opCnt must be positive");
            }
            need += i64::from(op_cnt);
        }
        let mut s = SIGNALS.lock().unwrap();
        if *s < need {
            return fail(INVALID_USAGE, "fake: a wait for signals never sent");
        }
        *s -= need;
        count(&format!("wait {need}"));
        OK
    }

    #[no_mangle]
    pub unsafe extern "C" fn ncclWinGetUserPtr(_c: *mut Comm, win: *mut c_void, out: *mut *mut c_void) -> R {
        count("ncclWinGetUserPtr");
        *out = ((win as usize & !2) + SHIFT.load(std::sync::atomic::Ordering::SeqCst)) as *mut c_void;
        OK
    }

    /// The window's address plus the offset, and `peer` x 256 so a test tells the peers
    /// apart; a peer of 64 or more is outside the "NVLink domain" (NULL, as NCCL answers).
    #[no_mangle]
    pub unsafe extern "C" fn ncclGetPeerDevicePointer(win: *mut c_void, offset: usize, peer: c_int, out: *mut *mut c_void) -> R {
        count(&format!("peer pointer {peer} at {offset}"));
        if peer < 0 {
            return fail(INVALID_ARGUMENT, "fake: a negative peer");
        }
        *out = if peer >= 64 {
            std::ptr::null_mut()
        } else {
            ((win as usize & !2) + offset + 256 * peer as usize) as *mut c_void
        };
        OK
    }
}
