//! The communicator over any NCCL-API library and device runtime ([`ApiComm`]): creation,
//! registration bookkeeping and destruction. What backend-nccl (NCCL + CUDA) and
//! backend-rccl (RCCL + HIP) both are; its collectives are in `collective.rs`.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use unicomm_core::registry::{RegKind, Registry};
use unicomm_core::{Collective, DataType, Error, RawHandle, Result, Version};

use crate::api::WIN_COLL_SYMMETRIC;
use crate::api::{Api, NcclComm, UniqueId};
use crate::copy_engine::{CopyEngine, LocalWorld, GROUP_DEPTH};
use crate::memory::ApiMemory;
use crate::runtime::Runtime;
use crate::watchdog::{self, Config, Core, SendComm, Watched, GROUP_MEMBERS, IN_PROGRESS, LIVE};

/// How a process's communicators work, from its environment (`ApiComm::mode`).
#[derive(Debug, Clone, Copy)]
struct Mode {
    /// Created non-blocking.
    nonblocking: bool,
    /// The deadline of their waits.
    timeout: Duration,
    /// The ranks compare every collective first.
    check: bool,
}

/// Handles for zero-byte registrations, which never reach the library (there is nothing
/// to register); they live in the upper half of the address space no library hands out.
static NEXT_EMPTY: AtomicUsize = AtomicUsize::new(usize::MAX / 2);

/// One rank's communicator over an NCCL-API library.
// `repr(C)`, line-aligned: what every collective reads (the shared core, the library's
// table, the runtime, the handle, device, world, the device's context token, the
// automatic-registration count, the check switch) comes first, in one cache line; on a GPU
// host the library's enqueue between two calls leaves these cold, and each line is a miss
// (docs/benchmarks.md, "The host's cost of a call").
#[repr(C, align(64))]
pub struct ApiComm<R: Runtime> {
    /// The lock, state, second communicator and deadline, shared with the streams that
    /// wait on this communicator's work (`watchdog.rs`).
    pub(crate) core: Arc<Core<R>>,
    pub(crate) api: Arc<Api>,
    pub(crate) rt: Arc<R>,
    pub(crate) comm: NcclComm,
    pub(crate) dev: usize,
    pub(crate) world: usize,
    /// `rt.device_token(dev)`: what `call` compares with the current device.
    pub(crate) device_token: usize,
    /// Live automatic registrations (so calls without any skip the policy's lookups).
    pub(crate) autos: AtomicU32,
    /// `UNICOMM_CHECK_COLLECTIVES=1`: the ranks compare every collective first (`check.rs`).
    pub(crate) check_collectives: bool,
    pub(crate) rank: usize,
    pub(crate) registry: Registry,
    /// 4 device bytes for `barrier` (an all-reduce of one element).
    pub(crate) barrier: ApiMemory<R>,
    /// The copy-engine path's state (`copy_engine.rs`).
    pub(crate) ce: CopyEngine<R>,
    /// Device scratch and stream of the ranks' small exchanges (`check.rs`).
    pub(crate) scratch: crate::check::Scratch<R>,
    /// The automatic policy this rank proposes (`set_auto_policy`; else the process's).
    pub(crate) wanted_policy: Mutex<Option<crate::policy::Policy>>,
    /// What the ranks agreed on at the first automatic registration (`auto.rs`).
    pub(crate) agreed: std::sync::OnceLock<crate::auto::Agreed>,
}

// SAFETY: an NCCL communicator is not bound to the thread that created it (NCCL's pthread
// and single-thread modes both move them); every call on it goes through `core.lock`, so it
// is never used by two threads at once, which is NCCL's rule for sharing one between threads.
unsafe impl<R: Runtime> Send for ApiComm<R> {}
// SAFETY: as above: shared access is serialised by `lock`.
unsafe impl<R: Runtime> Sync for ApiComm<R> {}

impl<R: Runtime> std::fmt::Debug for ApiComm<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} rank {}/{} on {} device {}",
            self.api.flavor.library,
            self.rank,
            self.world,
            R::NAME,
            self.dev
        )
    }
}

