//! The calls that make, end, register buffers with, allocate for and describe a
//! communicator, and the library's parameters (its windows: `window.rs`).

use std::ffi::{c_char, c_int, c_void, CStr};

use unicomm_core::{DataType, Error, MemStats, Properties, Result};

use super::check::rank_in;
use super::gates::{
    CONFIG_SINCE, PARAMS_SINCE, PROPERTIES_SINCE, REVOKE_SINCE, SCALABLE_SINCE,
    SCALAR_HOST_IMMEDIATE, SHRINK_SINCE, SPLIT_SINCE, SUSPEND_SINCE,
};
use super::handles::{made, Handle, LibAlloc, OwnedComm, Progress, RegHandle, Span};
use crate::sys::api::{Api, NcclComm, UniqueId};
use crate::sys::codes::NcclCode;
use crate::sys::config::{OwnedConfig, RawProperties, IN_PROGRESS};
use crate::sys::target::{PROPERTIES_TITLE, SUSPEND_TITLE};

/// The most parameters [`Api::parameters`] lists.
pub const MAX_PARAMS: usize = 4096;
/// The most bytes of one parameter's value [`Api::parameters`] reads.
pub const MAX_PARAM_BYTES: usize = 4096;

impl Api {
    /// `ncclGroupStart`: the calls that follow, up to the matching [`Api::group_end`], are
    /// launched together.
    pub fn group_start(&self) -> Result<()> {
        // SAFETY: no arguments.
        let code = unsafe { (self.fns.group_start)() };
        self.check("ncclGroupStart", code, None)
    }

    /// `ncclGroupEnd` (the library reports an end without a start as an error).
    pub fn group_end(&self) -> Result<()> {
        // SAFETY: no arguments.
        let code = unsafe { (self.fns.group_end)() };
        self.done("ncclGroupEnd", code, None)
    }

