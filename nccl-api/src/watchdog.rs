//! Deadlines and asynchronous errors of NCCL-API communicators: what PyTorch's
//! `TORCH_NCCL_ASYNC_ERROR_HANDLING` watchdog does, in the waits themselves.
//!
//! - With `UNICOMM_NONBLOCKING=1`, communicators are created non-blocking where the library
//!   has `ncclCommInitRankConfig` (NCCL >= 2.14, RCCL): a call that returns
//!   `ncclInProgress` is settled by polling `ncclCommGetAsyncError` until it is done, with
//!   the communicator's deadline, so creation and connection waits are bounded too. It is
//!   not the default: on 2x H200 with NCCL 2.28.9 every collective call then costs about
//!   50 us more on the host, raw NCCL and unicomm alike (docs/reliability.md).
//! - Every host wait of a stream (synchronize, copies to and from the host) polls the stream
//!   and the asynchronous errors of the communicators that enqueued work on it; at the
//!   deadline (`UNICOMM_TIMEOUT_MS`, or `Comm::set_timeout`) it aborts them and returns
//!   `Timeout`; on an asynchronous error it aborts them and returns that error.
//! - `abort` from another thread interrupts a settling call and makes a stream wait return.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use unicomm_core::{Error, Result};

use crate::api::{Api, NcclComm};
use crate::auto::Shadow;
use crate::runtime::Runtime;

pub(crate) const LIVE: u8 = 0;
pub(crate) const FINALIZED: u8 = 1;
pub(crate) const ABORTED: u8 = 2;

/// `ncclInProgress`: a non-blocking call still running.
pub(crate) const IN_PROGRESS: c_int = 7;
/// How long an abort releases the copy-engine signal waits before the library's teardown
/// (`Core::destroy_locked`): they drain within milliseconds where nothing else holds them.
const FIRST_RELEASE: Duration = Duration::from_secs(1);

/// `NCCL_API_MAGIC`, checked by `ncclCommInitRankConfig`.
const API_MAGIC: u32 = 0xcafe_beef;
/// `NCCL_CONFIG_UNDEF_INT`.
const UNDEF: c_int = c_int::MIN;

/// `ncclConfig_t` as NCCL 2.14 laid it out; a library reads the fields of the version we
/// name and takes its defaults for the rest (nccl.h: `size`, `magic`, `version`).
#[repr(C)]
pub(crate) struct Config {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const std::ffi::c_char,
}

impl Config {
    /// `NCCL_CONFIG_INITIALIZER` of 2.14 with `blocking` set.
    pub(crate) fn new(blocking: bool) -> Self {
        Config {
            size: std::mem::size_of::<Config>(),
            magic: API_MAGIC,
            version: 21400,
            blocking: c_int::from(blocking),
            cga_cluster_size: UNDEF,
            min_ctas: UNDEF,
            max_ctas: UNDEF,
            net_name: std::ptr::null(),
        }
    }
}

/// `UNICOMM_NONBLOCKING`: `0` (the default) or `1`.
pub(crate) fn nonblocking_from_env() -> Result<bool> {
    unicomm_core::env::switch("UNICOMM_NONBLOCKING", false)
}

/// A pause that starts as a spin (a collective often ends within microseconds) and grows
/// to 1 ms, so a long wait costs little CPU and a short one little latency.
pub(crate) struct Backoff(u32);

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff(0)
    }
    pub(crate) fn pause(&mut self) {
        self.0 = self.0.saturating_add(1);
        match self.0 {
            0..=64 => std::hint::spin_loop(),
            65..=256 => std::thread::yield_now(),
            n => std::thread::sleep(Duration::from_micros(u64::from((n - 256).min(1000)))),
        }
    }
}

