//! The NCCL-API layer, written once for NCCL and RCCL (they export the same C API): the
//! run-time loaded function table, library discovery, version gates and error translation.
//!
//! Signatures follow `nccl.h` (NVIDIA/nccl `src/nccl.h.in`); RCCL's `rccl.h` matches for
//! every symbol used here, except that all-to-all is `ncclAllToAll` in RCCL and
//! `ncclAlltoAll` in NCCL >= 2.28 (older NCCL has none: grouped send/recv instead).

#![allow(
    unsafe_code,
    reason = "calls the NCCL-API library or the device runtime at its call sites (the architecture test's UNSAFE_FILES lists them)"
)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::Path;

pub use crate::sys::flavor::Flavor;
use crate::sys::search::{open_library, Search};
use crate::sys::target::{Target, PRE_MUL_SUM, PRE_MUL_SUM_SINCE};

use unicomm_core::{Error, Result, Version};

/// `ncclComm_t`.
pub type NcclComm = *mut c_void;
/// `ncclResult_t`.
pub type NcclResult = c_int;
/// `cudaStream_t` / `hipStream_t`.
pub type RawStream = *mut c_void;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    /// The bytes every rank of a world must share.
    pub internal: [c_char; 128],
}

impl UniqueId {
    /// The id as bytes (to send to other processes).
    pub fn to_bytes(&self) -> [u8; 128] {
        self.internal.map(|c| c as u8)
    }
    /// An id received from another process.
    pub fn from_bytes(b: [u8; 128]) -> Self {
        UniqueId {
            internal: b.map(|c| c as c_char),
        }
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UniqueId(..)")
    }
}

/// `NCCL_WIN_COLL_SYMMETRIC`.
pub const WIN_COLL_SYMMETRIC: c_int = 0x01;

/// The names of `ncclResult_t` values.
pub fn result_name(code: NcclResult) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        8 => "ncclTimeout",
        _ => "ncclUnknownResult",
    }
}

/// `ncclTimeout`, NCCL 2.30.3's result for an operation past the library's own deadline.
pub const TIMEOUT: NcclResult = 8;

/// The error of a failed call: `ncclTimeout` is a [`Error::Timeout`] (what a caller already
/// handles for unicomm's own deadlines; the library's deadline is not known here, so
/// `after` is zero), every other code [`Error::Library`] with its name and messages.
pub fn error_of(
    library: &'static str,
    call: &'static str,
    code: NcclResult,
    message: String,
    last_error: String,
) -> Error {
    if code == TIMEOUT {
        return Error::Timeout {
            what: format!("{library} {call}: {message} ({last_error})"),
            after: std::time::Duration::ZERO,
        };
    }
    Error::Library {
        library,
        call,
        code,
        name: result_name(code),
        message,
        last_error,
    }
}

macro_rules! table {
    (
        required { $($r:ident : $rs:literal : fn($($ra:ty),*) $(-> $rret:ty)?;)* }
        optional { $($o:ident : $os:literal : fn($($oa:ty),*) $(-> $oret:ty)?;)* }
    ) => {
        /// The function table of one loaded NCCL-API library.
        #[expect(missing_docs, reason = "each field is the C function it names")]
        pub struct Fns {
            $(pub $r: unsafe extern "C" fn($($ra),*) $(-> $rret)?,)*
            $(pub $o: Option<unsafe extern "C" fn($($oa),*) $(-> $oret)?>,)*
        }

        impl Fns {
            /// Resolves every symbol: a missing required one is an error, a missing
            /// optional one is `None`.
            ///
            /// # Safety
            /// `lib` must be an NCCL-API library whose symbols have the signatures above.
            unsafe fn resolve(lib: &libloading::Library, library: &'static str, path: &str) -> Result<Self> {
                Ok(Fns {
                    $($r: {
                        // SAFETY: the caller guarantees the symbol has this signature.
                        let s = unsafe { lib.get::<unsafe extern "C" fn($($ra),*) $(-> $rret)?>(concat!($rs, "\0").as_bytes()) };
                        *s.map_err(|_| Error::MissingSymbol { library, path: path.to_string(), symbol: $rs })?
                    },)*
                    $($o: {
                        // SAFETY: as above.
                        let s = unsafe { lib.get::<unsafe extern "C" fn($($oa),*) $(-> $oret)?>(concat!($os, "\0").as_bytes()) };
                        s.ok().map(|s| *s)
                    },)*
                })
            }
        }
    };
}