impl<R: Runtime> ApiComm<R> {
    /// One rank per visible device (or on the first `n`), created from this thread.
    pub fn local(api: Arc<Api>, rt: Arc<R>, n: Option<usize>) -> Result<Vec<Self>> {
        let count = rt.device_count()?;
        let n = n.unwrap_or(count);
        if n > count {
            return Err(Error::NoDevice {
                vendor: R::VENDOR,
                detail: format!("{n} ranks asked for, {count} GPU(s) visible"),
            });
        }
        Self::init_local(api, rt, &(0..n).collect::<Vec<_>>())
    }

    /// Creates the `devs.len()` ranks of a world in this process from one thread
    /// (`ncclCommInitRank` for every device inside one group).
    pub fn init_local(api: Arc<Api>, rt: Arc<R>, devs: &[usize]) -> Result<Vec<Self>> {
        let n = devs.len();
        if n == 0 {
            return Err(Error::invalid("devices", "no device given"));
        }
        let count = rt.device_count()?;
        if let Some(&d) = devs.iter().find(|&&d| d >= count) {
            return Err(Error::NoDevice {
                vendor: R::VENDOR,
                detail: format!("device {d} asked for, {count} visible"),
            });
        }
        let id = api.unique_id()?;
        let mode = Self::mode(&api)?;
        let (nonblocking, timeout) = (mode.nonblocking, mode.timeout);
        let create = {
            let (api, rt, devs) = (api.clone(), rt.clone(), devs.to_vec());
            move || Self::create_group(&api, &*rt, &devs, id, nonblocking)
        };
        let raw: Vec<NcclComm> = if nonblocking {
            create()?
        } else {
            // Blocking: NCCL waits for every rank with no deadline; the call gets one.
            let late_api = api.clone();
            watchdog::bounded("ncclCommInitRank (one group)", timeout, create, move |r| {
                for c in r.into_iter().flatten() {
                    // SAFETY: a communicator created after the caller gave up; aborted once.
                    unsafe { (late_api.fns.comm_abort)(c.0) };
                }
            })??
        }
        .into_iter()
        .map(|c| c.0)
        .collect();
        if nonblocking {
            if let Err(e) = raw.iter().try_for_each(|&c| {
                watchdog::settle_raw(&api, c, "ncclCommInitRank", timeout, &|| false)
            }) {
                for &c in &raw {
                    // SAFETY: a communicator created above, aborted once.
                    unsafe { (api.fns.comm_abort)(c) };
                }
                return Err(e);
            }
        }
        let local = Arc::new(LocalWorld::new(n));
        raw.into_iter()
            .zip(devs)
            .enumerate()
            .map(|(rank, (c, &dev))| {
                Self::wrap(
                    api.clone(),
                    rt.clone(),
                    c,
                    dev,
                    (rank, n),
                    Some(local.clone()),
                    mode,
                )
            })
            .collect()
    }