/// Polls `ncclCommGetAsyncError(comm)` until the library is done with `comm`'s last call.
/// `stop` says whether to give up (an abort was asked for) and is checked between polls.
/// Returns `Ok` when done, the library's error when it failed, `Timeout` at the deadline.
pub(crate) fn settle_raw(
    api: &Api,
    comm: NcclComm,
    what: &str,
    timeout: Duration,
    stop: &dyn Fn() -> bool,
) -> Result<()> {
    let Some(get) = api.fns.comm_get_async_error else {
        return Ok(()); // without it, no call returns ncclInProgress (blocking library)
    };
    let start = Instant::now();
    let mut backoff = Backoff::new();
    loop {
        let mut state = 0;
        // SAFETY: a live communicator of this library (the caller's contract); one int out.
        let code = unsafe { get(comm, &mut state) };
        api.check("ncclCommGetAsyncError", code, Some(comm))?;
        match state {
            0 => return Ok(()),
            IN_PROGRESS => {}
            e => return api.check("ncclCommGetAsyncError (asynchronous error)", e, Some(comm)),
        }
        if stop() {
            return Err(Error::Aborted {
                reason: format!("{what}: aborted while the library was still working"),
            });
        }
        if start.elapsed() >= timeout {
            return Err(Error::Timeout {
                what: format!("{what} (ncclInProgress until the deadline)"),
                after: start.elapsed(),
            });
        }
        backoff.pause();
    }
}

/// A raw communicator handed to the thread of [`bounded`].
#[derive(Clone, Copy)]
pub(crate) struct SendComm(pub(crate) NcclComm);
// SAFETY: a communicator may move between threads (NCCL's rule is one thread at a time,
// which `bounded`'s callers keep: the caller does not use it while the thread does).
unsafe impl Send for SendComm {}