table! {
    required {
        get_version: "ncclGetVersion": fn(*mut c_int) -> NcclResult;
        get_unique_id: "ncclGetUniqueId": fn(*mut UniqueId) -> NcclResult;
        comm_init_rank: "ncclCommInitRank": fn(*mut NcclComm, c_int, UniqueId, c_int) -> NcclResult;
        comm_destroy: "ncclCommDestroy": fn(NcclComm) -> NcclResult;
        comm_abort: "ncclCommAbort": fn(NcclComm) -> NcclResult;
        get_error_string: "ncclGetErrorString": fn(NcclResult) -> *const c_char;
        all_reduce: "ncclAllReduce": fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, RawStream) -> NcclResult;
        broadcast: "ncclBroadcast": fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, RawStream) -> NcclResult;
        reduce: "ncclReduce": fn(*const c_void, *mut c_void, usize, c_int, c_int, c_int, NcclComm, RawStream) -> NcclResult;
        all_gather: "ncclAllGather": fn(*const c_void, *mut c_void, usize, c_int, NcclComm, RawStream) -> NcclResult;
        reduce_scatter: "ncclReduceScatter": fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, RawStream) -> NcclResult;
        group_start: "ncclGroupStart": fn() -> NcclResult;
        group_end: "ncclGroupEnd": fn() -> NcclResult;
    }
    optional {
        comm_finalize: "ncclCommFinalize": fn(NcclComm) -> NcclResult;
        comm_init_rank_config: "ncclCommInitRankConfig": fn(*mut NcclComm, c_int, UniqueId, c_int, *mut c_void) -> NcclResult;
        comm_init_rank_scalable: "ncclCommInitRankScalable": fn(*mut NcclComm, c_int, c_int, c_int, *mut UniqueId, *mut c_void) -> NcclResult;
        get_last_error: "ncclGetLastError": fn(NcclComm) -> *const c_char;
        comm_get_async_error: "ncclCommGetAsyncError": fn(NcclComm, *mut NcclResult) -> NcclResult;
        send: "ncclSend": fn(*const c_void, usize, c_int, c_int, NcclComm, RawStream) -> NcclResult;
        recv: "ncclRecv": fn(*mut c_void, usize, c_int, c_int, NcclComm, RawStream) -> NcclResult;
        mem_alloc: "ncclMemAlloc": fn(*mut *mut c_void, usize) -> NcclResult;
        mem_free: "ncclMemFree": fn(*mut c_void) -> NcclResult;
        comm_split: "ncclCommSplit": fn(NcclComm, c_int, c_int, *mut NcclComm, *mut c_void) -> NcclResult;
        comm_register: "ncclCommRegister": fn(NcclComm, *mut c_void, usize, *mut *mut c_void) -> NcclResult;
        comm_deregister: "ncclCommDeregister": fn(NcclComm, *mut c_void) -> NcclResult;
        window_register: "ncclCommWindowRegister": fn(NcclComm, *mut c_void, usize, *mut *mut c_void, c_int) -> NcclResult;
        window_deregister: "ncclCommWindowDeregister": fn(NcclComm, *mut c_void) -> NcclResult;
        comm_count: "ncclCommCount": fn(NcclComm, *mut c_int) -> NcclResult;
        comm_user_rank: "ncclCommUserRank": fn(NcclComm, *mut c_int) -> NcclResult;
        gather: "ncclGather": fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, RawStream) -> NcclResult;
        scatter: "ncclScatter": fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, RawStream) -> NcclResult;
        all_to_allv: "ncclAllToAllv": fn(*const c_void, *const usize, *const usize, *mut c_void, *const usize, *const usize, c_int, NcclComm, RawStream) -> NcclResult;
        red_op_create_pre_mul_sum: "ncclRedOpCreatePreMulSum": fn(*mut c_int, *mut c_void, c_int, c_int, NcclComm) -> NcclResult;
        red_op_destroy: "ncclRedOpDestroy": fn(c_int, NcclComm) -> NcclResult;
        comm_shrink: "ncclCommShrink": fn(NcclComm, *mut c_int, c_int, *mut NcclComm, *mut c_void, c_int) -> NcclResult;
        comm_revoke: "ncclCommRevoke": fn(NcclComm, c_int) -> NcclResult;
        comm_query_properties: "ncclCommQueryProperties": fn(NcclComm, *mut c_void) -> NcclResult;
        comm_get_unique_id: "ncclCommGetUniqueId": fn(NcclComm, *mut UniqueId) -> NcclResult;
        comm_grow: "ncclCommGrow": fn(NcclComm, c_int, *const UniqueId, c_int, *mut NcclComm, *mut c_void) -> NcclResult;
        comm_suspend: "ncclCommSuspend": fn(NcclComm, c_int) -> NcclResult;
        comm_resume: "ncclCommResume": fn(NcclComm) -> NcclResult;
        comm_mem_stats: "ncclCommMemStats": fn(NcclComm, c_int, *mut u64) -> NcclResult;
        put_signal: "ncclPutSignal": fn(*const c_void, usize, c_int, c_int, *mut c_void, usize, c_int, c_int, u32, NcclComm, RawStream) -> NcclResult;
        signal: "ncclSignal": fn(c_int, c_int, c_int, u32, NcclComm, RawStream) -> NcclResult;
        wait_signal: "ncclWaitSignal": fn(c_int, *mut c_void, NcclComm, RawStream) -> NcclResult;
        win_get_user_ptr: "ncclWinGetUserPtr": fn(NcclComm, *mut c_void, *mut *mut c_void) -> NcclResult;
        get_peer_device_pointer: "ncclGetPeerDevicePointer": fn(*mut c_void, usize, c_int, *mut *mut c_void) -> NcclResult;
        dev_comm_create: "ncclDevCommCreate": fn(NcclComm, *const c_void, *mut c_void) -> NcclResult;
        dev_comm_destroy: "ncclDevCommDestroy": fn(NcclComm, *const c_void) -> NcclResult;
        team_world: "ncclTeamWorld": fn(NcclComm) -> crate::sys::device_api::RawTeam;
        team_lsa: "ncclTeamLsa": fn(NcclComm) -> crate::sys::device_api::RawTeam;
        param_all_keys: "ncclParamGetAllParameterKeys": fn(*mut *mut *const c_char, *mut c_int) -> NcclResult;
        param_get: "ncclParamGetParameter": fn(*const c_char, *mut *const c_char, *mut c_int) -> NcclResult;
        all_reduce_config: "ncclAllReduceConfig": fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, RawStream, *const c_void) -> NcclResult;
        broadcast_config: "ncclBroadcastConfig": fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, RawStream, *const c_void) -> NcclResult;
        reduce_config: "ncclReduceConfig": fn(*const c_void, *mut c_void, usize, c_int, c_int, c_int, NcclComm, RawStream, *const c_void) -> NcclResult;
        all_gather_config: "ncclAllGatherConfig": fn(*const c_void, *mut c_void, usize, c_int, NcclComm, RawStream, *const c_void) -> NcclResult;
        reduce_scatter_config: "ncclReduceScatterConfig": fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, RawStream, *const c_void) -> NcclResult;
        all_to_all_config: "ncclAlltoAllConfig": fn(*const c_void, *mut c_void, usize, c_int, NcclComm, RawStream, *const c_void) -> NcclResult;
        gather_config: "ncclGatherConfig": fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, RawStream, *const c_void) -> NcclResult;
        scatter_config: "ncclScatterConfig": fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, RawStream, *const c_void) -> NcclResult;
    }
}