    /// `ncclCommInitRank` for every device of `devs` inside one group (communicators in
    /// rank order); on any failure those created are aborted.
    fn create_group(
        api: &Api,
        rt: &R,
        devs: &[usize],
        id: UniqueId,
        nonblocking: bool,
    ) -> Result<Vec<SendComm>> {
        let n = devs.len();
        let mut raw = vec![std::ptr::null_mut(); n];
        // SAFETY: ncclGroupStart has no arguments.
        api.check("ncclGroupStart", unsafe { (api.fns.group_start)() }, None)?;
        let mut first_err = None;
        for (rank, (&dev, slot)) in devs.iter().zip(raw.iter_mut()).enumerate() {
            let r = rt.with_device(dev, || Self::init_call(api, slot, n, id, rank, nonblocking));
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        // SAFETY: closes the group opened above.
        let code = unsafe { (api.fns.group_end)() };
        let end = Self::in_progress_ok(api, "ncclGroupEnd", code, nonblocking);
        if let Some(e) = first_err.or(end.err()) {
            for c in raw.into_iter().filter(|c| !c.is_null()) {
                // SAFETY: a communicator created above, aborted once.
                unsafe { (api.fns.comm_abort)(c) };
            }
            return Err(e);
        }
        Ok(raw.into_iter().map(SendComm).collect())
    }

    /// The explicit form, for one rank per thread or per process: joins the world of
    /// `world` ranks identified by `id` as `rank`, on device `dev`. Blocks until every rank
    /// has called it.
    pub fn init_rank(
        api: Arc<Api>,
        rt: Arc<R>,
        id: UniqueId,
        rank: usize,
        world: usize,
        dev: usize,
    ) -> Result<Self> {
        if rank >= world {
            return Err(Error::invalid(
                "rank",
                format!("{rank} is outside 0..{world}"),
            ));
        }
        let count = rt.device_count()?;
        if dev >= count {
            return Err(Error::NoDevice {
                vendor: R::VENDOR,
                detail: format!("device {dev} asked for, {count} visible"),
            });
        }
        let mode = Self::mode(&api)?;
        let (nonblocking, timeout) = (mode.nonblocking, mode.timeout);
        let c = if nonblocking {
            let mut c = std::ptr::null_mut();
            rt.with_device(dev, || {
                Self::init_call(&api, &mut c, world, id, rank, true)?;
                if let Err(e) =
                    watchdog::settle_raw(&api, c, "ncclCommInitRank", timeout, &|| false)
                {
                    // SAFETY: the communicator created above, aborted once.
                    unsafe { (api.fns.comm_abort)(c) };
                    return Err(e);
                }
                Ok(())
            })?;
            c
        } else {
            // Blocking: NCCL waits for every rank with no deadline; the call gets one.
            let (a, r, late_api) = (api.clone(), rt.clone(), api.clone());
            let create = move || -> Result<SendComm> {
                let mut c = std::ptr::null_mut();
                r.with_device(dev, || Self::init_call(&a, &mut c, world, id, rank, false))?;
                Ok(SendComm(c))
            };
            watchdog::bounded("ncclCommInitRank", timeout, create, move |r| {
                if let Ok(c) = r {
                    // SAFETY: a communicator created after the caller gave up; aborted once.
                    unsafe { (late_api.fns.comm_abort)(c.0) };
                }
            })??
            .0
        };
        let mut me = Self::wrap(api, rt, c, dev, (rank, world), None, mode)?;
        #[cfg(target_os = "linux")]
        {
            me.ce.job = Some(crate::ipc::Job::from_id(&id.to_bytes()));
        }
        Ok(me)
    }

    /// Whether communicators are created non-blocking (`UNICOMM_NONBLOCKING`, where the
    /// library has `ncclCommInitRankConfig` and `ncclCommGetAsyncError`), the deadline of
    /// their waits (`UNICOMM_TIMEOUT_MS`), and whether the ranks compare every collective
    /// first (`UNICOMM_CHECK_COLLECTIVES`).
    fn mode(api: &Api) -> Result<Mode> {
        let timeout = unicomm_core::env::timeout()?;
        let able = api.fns.comm_init_rank_config.is_some()
            && api.fns.comm_get_async_error.is_some()
            && api.version >= Version::new(2, 14, 0);
        Ok(Mode {
            nonblocking: able && watchdog::nonblocking_from_env()?,
            timeout,
            check: crate::check::check_from_env()?,
        })
    }

    /// `ncclCommInitRankConfig` with `blocking = 0` (non-blocking mode), else
    /// `ncclCommInitRank`; `ncclInProgress` is success here (settled by the caller).
    fn init_call(
        api: &Api,
        slot: &mut NcclComm,
        world: usize,
        id: UniqueId,
        rank: usize,
        nonblocking: bool,
    ) -> Result<()> {
        let (n, r) = (world as c_int, rank as c_int);
        match api.fns.comm_init_rank_config.filter(|_| nonblocking) {
            Some(f) => {
                let mut config = Config::new(false);
                // SAFETY: `slot` receives the communicator; the id is shared by all ranks;
                // `config` is an initialised ncclConfig_t of NCCL 2.14's layout that lives
                // across the call (NCCL copies it).
                let code = unsafe { f(slot, n, id, r, (&mut config as *mut Config).cast()) };
                Self::in_progress_ok(api, "ncclCommInitRankConfig", code, true)
            }
            None => {
                // SAFETY: `slot` receives the communicator; the id is shared by all ranks.
                let code = unsafe { (api.fns.comm_init_rank)(slot, n, id, r) };
                api.check("ncclCommInitRank", code, None)
            }
        }
    }

    /// `code` as a result, where `ncclInProgress` of a non-blocking call is success.
    fn in_progress_ok(api: &Api, call: &'static str, code: c_int, nonblocking: bool) -> Result<()> {
        if nonblocking && code == IN_PROGRESS {
            Ok(())
        } else {
            api.check(call, code, None)
        }
    }

    fn wrap(
        api: Arc<Api>,
        rt: Arc<R>,
        comm: NcclComm,
        dev: usize,
        (rank, world): (usize, usize),
        local: Option<Arc<LocalWorld>>,
        Mode {
            nonblocking,
            timeout,
            check: check_collectives,
        }: Mode,
    ) -> Result<Self> {
        let setup = rt
            .device_token(dev)
            .and_then(|token| Ok((token, ApiMemory::from_runtime_malloc(rt.clone(), dev, 4)?)));
        let (device_token, barrier) = match setup {
            Ok(x) => x,
            Err(e) => {
                // SAFETY: the communicator was just created and is not used elsewhere.
                unsafe { (api.fns.comm_destroy)(comm) };
                return Err(e);
            }
        };
        let core = Arc::new(Core {
            api: api.clone(),
            rt: rt.clone(),
            comm,
            dev,
            rank,
            lock: crate::lock::CommLock::new(),
            state: AtomicU8::new(LIVE),
            shadow: Mutex::new(None),
            nonblocking,
            timeout_ms: AtomicU64::new(timeout.as_millis() as u64),
            abort_requested: AtomicBool::new(false),
            ce_pending: Mutex::new(Vec::new()),
            ce_flags: std::sync::OnceLock::new(),
        });
        Ok(ApiComm {
            api,
            rt,
            comm,
            dev,
            rank,
            world,
            device_token,
            registry: Registry::new(),
            barrier,
            core,
            ce: CopyEngine {
                world: local,
                ..CopyEngine::default()
            },
            autos: AtomicU32::new(0),
            check_collectives,
            scratch: Mutex::new(None),
            wanted_policy: Mutex::new(None),
            agreed: std::sync::OnceLock::new(),
        })
    }

    /// The loaded library.
    pub fn api(&self) -> &Arc<Api> {
        &self.api
    }
    /// The device runtime.
    pub fn runtime(&self) -> &Arc<R> {
        &self.rt
    }
    /// The raw `ncclComm_t`, for calling the library directly (the overhead benchmark does,
    /// to compare). Using it while this communicator is used from another thread breaks
    /// NCCL's rule; that is the caller's responsibility.
    pub fn raw_comm(&self) -> NcclComm {
        self.comm
    }

    /// This rank's device.
    pub fn device(&self) -> usize {
        self.dev
    }

    /// How many all-to-alls and all-gathers took the copy-engine path so far (the rest
    /// went to the library).
    pub fn copy_engine_calls(&self) -> u64 {
        self.ce.calls.load(Ordering::Relaxed)
    }

    /// Runs `f` on the communicator: not destroyed, not used by another thread, with this
    /// rank's device current.
    #[inline]
    pub(crate) fn call<T>(&self, f: impl FnOnce(NcclComm) -> Result<T>) -> Result<T> {
        // The state is read under the lock that `destroy` also takes, so a communicator
        // aborted by another thread is never used after it was freed.
        let core = &self.core;
        let _g = core.locked()?;
        core.live()?;
        // Read before the library runs: after it, the core's line is cold, and the release
        // (a plain store) is then the only touch of it.
        let nonblocking = core.nonblocking;
        let r = self
            .rt
            .with_device_token(self.dev, self.device_token, || f(self.comm));
        if nonblocking {
            if GROUP_DEPTH.with(|d| d.get()) > 0 {
                // Inside a group the library defers the work to ncclGroupEnd, which
                // settles every communicator the group called.
                self.join_group();
            } else {
                core.settle_locked("a non-blocking call")?;
            }
        }
        r
    }

    /// Remembers this communicator as a member of the thread's open group.
    fn join_group(&self) {
        let me: Arc<dyn Watched> = self.core.clone();
        GROUP_MEMBERS.with(|m| {
            let mut m = m.borrow_mut();
            if !m.iter().any(|x| Arc::ptr_eq(x, &me)) {
                m.push(me);
            }
        });
    }

    /// A library call's result; `ncclInProgress` of a non-blocking communicator is success
    /// here (`call` settles it).
    #[inline]
    pub(crate) fn check(&self, call: &'static str, code: c_int) -> Result<()> {
        if code == IN_PROGRESS && self.core.nonblocking {
            return Ok(());
        }
        self.api.check(call, code, Some(self.comm))
    }

    /// NCCL 2.28.9's symmetric-window all-gather, in place, corrupts the ranks' chunks when
    /// a chunk is not a multiple of 4 bytes (measured on 2x H200: f16/bf16/i8/u8 with 1001
    /// elements per rank get garbage from the next 8-byte boundary on; 4- and 8-byte types
    /// and out-of-place calls are right; so is a world of one). Refused as `Unsupported` rather than computed
    /// wrong; see docs/results.md.
    pub(crate) fn check_window_all_gather(
        &self,
        send: &unicomm_core::Slice<'_, ApiMemory<R>>,
        recv: &unicomm_core::Slice<'_, ApiMemory<R>>,
        chunk: usize,
    ) -> Result<()> {
        // One rank gathers nothing from peers (and was measured right).
        if self.world == 1 || chunk % 4 == 0 || send.address() != recv.address() + self.rank * chunk
        {
            return Ok(());
        }
        if !self
            .registry
            .covering(recv.address(), chunk * self.world)?
            .is_some_and(RegKind::is_window)
        {
            return Ok(());
        }
        Err(Error::unsupported(
            format!("in-place all_gather in a symmetric window with {chunk}-byte chunks"),
            "chunks that are a multiple of 4 bytes (or out of place, or a non-window buffer)",
            format!(
                "{} {}, whose symmetric in-place all-gather corrupts such chunks",
                self.api.flavor.library, self.api.version
            ),
        ))
    }

    pub(crate) fn send_recv(
        &self,
        buf: *mut c_void,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: *mut c_void,
        send: bool,
    ) -> Result<()> {
        let pair = self.api.fns.send.zip(self.api.fns.recv);
        let (s, r) = self
            .api
            .gated("point-to-point send/recv", Version::new(2, 7, 0), pair)?;
        // SAFETY: device pointers of this rank's memory holding `count` elements (checked by
        // the caller); the stream belongs to this device.
        let code = unsafe {
            if send {
                s(buf, count, dtype.nccl(), peer as c_int, self.comm, stream)
            } else {
                r(buf, count, dtype.nccl(), peer as c_int, self.comm, stream)
            }
        };
        self.check(if send { "ncclSend" } else { "ncclRecv" }, code)
    }

    /// Registers `mem[offset..offset+bytes]` through `call` (which gets the communicator and
    /// the address, and returns the library's handle) and records it; zero bytes never reach
    /// the library (there is nothing to register).
    pub(crate) fn register_range(
        &self,
        mem: &ApiMemory<R>,
        offset: usize,
        bytes: usize,
        kind: RegKind,
        call: impl FnOnce(NcclComm, *mut c_void) -> Result<*mut c_void>,
    ) -> Result<RawHandle> {
        self.check_memory(mem)?;
        let addr = mem.range(offset, bytes, "bytes")?;
        let h = if bytes == 0 {
            RawHandle(NEXT_EMPTY.fetch_add(1, Ordering::Relaxed))
        } else {
            RawHandle(self.call(|c| call(c, addr as *mut c_void))? as usize)
        };
        self.registry.insert(h, addr, bytes, kind)?;
        Ok(h)
    }

    /// Deregisters a live handle of `kind` with `f` (`ncclCommDeregister` or
    /// `ncclCommWindowDeregister`), then forgets it.
    pub(crate) fn deregister_handle(
        &self,
        handle: RawHandle,
        kind: RegKind,
        name: &'static str,
        f: Option<unsafe extern "C" fn(NcclComm, *mut c_void) -> c_int>,
    ) -> Result<()> {
        // Taken out of the table before the library call, as one step: of two threads
        // deregistering one handle, one reaches the library and the other gets an error.
        self.registry.release(handle, kind, || {
            if handle.0 >= usize::MAX / 2 {
                return Ok(()); // a zero-byte registration never reached the library
            }
            let f =
                f.ok_or_else(|| Error::invalid("handle", format!("the library has no {name}")))?;
            // SAFETY: a live handle of this kind of this communicator, taken out of the
            // table above, so deregistered once.
            self.call(|c| self.check(name, unsafe { f(c, handle.0 as *mut c_void) }))
        })
    }

    pub(crate) fn group<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.api.check(
            "ncclGroupStart",
            // SAFETY: no arguments.
            unsafe { (self.api.fns.group_start)() },
            None,
        )?;
        let r = f();
        // SAFETY: closes the group opened above.
        let end = self.check("ncclGroupEnd", unsafe { (self.api.fns.group_end)() });
        let r = r?;
        end?;
        Ok(r)
    }