/// Runs a blocking library call that waits for the peers on the host (`ncclCommInitRank`,
/// `ncclCommFinalize` of a blocking communicator: NCCL gives them no deadline) on a thread
/// of its own, and waits for it at most `timeout`. Past the deadline the result is
/// `Timeout`, and the call is left to finish on its thread, whose result then goes to
/// `late` (to free what it created); meanwhile nothing else may use what the call uses.
pub(crate) fn bounded<T: Send + 'static>(
    what: &str,
    timeout: Duration,
    f: impl FnOnce() -> T + Send + 'static,
    late: impl FnOnce(T) + Send + 'static,
) -> Result<T> {
    enum Slot<T> {
        Waiting,
        Done(T),
        Abandoned,
    }
    let shared = Arc::new((Mutex::new(Slot::Waiting), std::sync::Condvar::new()));
    let theirs = shared.clone();
    std::thread::Builder::new()
        .name("unicomm-bounded".into())
        .spawn(move || {
            let r = f();
            let (m, cv) = &*theirs;
            let mut slot = m.lock().unwrap_or_else(|e| e.into_inner());
            if matches!(*slot, Slot::Abandoned) {
                drop(slot);
                late(r);
            } else {
                *slot = Slot::Done(r);
                cv.notify_all();
            }
        })
        .map_err(|e| Error::invalid("thread", format!("{what}: no thread for the call: {e}")))?;
    let start = Instant::now();
    let (m, cv) = &*shared;
    let mut slot = m.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if let Slot::Done(_) = &*slot {
            if let Slot::Done(r) = std::mem::replace(&mut *slot, Slot::Waiting) {
                return Ok(r);
            }
        }
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            *slot = Slot::Abandoned;
            return Err(Error::Timeout {
                what: format!(
                    "{what} (a blocking call waiting for the peers; it was left to finish on its own thread)"
                ),
                after: start.elapsed(),
            });
        }
        slot = cv
            .wait_timeout(slot, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// What a rank's communicator shares with its streams (which poll it while they wait) and
/// with the group it takes part in.
// `repr(C)` and a line of its own: what every call reads (the lock, the state, whether the
// communicator is non-blocking, its handle) comes first, in one cache line apart from the
// `Arc`'s counts, so a call after the library's enqueue (which leaves this cold) misses once.
#[repr(C, align(64))]
pub(crate) struct Core<R: Runtime> {
    /// NCCL communicators must not be called from two threads at once.
    pub(crate) lock: crate::lock::CommLock,
    pub(crate) state: AtomicU8,
    /// Created with `blocking = 0`: calls may return `ncclInProgress`.
    pub(crate) nonblocking: bool,
    /// Set by `abort` before it takes the lock, so a call settling under the lock gives up.
    pub(crate) abort_requested: AtomicBool,
    pub(crate) comm: NcclComm,
    pub(crate) api: Arc<Api>,
    pub(crate) rt: Arc<R>,
    pub(crate) dev: usize,
    pub(crate) rank: usize,
    /// The second communicator of automatic registrations (`auto.rs`), once created.
    pub(crate) shadow: Mutex<Option<Arc<Shadow>>>,
    /// The deadline of every wait, in milliseconds.
    pub(crate) timeout_ms: AtomicU64,
    /// The copy-engine path's last operation per stream (raw stream, event): what freeing
    /// its memory and releasing its signal waits wait for. With signals, held while an
    /// operation is enqueued. Lock order: `lock` before this one, never the other way.
    pub(crate) ce_pending: Mutex<Vec<(usize, R::Event)>>,
    /// This rank's signal block (base address, world), once the ranks agreed on signals:
    /// the flags an abort writes so the streams waiting on them drain (`signals.rs`).
    pub(crate) ce_flags: std::sync::OnceLock<(usize, usize)>,
}

// SAFETY: the raw communicators are used only under `lock` (see `ApiComm`'s impls).
unsafe impl<R: Runtime> Send for Core<R> {}
// SAFETY: as above.
unsafe impl<R: Runtime> Sync for Core<R> {}

impl<R: Runtime> Core<R> {
    /// A blocking communicator's library call that waits for the peers on the host
    /// (collective window registration, split), with the lock held: run by [`bounded`]
    /// under the deadline. Past it the communicator is given up (state `ABORTED`: nothing
    /// here calls it again, its thread keeps it) and the result is `Timeout`; `late`
    /// receives the call's result if it ever returns.
    pub(crate) fn bounded_locked<T: Send + 'static>(
        &self,
        what: &str,
        work: impl FnOnce() -> T + Send + 'static,
        late: impl FnOnce(T) + Send + 'static,
    ) -> Result<T> {
        let (rt, dev) = (self.rt.clone(), self.dev);
        let r = bounded(
            what,
            self.timeout(),
            move || rt.with_device(dev, || Ok(work())),
            move |r| {
                if let Ok(t) = r {
                    late(t)
                }
            },
        );
        match r {
            Ok(inner) => inner,
            Err(e) => {
                self.state.store(ABORTED, Ordering::Release);
                Err(e)
            }
        }
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    /// The lock, waited for at most twice the deadline: a holder waiting for the library is
    /// bounded by one (`bounded_locked`, the settling of non-blocking calls), so a wait
    /// past two means it is stuck.
    #[inline]
    pub(crate) fn locked(&self) -> Result<crate::lock::CommGuard<'_>> {
        self.lock.lock(|| self.timeout().saturating_mul(2))
    }

    /// `Ok` while the communicator is live; `Aborted` after an abort, `InvalidArgument`
    /// after finalize. Read under `lock` where the library is called next.
    #[inline]
    pub(crate) fn live(&self) -> Result<()> {
        match self.state.load(Ordering::Acquire) {
            LIVE => Ok(()),
            ABORTED => Err(self.aborted_error()),
            _ => Err(Error::invalid("comm", "the communicator was finalized")),
        }
    }

    /// What every call on an aborted communicator returns.
    #[cold]
    fn aborted_error(&self) -> Error {
        Error::Aborted {
            reason: format!("rank {}'s communicator was aborted", self.rank),
        }
    }

    /// The second communicator of automatic registrations, once created.
    pub(crate) fn shadow_handle(&self) -> Option<NcclComm> {
        self.shadow
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|s| s.comm)
    }

    /// With the lock held: waits until the library is done with the last calls on this
    /// rank's communicators (non-blocking mode). On an error or at the deadline the
    /// communicator is aborted (it cannot be used after either).
    pub(crate) fn settle_locked(&self, what: &str) -> Result<()> {
        if !self.nonblocking || self.state.load(Ordering::Acquire) != LIVE {
            return Ok(());
        }
        let stop = || self.abort_requested.load(Ordering::Relaxed);
        let mut r = settle_raw(&self.api, self.comm, what, self.timeout(), &stop);
        if r.is_ok() {
            if let Some(sh) = self.shadow_handle() {
                r = settle_raw(&self.api, sh, what, self.timeout(), &stop);
            }
        }
        if let Err(e) = &r {
            if !matches!(e, Error::Aborted { .. }) {
                let _ = self.destroy_locked(false);
            }
        }
        r
    }

    /// With the lock held: the first asynchronous error of this rank's communicators
    /// (`ncclCommGetAsyncError`); `ncclInProgress` is not an error.
    pub(crate) fn async_error_locked(&self) -> Result<()> {
        let Some(get) = self.api.fns.comm_get_async_error else {
            return Ok(());
        };
        match self.state.load(Ordering::Acquire) {
            LIVE => {}
            ABORTED => return Err(self.aborted_error()),
            _ => return Ok(()),
        }
        for c in std::iter::once(self.comm).chain(self.shadow_handle()) {
            let mut state = 0;
            // SAFETY: a live communicator (state checked under the lock); one int out.
            let code = unsafe { get(c, &mut state) };
            self.api.check("ncclCommGetAsyncError", code, Some(c))?;
            if state != 0 && state != IN_PROGRESS {
                return self.api.check(
                    "ncclCommGetAsyncError (asynchronous error)",
                    state,
                    Some(c),
                );
            }
        }
        Ok(())
    }

    /// Frees the communicator(s) (finalize + destroy, or abort), with the lock held. An
    /// abort, or a finalize that failed (a peer gone), also releases the copy-engine path's
    /// signal waits of this rank, as the abort ends the library's kernels.
    ///
    /// During an abort the waits are released before the library's teardown and beside
    /// it: NCCL 2.28's `ncclCommAbort` synchronizes with the device before it returns (its
    /// streams, its frees), which a signal wait of this rank blocks until it is released,
    /// and while it waits for the device, other threads' calls into the driver can wait for
    /// it too. Released after the abort, the two waited for each other for good (seen with
    /// one rank per process: the abort never returned). So first the waits that need only
    /// their signals are released (at most `FIRST_RELEASE`: everything, where no library
    /// kernel holds a stream ahead of them); what is left waits behind kernels that only
    /// the abort ends, and is released on a thread of its own during it.
    pub(crate) fn destroy_locked(&self, finalize: bool) -> Result<()> {
        let next = if finalize { FINALIZED } else { ABORTED };
        if self.state.swap(next, Ordering::AcqRel) != LIVE {
            return Ok(());
        }
        if finalize {
            let r = self.teardown_locked(true);
            if r.is_err() {
                self.release_signals();
            }
            return r;
        }
        if self.ce_flags.get().is_none()
            || self.release_signals_within(FIRST_RELEASE.min(self.timeout()), false)
        {
            return self.teardown_locked(false);
        }
        std::thread::scope(|s| {
            let beside = std::thread::Builder::new()
                .name("unicomm-release".into())
                .spawn_scoped(s, || self.release_signals());
            let r = self.teardown_locked(false);
            match beside {
                // The release ends by its own deadline; it never panics (it reports).
                Ok(h) => {
                    let _ = h.join();
                }
                // No thread to be had: released after the teardown, as a last resort.
                Err(_) => self.release_signals(),
            }
            r
        })
    }

    /// The library calls of [`Core::destroy_locked`], once the state says so.
    fn teardown_locked(&self, finalize: bool) -> Result<()> {
        let (api, comm) = (self.api.clone(), self.comm);
        let shadow = self.shadow.lock().unwrap_or_else(|e| e.into_inner()).take();
        let timeout = self.timeout();
        if finalize && !self.nonblocking {
            // A blocking ncclCommFinalize waits for the peers with no deadline of its own
            // (a dead peer: forever); it gets this communicator's, on a thread of its own.
            // Past it the communicator is left to that thread (state is FINALIZED already,
            // so nothing here touches it again) and the caller gets `Timeout`.
            let (rt, dev) = (self.rt.clone(), self.dev);
            let (main, second) = (SendComm(comm), shadow.as_ref().map(|s| SendComm(s.comm)));
            let work = move || -> Result<()> {
                // Whole values moved in (not their raw fields: those are not Send).
                let (main, second) = (main, second);
                rt.with_device(dev, || {
                    let one = |c: NcclComm, which: &'static str| -> Result<()> {
                        if let Some(f) = api.fns.comm_finalize {
                            // SAFETY: a live communicator, finalized once (the state swap
                            // above lets one caller through).
                            api.check(which, unsafe { f(c) }, Some(c))?;
                        }
                        // SAFETY: the same communicator, destroyed once.
                        api.check(
                            "ncclCommDestroy",
                            unsafe { (api.fns.comm_destroy)(c) },
                            None,
                        )
                    };
                    if let Some(sh) = second {
                        one(sh.0, "ncclCommFinalize (second communicator)")?;
                    }
                    one(main.0, "ncclCommFinalize")
                })
            };
            return bounded("ncclCommFinalize", timeout, work, |_| {})?;
        }
        let settle = |c: NcclComm, what: &str| -> Result<()> {
            if self.nonblocking {
                settle_raw(&api, c, what, timeout, &|| false)
            } else {
                Ok(())
            }
        };
        self.rt.with_device(self.dev, || {
            // The second communicator goes first, the same way (its registrations with it).
            if let Some(sh) = shadow {
                let code = if finalize {
                    if let Some(f) = api.fns.comm_finalize {
                        // SAFETY: the live second communicator, finalized once.
                        let code = unsafe { f(sh.comm) };
                        if code == 0 || code == IN_PROGRESS {
                            let _ = settle(sh.comm, "ncclCommFinalize (second communicator)");
                        }
                    }
                    // SAFETY: the live second communicator, destroyed once (taken above).
                    unsafe { (api.fns.comm_destroy)(sh.comm) }
                } else {
                    // SAFETY: as above, aborted once.
                    unsafe { (api.fns.comm_abort)(sh.comm) }
                };
                api.check("ncclCommDestroy (second communicator)", code, None)?;
            }
            if finalize {
                if let Some(f) = api.fns.comm_finalize {
                    // SAFETY: a live communicator, finalized once.
                    let code = unsafe { f(comm) };
                    if code == IN_PROGRESS {
                        // A finalize that cannot finish (a dead peer) ends in an abort.
                        if let Err(e) = settle(comm, "ncclCommFinalize") {
                            // SAFETY: the communicator is still live; aborted once.
                            unsafe { (api.fns.comm_abort)(comm) };
                            return Err(e);
                        }
                    } else {
                        api.check("ncclCommFinalize", code, Some(comm))?;
                    }
                }
                // SAFETY: a live communicator, destroyed once.
                api.check(
                    "ncclCommDestroy",
                    unsafe { (api.fns.comm_destroy)(comm) },
                    None,
                )
            } else {
                // SAFETY: a live communicator, aborted once.
                api.check("ncclCommAbort", unsafe { (api.fns.comm_abort)(comm) }, None)
            }
        })
    }

    /// `finalize` or `abort` from any thread. An abort first asks a call settling under the
    /// lock to give up, so it never waits for that call's deadline.
    pub(crate) fn destroy(&self, finalize: bool) -> Result<()> {
        let _g = self.locked_for_teardown(finalize)?;
        self.destroy_locked(finalize)
    }

    /// The lock for a teardown ([`Core::locked`]'s deadline); an abort first asks a call
    /// settling under it to give up.
    pub(crate) fn locked_for_teardown(&self, finalize: bool) -> Result<crate::lock::CommGuard<'_>> {
        if !finalize {
            self.abort_requested.store(true, Ordering::Relaxed);
        }
        self.locked()
    }
}