/// `ncclRedOpCreatePreMulSum`.
pub type PreMulSumFn =
    unsafe extern "C" fn(*mut c_int, *mut c_void, c_int, c_int, NcclComm) -> NcclResult;
/// `ncclRedOpDestroy`.
pub type RedOpDestroyFn = unsafe extern "C" fn(c_int, NcclComm) -> NcclResult;

/// One loaded NCCL-API library.
pub struct Api {
    /// Which flavour (NCCL or RCCL).
    pub flavor: &'static Flavor,
    /// Where it was loaded from.
    pub path: String,
    /// `ncclGetVersion`.
    pub version: Version,
    /// The function table.
    pub fns: Fns,
    /// The all-to-all entry point, under whichever name the library exports it.
    pub all_to_all: Option<
        unsafe extern "C" fn(
            *const c_void,
            *mut c_void,
            usize,
            c_int,
            NcclComm,
            RawStream,
        ) -> NcclResult,
    >,
    // Last: the library outlives every function pointer above.
    _lib: libloading::Library,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} at {}",
            self.flavor.library, self.version, self.path
        )
    }
}

impl Flavor {
    /// Where this flavour's library is searched, in order.
    pub fn search(&self) -> Search {
        Search {
            library: self.library,
            env_var: self.env_var,
            dirs: (self.dirs)(),
            names: self.sonames,
        }
    }
}