    /// `ncclCommWindowRegister` over `mem[offset..offset+bytes]`, recorded as `kind` (a
    /// window, or the window of an automatic registration). NULL from the library (no
    /// symmetric memory here) is `Unsupported`.
    pub(crate) fn window_register(
        &self,
        mem: &ApiMemory<R>,
        offset: usize,
        bytes: usize,
        kind: RegKind,
    ) -> Result<RawHandle> {
        let fns = &self.api.fns;
        let f = self.api.gated(
            "symmetric windows (ncclCommWindowRegister)",
            self.api.flavor.windows_since,
            fns.window_register
                .filter(|_| fns.window_deregister.is_some()),
        )?;
        self.not_in_group("a symmetric window registration")?;
        self.register_range(mem, offset, bytes, kind, |c, addr| {
            let w = if self.core.nonblocking {
                let mut w = std::ptr::null_mut();
                // SAFETY: `addr..addr+bytes` is device memory of this rank; `w` receives
                // the window and lives until the call settles below.
                let code = unsafe { f(c, addr, bytes, &mut w, WIN_COLL_SYMMETRIC) };
                self.check("ncclCommWindowRegister", code)?;
                // Non-blocking: the window is written when the call is done.
                self.core.settle_locked("ncclCommWindowRegister")?;
                w
            } else {
                // Collective: it waits for the peers on the host; bounded by the deadline.
                let (sc, sa) = (SendComm(c), SendComm(addr));
                let (code, w) = self.core.bounded_locked(
                    "ncclCommWindowRegister",
                    move || {
                        let (sc, sa) = (sc, sa);
                        let mut w = std::ptr::null_mut();
                        // SAFETY: as above; the caller holds the communicator's lock
                        // while this runs, and gives the communicator up if it does not
                        // return in time.
                        let code = unsafe { f(sc.0, sa.0, bytes, &mut w, WIN_COLL_SYMMETRIC) };
                        (code, SendComm(w))
                    },
                    |_| {},
                )?;
                self.check("ncclCommWindowRegister", code)?;
                w.0
            };
            if w.is_null() {
                // NCCL returns success and no window where symmetric memory is unsupported.
                return Err(Error::unsupported(
                    "symmetric window",
                    "symmetric-memory support (cuMem memory from ncclMemAlloc, NVLink or a supported transport)",
                    format!("{} {} returned a NULL window", self.api.flavor.library, self.api.version),
                ));
            }
            Ok(w)
        })
    }