/// A communicator as its streams see it: polled for asynchronous errors while they wait,
/// aborted when a wait passes its deadline, settled at the end of a group.
pub(crate) trait Watched: Send + Sync {
    /// The deadline of waits on its work.
    fn timeout(&self) -> Duration;
    /// Its first asynchronous error, if any; `Ok` while it is busy on another thread.
    fn poll(&self) -> Result<()>;
    /// Aborts it (a wait on its work failed or timed out).
    fn abort(&self);
    /// Waits until the library is done with its last calls (non-blocking mode).
    fn settle(&self, what: &str) -> Result<()>;
    /// Whether it was aborted (its work on the stream may have been cut short).
    fn aborted(&self) -> bool;
}

impl<R: Runtime> Watched for Core<R> {
    fn timeout(&self) -> Duration {
        Core::timeout(self)
    }
    fn poll(&self) -> Result<()> {
        match self.lock.try_lock() {
            Some(_g) => self.async_error_locked(),
            None => Ok(()),
        }
    }
    fn abort(&self) {
        let _ = self.destroy(false);
    }
    fn settle(&self, what: &str) -> Result<()> {
        let _g = self.locked()?;
        self.settle_locked(what)
    }
    fn aborted(&self) -> bool {
        self.state.load(Ordering::Acquire) == ABORTED
    }
}