    /// `f` between `ncclGroupStart` and `ncclGroupEnd`: the layer's one bracket of a group
    /// it opens itself (a caller's own group is `Collective::group_start`/`group_end`). The
    /// group is ended where `f` fails (its error first) and where it unwinds (a thread's
    /// group left open would hold every later call of the thread).
    pub fn grouped<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        /// Ends the group if `f` unwinds.
        struct Open<'a>(&'a Api, bool);
        impl Drop for Open<'_> {
            fn drop(&mut self) {
                if self.1 {
                    let _ = self.0.group_end();
                }
            }
        }
        self.group_start()?;
        let mut open = Open(self, true);
        let r = f();
        open.1 = false;
        let end = self.group_end();
        let r = r?;
        end?;
        Ok(r)
    }

    /// `ncclCommInitRank`, or `ncclCommInitRankConfig` with `config` (NCCL >= 2.14).
    pub fn comm_init_rank(
        &self,
        world: usize,
        id: UniqueId,
        rank: usize,
        config: Option<&mut OwnedConfig>,
    ) -> Result<OwnedComm> {
        let (n, r) = (world as c_int, rank_in(rank, world, "rank")?);
        let mut raw: NcclComm = std::ptr::null_mut();
        match config {
            Some(cfg) => {
                let what = "creating a communicator with a configuration (ncclCommInitRankConfig)";
                let f = self.gated(what, CONFIG_SINCE, self.fns.comm_init_rank_config)?;
                // SAFETY: `raw` receives the communicator; `cfg` is an initialised
                // ncclConfig_t with its true size and version whose strings it owns, alive
                // across the call (NCCL copies the fields it knows).
                let code = unsafe { f(&mut raw, n, id, r, cfg.as_mut_ptr().cast()) };
                self.done("ncclCommInitRankConfig", code, None)?;
            }
            None => {
                // SAFETY: `raw` receives the communicator.
                let code = unsafe { (self.fns.comm_init_rank)(&mut raw, n, id, r) };
                self.check("ncclCommInitRank", code, None)?;
            }
        }
        made(raw).ok_or_else(|| Error::invalid("comm", "ncclCommInitRank returned no communicator"))
    }

    /// Whether this library creates a communicator from several roots
    /// (`ncclCommInitRankScalable`, NCCL >= 2.23).
    pub fn has_scalable_init(&self) -> bool {
        self.fns.comm_init_rank_scalable.is_some() && self.version >= SCALABLE_SINCE
    }

    /// `ncclCommInitRankScalable`: one rank of `world` joining through several roots, one
    /// per id of `ids` (the same ids in the same order on every rank; at most one per
    /// rank); `config` as in [`Api::comm_init_rank`]. NCCL >= 2.23, else `Unsupported`
    /// naming the version.
    pub fn comm_init_rank_scalable(
        &self,
        world: usize,
        ids: &[UniqueId],
        rank: usize,
        config: Option<&mut OwnedConfig>,
    ) -> Result<OwnedComm> {
        let what = "creating a communicator from several roots (ncclCommInitRankScalable)";
        let f = self.gated(what, SCALABLE_SINCE, self.fns.comm_init_rank_scalable)?;
        let (n, r) = (world as c_int, rank_in(rank, world, "rank")?);
        if ids.is_empty() || ids.len() > world {
            return Err(Error::invalid(
                "ids",
                format!(
                    "{} unique ids for {world} ranks: 1 to one per rank",
                    ids.len()
                ),
            ));
        }
        let mut ids = ids.to_vec();
        let cfg = config.map_or(std::ptr::null_mut(), |c| c.as_mut_ptr().cast::<c_void>());
        let mut raw: NcclComm = std::ptr::null_mut();
        // SAFETY: `raw` receives the communicator; `ids` is a live array of `ids.len()`
        // unique ids (NCCL reads them during the call); `cfg` is null or an initialised
        // ncclConfig_t with its true size and version, alive across the call.
        let code = unsafe { f(&mut raw, n, r, ids.len() as c_int, ids.as_mut_ptr(), cfg) };
        self.done("ncclCommInitRankScalable", code, None)?;
        made(raw).ok_or_else(|| {
            Error::invalid("comm", "ncclCommInitRankScalable returned no communicator")
        })
    }

    /// `ncclCommAbort`: stops the communicator's work and frees it.
    pub fn comm_abort(&self, comm: OwnedComm) -> Result<()> {
        // SAFETY: a live communicator, consumed: ended once.
        let code = unsafe { (self.fns.comm_abort)(comm.raw) };
        self.check("ncclCommAbort", code, None)
    }

    /// `ncclCommDestroy`.
    pub fn comm_destroy(&self, comm: OwnedComm) -> Result<()> {
        // SAFETY: a live communicator, consumed: ended once.
        let code = unsafe { (self.fns.comm_destroy)(comm.raw) };
        self.check("ncclCommDestroy", code, None)
    }

    /// `ncclCommFinalize` (a no-op where the library predates it: destroy flushes then).
    pub fn comm_finalize(&self, comm: Handle<'_>) -> Result<()> {
        let Some(f) = self.fns.comm_finalize else {
            return Ok(());
        };
        // SAFETY: a live communicator (the handle's contract).
        let code = unsafe { f(comm.raw) };
        self.done("ncclCommFinalize", code, Some(comm.raw))
    }

    /// `ncclCommGetAsyncError`: whether the library is done with the communicator's last
    /// calls, its asynchronous error as the error; `None` where the library has no such call
    /// (and so no non-blocking mode).
    pub fn comm_get_async_error(&self, comm: Handle<'_>) -> Result<Option<Progress>> {
        let Some(get) = self.fns.comm_get_async_error else {
            return Ok(None);
        };
        let mut state = 0;
        // SAFETY: a live communicator; one int out.
        let code = unsafe { get(comm.raw, &mut state) };
        self.check("ncclCommGetAsyncError", code, Some(comm.raw))?;
        match state {
            IN_PROGRESS => Ok(Some(Progress::InProgress)),
            e => self
                .check(
                    "ncclCommGetAsyncError (asynchronous error)",
                    e,
                    Some(comm.raw),
                )
                .map(|()| Some(Progress::Done)),
        }
    }

    /// `ncclCommCount` and `ncclCommUserRank`: (world, rank).
    pub fn comm_shape(&self, comm: Handle<'_>) -> Result<(usize, usize)> {
        let pair = self.fns.comm_count.zip(self.fns.comm_user_rank);
        let (count, user_rank) =
            pair.ok_or_else(|| self.not_exported("ncclCommCount/ncclCommUserRank"))?;
        let (mut n, mut r): (c_int, c_int) = (0, 0);
        // SAFETY: a live communicator; one int out.
        let code = unsafe { count(comm.raw, &mut n) };
        self.check("ncclCommCount", code, Some(comm.raw))?;
        // SAFETY: as above.
        let code = unsafe { user_rank(comm.raw, &mut r) };
        self.check("ncclCommUserRank", code, Some(comm.raw))?;
        Ok((n.max(0) as usize, r.max(0) as usize))
    }

    /// `ncclCommSplit(parent, color, key, config)` (NCCL >= 2.18): the child, `None` where
    /// this rank passed [`NO_COLOR`](super::NO_COLOR) (or the library made none). `None` config passes NULL:
    /// the parent's settings.
    pub fn comm_split(
        &self,
        parent: Handle<'_>,
        color: c_int,
        key: c_int,
        config: Option<&mut OwnedConfig>,
    ) -> Result<Option<OwnedComm>> {
        let f = self.gated("ncclCommSplit", SPLIT_SINCE, self.fns.comm_split)?;
        let cfg = config.map_or(std::ptr::null_mut(), |c| c.as_mut_ptr().cast());
        let mut out: NcclComm = std::ptr::null_mut();
        // SAFETY: a live parent; `out` receives the child; `cfg` is NULL or an ncclConfig_t
        // owned by the caller across the call (NCCL copies it).
        let code = unsafe { f(parent.raw, color, key, &mut out, cfg) };
        self.done("ncclCommSplit", code, Some(parent.raw))?;
        Ok(made(out))
    }

    /// `ncclCommShrink(parent, exclude, config, flags)` (NCCL >= 2.27): the survivors'
    /// communicator.
    pub fn comm_shrink(
        &self,
        parent: Handle<'_>,
        exclude: &[usize],
        config: Option<&mut OwnedConfig>,
        flags: c_int,
    ) -> Result<Option<OwnedComm>> {
        let f = self.gated("ncclCommShrink", SHRINK_SINCE, self.fns.comm_shrink)?;
        let mut list: Vec<c_int> = exclude.iter().map(|&r| r as c_int).collect();
        let cfg = config.map_or(std::ptr::null_mut(), |c| c.as_mut_ptr().cast());
        let mut out: NcclComm = std::ptr::null_mut();
        // SAFETY: a live parent; `list` holds the excluded ranks (read during the call);
        // `out` receives the new communicator; `cfg` is NULL or an ncclConfig_t owned by the
        // caller across the call.
        let code = unsafe {
            f(
                parent.raw,
                list.as_mut_ptr(),
                list.len() as c_int,
                &mut out,
                cfg,
                flags,
            )
        };
        self.done("ncclCommShrink", code, Some(parent.raw))?;
        Ok(made(out))
    }

    /// `ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT)` (NCCL >= 2.28.7).
    pub fn comm_revoke(&self, comm: Handle<'_>) -> Result<()> {
        let f = self.gated("ncclCommRevoke", REVOKE_SINCE, self.fns.comm_revoke)?;
        // SAFETY: a live communicator; the flags are NCCL_REVOKE_DEFAULT (0), as nccl.h
        // requires.
        let code = unsafe { f(comm.raw, 0) };
        self.done("ncclCommRevoke", code, Some(comm.raw))
    }

    /// `ncclCommQueryProperties` (NCCL >= 2.29.2), the struct told the version of the
    /// library itself (NCCL refuses a version newer than its own) or of the layout read here,
    /// the older of the two; the fields that version fills are read.
    pub fn comm_query_properties(&self, comm: Handle<'_>) -> Result<Properties> {
        let f = self.gated(
            PROPERTIES_TITLE,
            PROPERTIES_SINCE,
            self.fns.comm_query_properties,
        )?;
        let v = self.version;
        let code = v.major * 10000 + v.minor * 100 + v.patch;
        let mut p = RawProperties::new(code);
        // SAFETY: a live communicator; `p` is initialised as NCCL_COMM_PROPERTIES_INITIALIZER
        // (its size, magic and a version no newer than the library's) and lives across the call.
        let r = unsafe { f(comm.raw, (&mut p as *mut RawProperties).cast()) };
        self.check("ncclCommQueryProperties", r, Some(comm.raw))?;
        Ok(p.read())
    }

    /// `ncclCommSuspend(comm, NCCL_SUSPEND_MEM)` (NCCL >= 2.29.7).
    pub fn comm_suspend(&self, comm: Handle<'_>) -> Result<()> {
        let f = self.gated(SUSPEND_TITLE, SUSPEND_SINCE, self.fns.comm_suspend)?;
        // SAFETY: a live communicator; NCCL_SUSPEND_MEM (1) is the flag nccl.h defines.
        let code = unsafe { f(comm.raw, 1) };
        self.done("ncclCommSuspend", code, Some(comm.raw))
    }

    /// `ncclCommResume` (NCCL >= 2.29.7).
    pub fn comm_resume(&self, comm: Handle<'_>) -> Result<()> {
        let f = self.gated(SUSPEND_TITLE, SUSPEND_SINCE, self.fns.comm_resume)?;
        // SAFETY: a live communicator.
        let code = unsafe { f(comm.raw) };
        self.done("ncclCommResume", code, Some(comm.raw))
    }

    /// `ncclCommMemStats` of each of its four statistics (NCCL >= 2.29.7).
    pub fn comm_mem_stats(&self, comm: Handle<'_>) -> Result<MemStats> {
        let f = self.gated(SUSPEND_TITLE, SUSPEND_SINCE, self.fns.comm_mem_stats)?;
        let mut v = [0u64; 4];
        for (stat, out) in v.iter_mut().enumerate() {
            // SAFETY: a live communicator; `stat` is one of ncclCommMemStat_t's four values
            // (suspendable, suspended, persistent, total); `out` receives one u64.
            let code = unsafe { f(comm.raw, stat as c_int, out) };
            self.check("ncclCommMemStats", code, Some(comm.raw))?;
        }
        Ok(MemStats {
            suspendable: v[0],
            suspended: v[1] != 0,
            persistent: v[2],
            total: v[3],
        })
    }

    /// NCCL's parameters in effect, `(key, value)` (`ncclParamGetAllParameterKeys` and
    /// `ncclParamGetParameter`, NCCL >= 2.30.4): those NCCL documents, or all of them with
    /// `NCCL_PARAM_DUMP_ALL=true`. At most 4,096 keys, each value at most 4,096
    /// bytes (longer ones cut, marked `...`).
    pub fn parameters(&self) -> Result<Vec<(String, String)>> {
        const WHAT: &str = "NCCL's parameters (ncclParamGetAllParameterKeys)";
        let all = self.gated(WHAT, PARAMS_SINCE, self.fns.param_all_keys)?;
        let get = self.gated(WHAT, PARAMS_SINCE, self.fns.param_get)?;
        let (mut table, mut n): (*mut *const c_char, c_int) = (std::ptr::null_mut(), 0);
        // SAFETY: both out-pointers are valid; the table stays the library's, valid until
        // this thread's next call of the same function (nccl.h), read before any.
        let code = unsafe { all(&mut table, &mut n) };
        self.check("ncclParamGetAllParameterKeys", code, None)?;
        let n = (n.max(0) as usize).min(MAX_PARAMS);
        let keys: Vec<Vec<u8>> = (0..n)
            .filter(|_| !table.is_null())
            // SAFETY: `table` holds `n` pointers (the library's count, bounded above), each
            // a NUL-terminated key or null.
            .map(|i| unsafe { *table.add(i) })
            .filter(|k| !k.is_null())
            // SAFETY: a NUL-terminated string of the library's table, copied at once.
            .map(|k| unsafe { CStr::from_ptr(k) }.to_bytes().to_vec())
            .collect();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let Ok(c) = std::ffi::CString::new(key) else {
                continue;
            };
            let (mut v, mut len): (*const c_char, c_int) = (std::ptr::null(), 0);
            // SAFETY: a NUL-terminated key and two valid out-pointers; the value stays the
            // library's until this thread's next call, copied at once below.
            let code = unsafe { get(c.as_ptr(), &mut v, &mut len) };
            if self.check("ncclParamGetParameter", code, None).is_err() || v.is_null() {
                continue;
            }
            let len = len.max(0) as usize;
            // SAFETY: `v` points to `len` bytes of the value (nccl.h), of which at most
            // MAX_PARAM_BYTES are read.
            let bytes =
                unsafe { std::slice::from_raw_parts(v.cast::<u8>(), len.min(MAX_PARAM_BYTES)) };
            let mut value = String::from_utf8_lossy(bytes)
                .trim_end_matches('\0')
                .to_string();
            if len > MAX_PARAM_BYTES {
                value.push_str("...");
            }
            out.push((c.to_string_lossy().into_owned(), value));
        }
        Ok(out)
    }

    /// `ncclCommRegister` of `buf` (NCCL >= 2.19).
    pub fn comm_register(&self, comm: Handle<'_>, buf: Span<'_>) -> Result<RegHandle> {
        let f = self.gated(
            "user-buffer registration (ncclCommRegister)",
            self.flavor.registration_since,
            self.fns
                .comm_register
                .filter(|_| self.fns.comm_deregister.is_some()),
        )?;
        let addr = buf.addr as *mut c_void;
        let mut h = std::ptr::null_mut();
        // SAFETY: `addr..addr+bytes` is device memory (a checked span); `h` receives the
        // handle.
        let code = unsafe { f(comm.raw, addr, buf.bytes, &mut h) };
        self.done("ncclCommRegister", code, Some(comm.raw))?;
        Ok(RegHandle { raw: h })
    }

    /// `ncclCommDeregister`.
    pub fn comm_deregister(&self, comm: Handle<'_>, h: RegHandle) -> Result<()> {
        let f = self.fns.comm_deregister;
        let f =
            f.ok_or_else(|| Error::invalid("handle", "the library has no ncclCommDeregister"))?;
        // SAFETY: a registration of this communicator (the handle's contract), consumed.
        let code = unsafe { f(comm.raw, h.raw) };
        self.done("ncclCommDeregister", code, Some(comm.raw))
    }

    /// `ncclMemAlloc` of `bytes` (NCCL >= 2.19).
    pub fn mem_alloc(&self, bytes: usize) -> Result<LibAlloc> {
        let what = "ncclMemAlloc";
        let alloc = self.gated(what, self.flavor.mem_alloc_since, self.fns.mem_alloc)?;
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` receives the allocation.
        let code = unsafe { alloc(&mut p, bytes) };
        self.check(what, code, None)?;
        Ok(LibAlloc { ptr: p })
    }

    /// `ncclMemFree`.
    pub fn mem_free(&self, a: LibAlloc) -> Result<()> {
        let free = self.fns.mem_free;
        let free =
            free.ok_or_else(|| Error::invalid("memory", "the library has no ncclMemFree"))?;
        // SAFETY: an allocation of ncclMemAlloc, consumed: freed once.
        let code = unsafe { free(a.ptr) };
        self.check("ncclMemFree", code, None)
    }

    /// `ncclRedOpCreatePreMulSum` with the scalar's bytes (one element of `wire`, host
    /// immediate).
    pub fn red_op_create_pre_mul_sum(
        &self,
        comm: Handle<'_>,
        scalar: &[u8],
        wire: DataType,
    ) -> Result<c_int> {
        let (create, _) = self.pre_mul_sum()?;
        if scalar.len() != wire.size() {
            return Err(Error::invalid(
                "scalar",
                format!("{} bytes for one {wire}", scalar.len()),
            ));
        }
        let mut buf = [0u8; 8];
        buf[..scalar.len()].copy_from_slice(scalar);
        let mut code: c_int = 0;
        // SAFETY: `buf` holds one element of the type, read at creation (host immediate);
        // a live communicator.
        let r = unsafe {
            create(
                &mut code,
                buf.as_mut_ptr().cast(),
                wire.nccl(),
                SCALAR_HOST_IMMEDIATE,
                comm.raw,
            )
        };
        self.check("ncclRedOpCreatePreMulSum", r, Some(comm.raw))?;
        Ok(code)
    }

    /// `ncclRedOpDestroy` (the library refuses an operator it did not create).
    pub fn red_op_destroy(&self, comm: Handle<'_>, op: c_int) -> Result<()> {
        let (_, destroy) = self.pre_mul_sum()?;
        // SAFETY: a live communicator; the library checks the operator.
        let code = unsafe { destroy(op, comm.raw) };
        self.check("ncclRedOpDestroy", code, Some(comm.raw))
    }
}