    /// Collective registrations (window, the second communicator's split) are refused
    /// inside `Comm::group`: NCCL would defer them to the group's end and write their
    /// out-parameter then, after this call returned (a dangling write), and a bounded call
    /// cannot run on another thread (groups are per thread). The mock accepts them there
    /// (its registrations are not deferred): documented in docs/reliability.md.
    pub(crate) fn not_in_group(&self, what: &str) -> Result<()> {
        if GROUP_DEPTH.with(|d| d.get()) > 0 {
            return Err(Error::invalid(
                "group",
                format!("{what} is collective and cannot be called inside Comm::group on {}; call it before or after the group", self.api.flavor.library),
            ));
        }
        Ok(())
    }

    /// The library's window deregistration of `h` alone (the caller has taken `h` out of
    /// the registry).
    pub(crate) fn window_deregister_raw(&self, h: RawHandle) -> Result<()> {
        if h.0 >= usize::MAX / 2 {
            return Ok(()); // a zero-byte registration never reached the library
        }
        let f = self.api.fns.window_deregister.ok_or_else(|| {
            Error::invalid("handle", "the library has no ncclCommWindowDeregister")
        })?;
        self.call(|c| {
            // SAFETY: a live window of this communicator, taken out of the registry by the
            // caller, so deregistered once.
            self.check("ncclCommWindowDeregister", unsafe {
                f(c, h.0 as *mut c_void)
            })
        })
    }