/// The communicators that enqueued work on one stream (weakly: a stream may outlive them),
/// each with whether this stream's waits already reported its abort; and which one was
/// added last, so that a communicator enqueuing again and again on its stream (every call
/// of a training step) takes no lock here.
#[derive(Default)]
#[repr(C)]
pub(crate) struct Watchers {
    /// The address of the communicator added last (0: none), stored under `list`'s lock.
    /// While an entry is in the list its `Weak` keeps the communicator's allocation, so no
    /// other communicator can have that address; every removal clears it. First: it is
    /// what every call reads.
    last: AtomicUsize,
    list: Mutex<Vec<(Weak<dyn Watched>, bool)>>,
}

fn same(a: &Weak<dyn Watched>, b: &Arc<dyn Watched>) -> bool {
    a.as_ptr() as *const () == Arc::as_ptr(b) as *const ()
}

impl Watchers {
    fn list(&self) -> std::sync::MutexGuard<'_, Vec<(Weak<dyn Watched>, bool)>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `w` unless it is there already (the common case: the one added last, no lock).
    #[inline]
    pub(crate) fn add<W: Watched + 'static>(&self, w: &Arc<W>) {
        let id = Arc::as_ptr(w) as *const () as usize;
        if self.last.load(Ordering::Acquire) == id {
            return;
        }
        self.add_new(w.clone(), id);
    }

    #[inline(never)]
    fn add_new(&self, w: Arc<dyn Watched>, id: usize) {
        let mut v = self.list();
        if !v.iter().any(|(x, _)| same(x, &w)) {
            v.retain(|(x, _)| x.strong_count() > 0);
            v.push((Arc::downgrade(&w), false));
        }
        self.last.store(id, Ordering::Release);
    }

    fn live(&self) -> Vec<(Arc<dyn Watched>, bool)> {
        let v = self.list();
        v.iter()
            .filter_map(|(w, told)| Some((w.upgrade()?, *told)))
            .collect()
    }

    /// A wait of this stream reported the abort of `ws` (its `Timeout`, or the
    /// asynchronous error that made it abort them).
    fn reported(&self, ws: &[(Arc<dyn Watched>, bool)]) {
        let mut v = self.list();
        for (x, told) in v.iter_mut() {
            if ws.iter().any(|(w, _)| same(x, w)) {
                *told = true;
            }
        }
    }

    /// Polls `idle` (the stream's query) until it says the work is done, watching the
    /// communicators meanwhile. `default` is the deadline when none is watching.
    ///
    /// Each abort of a communicator with work on the stream is reported once by the
    /// stream's waits: as the `Timeout` or the asynchronous error that caused it, else as
    /// `Aborted` by the first wait that finds the stream drained after it; the stream then
    /// forgets that communicator, and its next waits report only new errors. A stream that
    /// is still busy after an abort keeps reporting it (the poll of an aborted communicator
    /// fails at once), so a stuck stream never costs a second deadline.
    pub(crate) fn wait(
        &self,
        what: &str,
        default: Duration,
        mut idle: impl FnMut() -> Result<bool>,
    ) -> Result<()> {
        let ws = self.live();
        let timeout = ws.iter().map(|(w, _)| w.timeout()).min().unwrap_or(default);
        let start = Instant::now();
        let mut backoff = Backoff::new();
        let mut n: u32 = 0;
        loop {
            if idle()? {
                // An abort ends the communicator's kernels, so the stream drains: its work
                // did not complete.
                let aborted: Vec<&(Arc<dyn Watched>, bool)> =
                    ws.iter().filter(|(w, _)| w.aborted()).collect();
                if aborted.is_empty() {
                    return Ok(());
                }
                {
                    let mut v = self.list();
                    v.retain(|(x, _)| !aborted.iter().any(|(w, _)| same(x, w)));
                    self.last.store(0, Ordering::Release);
                }
                if aborted.iter().all(|(_, told)| *told) {
                    return Ok(());
                }
                // Not `poll`: the aborting thread may still hold the lock.
                return Err(Error::Aborted {
                    reason: format!(
                        "{what}: a communicator with work on it was aborted while it ran"
                    ),
                });
            }
            n = n.wrapping_add(1);
            // An asynchronous error ends the wait at once (polled every 64 rounds: the
            // stream query is the cheap, common exit).
            if n % 64 == 0 {
                for (w, _) in &ws {
                    if let Err(e) = w.poll() {
                        for (o, _) in &ws {
                            o.abort();
                        }
                        self.reported(&ws);
                        return Err(e);
                    }
                }
            }
            if start.elapsed() >= timeout {
                let e = Error::Timeout {
                    what: format!(
                        "{what}; the communicator(s) that enqueued work on it were aborted"
                    ),
                    after: start.elapsed(),
                };
                for (w, _) in &ws {
                    w.abort();
                }
                self.reported(&ws);
                // ncclCommAbort ends the communicators' kernels; what else the stream
                // holds is the caller's (documented in docs/reliability.md).
                return Err(e);
            }
            backoff.pause();
        }
    }
}