impl Api {
    /// Searches the flavour's candidates in order and loads the first that opens and has
    /// every required symbol. `LibraryNotFound` lists every candidate with its reason.
    pub fn load(flavor: &'static Flavor) -> Result<Api> {
        flavor.search().load(|cand| Api::open(flavor, cand))
    }

    /// Loads the library at `path` (a path or a soname).
    pub fn open(flavor: &'static Flavor, path: &Path) -> Result<Api> {
        let lib = open_library(flavor.library, path)?;
        let shown = path.display().to_string();
        // SAFETY: the library is an NCCL-API library (it is searched under NCCL's names);
        // the symbols are declared with nccl.h's signatures.
        let fns = unsafe { Fns::resolve(&lib, flavor.library, &shown) }?;
        let mut all_to_all = None;
        for name in flavor.all_to_all {
            let sym = format!("{name}\0");
            // SAFETY: ncclAlltoAll (NCCL) and ncclAllToAll (RCCL) share this signature.
            let s = unsafe {
                lib.get::<unsafe extern "C" fn(
                    *const c_void,
                    *mut c_void,
                    usize,
                    c_int,
                    NcclComm,
                    RawStream,
                ) -> NcclResult>(sym.as_bytes())
            };
            if let Ok(s) = s {
                all_to_all = Some(*s);
                break;
            }
        }
        let mut code: c_int = 0;
        // SAFETY: ncclGetVersion writes one int.
        let r = unsafe { (fns.get_version)(&mut code) };
        let mut api = Api {
            flavor,
            path: shown,
            version: Version::default(),
            fns,
            all_to_all,
            _lib: lib,
        };
        api.check("ncclGetVersion", r, None)?;
        api.version = crate::sys::codes::version_of_code(code);
        Ok(api)
    }