    /// A stream-ordered barrier on `st`: an in-place one-element all-reduce of the
    /// communicator's own 4 bytes (NCCL has no barrier).
    pub(crate) fn barrier_on(&self, st: *mut c_void) -> Result<()> {
        let b = self.barrier.ptr as *mut c_void;
        let (f32, sum) = (DataType::F32.nccl(), unicomm_core::ReduceOp::Sum.nccl());
        let all_reduce = self.api.fns.all_reduce;
        self.call(|c| {
            // SAFETY: the communicator's own 4-byte device buffer, one f32 element, in
            // place, on a stream of this device.
            let code = unsafe { all_reduce(b, b, 1, f32, sum, c, st) };
            self.check("ncclAllReduce", code)
        })
    }

    pub(crate) fn destroy(&self, finalize: bool) -> Result<()> {
        self.core.destroy(finalize)
    }
}

impl<R: Runtime> Drop for ApiComm<R> {
    fn drop(&mut self) {
        // Registrations borrow the typed communicator, so none is alive here; a raw user
        // may have left some: deregister them before the communicator goes (NCCL: after
        // destroy, deregistering is a use-after-free). Windows are not deregistered one by
        // one: that call is collective, and one rank's drop cannot make its peers join it;
        // ncclCommDestroy/ncclCommAbort release a communicator's windows with it (NCCL's
        // documented lifecycle of communicator resources).
        for h in self.registry.handles(RegKind::Buffer) {
            let _ = Collective::deregister(self, h);
        }
        // Finalized where its copy-engine work completed within the deadline; else aborted,
        // which releases this rank's signal waits beside the library's teardown (a finalize
        // would wait for the device, which such a wait holds, with no end in non-blocking
        // mode).
        let finalize = self.core.live().is_err() || self.copies_done_in_time();
        if !finalize {
            eprintln!(
                "unicomm: rank {}: copy-engine work still waiting at the communicator's drop after {:?}: aborted instead of finalized",
                self.rank,
                self.core.timeout()
            );
        }
        match self.core.locked_for_teardown(finalize) {
            Ok(_g) => {
                let _ = self.core.destroy_locked(finalize);
            }
            Err(e) => {
                // Another thread's call (an abort, a settle) still holds the communicator
                // past twice its deadline: it may still use the copy-engine memory below, so
                // that is left mapped and allocated, as is the communicator.
                eprintln!(
                    "unicomm: rank {}: the communicator's drop: {e}; left as it is (not destroyed, its copy-engine memory not freed)",
                    self.rank
                );
                if let Some(crate::signals::Sync::Signals(sig)) = self.ce.sync.get_mut() {
                    std::mem::forget(sig.block.take());
                }
                return;
            }
        }
        // Peers' memory still mapped for windows the communicator took with it, and the
        // copy-engine signal blocks (peers' mapped, this rank's own), once no copy uses them.
        let mut maps: Vec<(usize, usize)> =
            std::mem::take(&mut *self.ce.mapped.lock().unwrap_or_else(|e| e.into_inner()))
                .into_values()
                .flatten()
                .collect();
        let mut own = None;
        if let Some(crate::signals::Sync::Signals(sig)) = self.ce.sync.get_mut() {
            maps.append(&mut sig.mapped);
            own = sig.block.take();
        }
        let n = maps.len() + usize::from(own.is_some());
        let freed = (maps.is_empty() && own.is_none())
            || self.release_after_copies(n, || self.unmap_now(maps));
        if !freed {
            // Peers' writes into it may still be pending: leaked, never freed under them.
            std::mem::forget(own);
        }
    }
}