thread_local! {
    /// The communicators this thread's open group has called (settled at its end).
    pub(crate) static GROUP_MEMBERS: std::cell::RefCell<Vec<Arc<dyn Watched>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A communicator as a stream's waits see it: aborted or not.
    #[derive(Default)]
    struct Fake(AtomicBool);

    impl Watched for Fake {
        fn timeout(&self) -> Duration {
            Duration::from_secs(1)
        }
        fn poll(&self) -> Result<()> {
            Ok(())
        }
        fn abort(&self) {
            self.0.store(true, Ordering::Release);
        }
        fn settle(&self, _: &str) -> Result<()> {
            Ok(())
        }
        fn aborted(&self) -> bool {
            self.0.load(Ordering::Acquire)
        }
    }

    fn listed(w: &Watchers) -> usize {
        w.live().len()
    }

    /// The lock-free check of the last communicator added never hides one that is not in
    /// the list: repeated adds keep one entry; another communicator is added; an aborted
    /// one forgotten by a wait comes back when it enqueues again; a communicator dropped
    /// while listed keeps its address from any new one until its entry goes.
    #[test]
    fn the_last_added_shortcut_never_hides_a_communicator() {
        let w = Watchers::default();
        let a = Arc::new(Fake::default());
        let b = Arc::new(Fake::default());
        for _ in 0..3 {
            w.add(&a);
        }
        assert_eq!(listed(&w), 1);
        w.add(&b);
        w.add(&a);
        assert_eq!(listed(&w), 2);
        // A wait on an idle stream after `a`'s abort reports it and forgets it.
        a.abort();
        let r = w.wait("test stream", Duration::from_secs(1), || Ok(true));
        assert!(matches!(r, Err(Error::Aborted { .. })), "{r:?}");
        assert_eq!(listed(&w), 1);
        w.add(&a);
        assert_eq!(
            listed(&w),
            2,
            "a forgotten communicator enqueuing again is listed"
        );
        // Dropped while listed: a new communicator cannot take its address.
        drop(b);
        for _ in 0..100 {
            let c = Arc::new(Fake::default());
            w.add(&c);
            assert!(
                w.live()
                    .iter()
                    .any(|(x, _)| Arc::as_ptr(x) as *const () == Arc::as_ptr(&c) as *const ()),
                "a new communicator was taken for one already listed"
            );
        }
    }
}