    /// Turns a result code into `Ok` or a `Library` error carrying the code, its name,
    /// `ncclGetErrorString` and (when a communicator is given) `ncclGetLastError`.
    #[inline]
    pub fn check(
        &self,
        call: &'static str,
        code: NcclResult,
        comm: Option<NcclComm>,
    ) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        Err(self.failure(call, code, comm))
    }

    /// The error of a failed call (out of the callers' hot paths).
    #[cold]
    #[inline(never)]
    fn failure(&self, call: &'static str, code: NcclResult, comm: Option<NcclComm>) -> Error {
        // SAFETY: ncclGetErrorString returns a static C string for any code.
        let message = unsafe { cstr((self.fns.get_error_string)(code)) };
        let last_error = match self.fns.get_last_error {
            // SAFETY: ncclGetLastError accepts any communicator, or NULL, and returns a
            // C string owned by the library, copied at once.
            Some(f) => unsafe { cstr(f(comm.unwrap_or(std::ptr::null_mut()))) },
            None => String::new(),
        };
        error_of(self.flavor.library, call, code, message, last_error)
    }

    /// `Unsupported` unless the library is at least `since` and has the symbol(s)
    /// (`present`); `what` names the feature, the error both versions.
    pub fn require(&self, what: &str, since: Version, present: bool) -> Result<()> {
        if present && self.version >= since {
            return Ok(());
        }
        Err(self.too_old(what, since, present))
    }

    /// The optional entry point `f` when the library is at least `since` and exports it;
    /// otherwise the `Unsupported` error of [`Api::require`].
    pub fn gated<F: Copy>(&self, what: &str, since: Version, f: Option<F>) -> Result<F> {
        match f {
            Some(f) if self.version >= since => Ok(f),
            _ => Err(self.too_old(what, since, f.is_some())),
        }
    }

    fn too_old(&self, what: &str, since: Version, present: bool) -> Error {
        if !present && self.version >= since {
            // New enough, yet without the entry point (a build that left it out): the version
            // is not what is missing.
            return self.not_exported(what);
        }
        let note = if present { "" } else { " (symbol absent)" };
        self.target(None).too_old(what, since, note)
    }

    /// What this library permits on a device of compute capability `compute` (`None`:
    /// not read), its refusals naming the loaded file.
    pub fn target(&self, compute: Option<(u32, u32)>) -> Target {
        Target {
            flavor: self.flavor,
            version: self.version,
            compute,
            at: format!(" at {}", self.path).into(),
        }
    }

    /// `Unsupported`: the loaded library does not export the entry point `what` needs.
    #[cold]
    #[inline(never)]
    pub(crate) fn not_exported(&self, what: &str) -> Error {
        Error::unsupported(
            what,
            "a library that exports it",
            format!(
                "{} {} at {}, which does not export it",
                self.flavor.library, self.version, self.path
            ),
        )
    }

    /// Whether registration is available.
    pub fn has_registration(&self) -> bool {
        self.version >= self.flavor.registration_since
            && self.fns.comm_register.is_some()
            && self.fns.comm_deregister.is_some()
    }
    /// Whether symmetric windows are available.
    pub fn has_windows(&self) -> bool {
        self.version >= self.flavor.windows_since
            && self.fns.window_register.is_some()
            && self.fns.window_deregister.is_some()
    }
    /// Whether `ncclGather` and `ncclScatter` are available.
    pub fn native_gather_scatter(&self) -> bool {
        self.version >= self.flavor.gather_since
            && self.fns.gather.is_some()
            && self.fns.scatter.is_some()
    }

    /// `ncclRedOpCreatePreMulSum` and `ncclRedOpDestroy` (NCCL >= 2.11, RCCL ROCm 5.2).
    pub fn pre_mul_sum(&self) -> Result<(PreMulSumFn, RedOpDestroyFn)> {
        let (what, since) = (PRE_MUL_SUM, PRE_MUL_SUM_SINCE);
        let create = self.gated(what, since, self.fns.red_op_create_pre_mul_sum)?;
        let destroy = self.gated(what, since, self.fns.red_op_destroy)?;
        Ok((create, destroy))
    }

    /// Whether `ncclMemAlloc` is available.
    pub fn has_mem_alloc(&self) -> bool {
        self.version >= self.flavor.mem_alloc_since
            && self.fns.mem_alloc.is_some()
            && self.fns.mem_free.is_some()
    }

    /// A fresh unique id (`ncclGetUniqueId`).
    pub fn unique_id(&self) -> Result<UniqueId> {
        let mut id = UniqueId { internal: [0; 128] };
        // SAFETY: writes 128 bytes into `id`.
        let r = unsafe { (self.fns.get_unique_id)(&mut id) };
        self.check("ncclGetUniqueId", r, None)?;
        Ok(id)
    }
}

/// Copies a C string the library owns.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string valid for the call.
unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: per the contract.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod timeout_tests {
    use super::*;

    /// NCCL 2.30.3 added `ncclTimeout`: callers that handle unicomm's deadlines as `Timeout`
    /// get the library's the same way, with its messages kept.
    #[test]
    fn the_librarys_own_timeout_is_a_timeout() {
        let e = error_of(
            "NCCL",
            "ncclAllReduce",
            TIMEOUT,
            "timed out".into(),
            "peer 3".into(),
        );
        match e {
            Error::Timeout { what, .. } => {
                assert!(
                    what.contains("ncclAllReduce") && what.contains("peer 3"),
                    "{what}"
                )
            }
            other => panic!("{other:?}"),
        }
        let e = error_of("NCCL", "ncclAllReduce", 6, "remote".into(), String::new());
        assert!(
            matches!(
                e,
                Error::Library {
                    name: "ncclRemoteError",
                    ..
                }
            ),
            "{e:?}"
        );
    }
}
