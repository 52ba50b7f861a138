//! One safe `ncclComm_t` ([`LibComm`]): the library's communicator with what NCCL's rules
//! ask around it. Its lock (NCCL forbids two threads calling one communicator at once), its
//! state (live, finalized, aborted: after either end no call reaches the freed handle), its
//! deadline, its part in the thread's group, and its teardown.
//!
//! It names no feature. What a feature must end with it is registered here: child
//! communicators (created from this one, settled, polled and destroyed with it, first), and
//! abort hooks (what would hold the library's teardown, released before and beside it).
//!
//! - With `UNICOMM_NONBLOCKING=1`, communicators are created non-blocking where the library
//!   has `ncclCommInitRankConfig` (NCCL >= 2.14, RCCL): a call that returns
//!   `ncclInProgress` is settled by polling `ncclCommGetAsyncError` until it is done, with
//!   the communicator's deadline, so creation and connection waits are bounded too. Not
//!   the default: each call costs about 50 us more on the host (docs/reliability.md).
//! - `abort` from another thread interrupts a settling call and makes a stream wait return.

#![allow(
    unsafe_code,
    reason = "the owner of the communicator: it vouches once for the shape of what it holds, a communicator and its children (the architecture test's UNSAFE_FILES lists it)"
)]

pub(crate) mod call;
mod derive;
mod sleep;
mod teardown;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use unicomm_core::state::{AtomicLife, Held, Life};
use unicomm_core::{Error, Result};

use crate::memory::ApiStream;
use crate::sys::api::{Api, NcclComm};
use crate::sys::calls::{Handle, OwnedComm, ShapedComm};
use crate::sys::runtime::Runtime;
use crate::wait::{settle_raw, Late};
use crate::watch::Watched;

/// How long an abort lets its hooks release what holds the device before the library's
/// teardown: they drain within milliseconds where nothing else holds them.
const FIRST_RELEASE: Duration = Duration::from_secs(1);

/// How a communicator ends: `ncclCommFinalize` + `ncclCommDestroy`, or `ncclCommAbort`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// Flush the work, wait for the peers, free (collective).
    Finalize,
    /// Stop the work and free, at once (local).
    Abort,
}

/// What a feature must release when the communicator is aborted, or its finalize fails:
/// work of its own that the library's kernels do not end (a stream wait on a flag) and that
/// would hold the library's teardown, which waits for the device.
pub(crate) trait AbortHook: Send + Sync {
    /// Releases it for at most `within`; whether everything it had completed (also where
    /// there was nothing). Reports what it could not release (stderr) when `report`.
    fn release(&self, within: Duration, report: bool) -> bool;
    /// A failure its own device work reported (a kernel that gave up at its deadline), read
    /// without waiting: the stream's waits report it as the communicator's error and abort
    /// it. Only asked of hooks added with [`LibComm::add_fault_hook`].
    fn fault(&self) -> Option<Error> {
        None
    }
    /// A call its device work refused on every rank alike, taken once (not aborting).
    fn refusal(&self) -> Option<Error> {
        None
    }
}

/// What the lock guards while the communicator is not ended: the library's communicator and
/// the children made from it (ended with it, first).
#[derive(Debug)]
pub(crate) struct Owned {
    comm: ShapedComm,
    children: Vec<ShapedComm>,
}

impl Owned {
    /// This communicator and its children, borrowed.
    fn handles(&self) -> impl Iterator<Item = Handle<'_>> {
        std::iter::once(self.comm.handle()).chain(self.children.iter().map(ShapedComm::handle))
    }

    /// Every communicator, the children first (the order they are ended in).
    fn into_all(self) -> Vec<OwnedComm> {
        self.children
            .into_iter()
            .chain([self.comm])
            .map(ShapedComm::into_owned)
            .collect()
    }
}

/// A communicator adopted by [`LibComm::adopt_child`], named by its place among the
/// children (they are only added until the communicator ends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Child(usize);

/// The lock's guard: the communicator's state and what it owns.
pub(crate) type Guard<'a> = parking_lot::MutexGuard<'a, Held<Owned>>;

/// One rank's `ncclComm_t`, shared with the streams that wait on its work.
pub(crate) struct LibComm<R: Runtime> {
    /// The state and, until it ends, the communicator and its children: NCCL communicators
    /// must not be called from two threads at once, so they are reached only through this
    /// lock, waited for at most twice the deadline.
    held: parking_lot::Mutex<Held<Owned>>,
    /// The held state's [`Life`], for readers without the lock (a stream's wait asking
    /// whether an abort came): written under the lock with each change ([`LibComm::mirror`]).
    life: AtomicLife,
    /// Created with `blocking = 0`: calls may return `ncclInProgress`.
    pub(crate) nonblocking: bool,
    /// Set by `abort` before it takes the lock, so a call settling under the lock gives up.
    abort_requested: AtomicBool,
    pub(crate) api: Arc<Api>,
    pub(crate) rt: Arc<R>,
    pub(crate) dev: usize,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    /// The deadline of every wait, in milliseconds (shared with the memory it allocates,
    /// whose frees wait for the device at most this long).
    timeout_ms: Arc<AtomicU64>,
    hooks: Mutex<Vec<Arc<dyn AbortHook>>>,
    /// The hook that reports its device work's failures ([`LibComm::add_fault_hook`]),
    /// read without a lock by every stream wait.
    fault_hook: std::sync::OnceLock<Arc<dyn AbortHook>>,
    /// The library's teardown, where it was given up at its deadline and still runs.
    late_end: Mutex<Option<Arc<Late>>>,
    /// A live graph captured this communicator's work: the library's abort waits for the
    /// graphs' destruction, so it is given [`teardown::ABORT_GRACE_UNDER_GRAPHS`], not the deadline.
    pub(crate) graphs_held: AtomicBool,
}

impl<R: Runtime> LibComm<R> {
    /// Wraps a communicator just created for `rank` of `world` on `dev`.
    pub(crate) fn new(
        api: Arc<Api>,
        rt: Arc<R>,
        comm: OwnedComm,
        unicomm_core::Place {
            rank,
            world,
            device: dev,
        }: unicomm_core::Place,
        nonblocking: bool,
        timeout: Duration,
    ) -> Self {
        // SAFETY: every creation passes the place it made the communicator for (the rank
        // count and rank of `ncclCommInitRank*`, of a grown world, or the place NCCL's split
        // and shrink give a child: by key, then parent rank, `split::members`).
        let comm = unsafe { comm.shaped(world, rank) };
        LibComm {
            held: parking_lot::Mutex::new(Held::Live(Owned {
                comm,
                children: Vec::new(),
            })),
            life: AtomicLife::new(Life::Live),
            nonblocking,
            abort_requested: AtomicBool::new(false),
            api,
            rt,
            dev,
            rank,
            world,
            timeout_ms: Arc::new(AtomicU64::new(timeout.as_millis() as u64)),
            hooks: Mutex::new(Vec::new()),
            fault_hook: std::sync::OnceLock::new(),
            late_end: Mutex::new(None),
            graphs_held: AtomicBool::new(false),
        }
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    /// The deadline as the memory this communicator allocates holds it (it follows
    /// [`LibComm::set_timeout`]).
    pub(crate) fn deadline(&self) -> Arc<AtomicU64> {
        self.timeout_ms.clone()
    }

    pub(crate) fn set_timeout(&self, t: Duration) {
        self.timeout_ms
            .store(t.as_millis() as u64, Ordering::Relaxed);
    }

    /// The lock, waited for at most twice the deadline: a holder waiting for the library is
    /// bounded by one (`bounded_locked`, the settling of non-blocking calls), so a wait
    /// past two means it is stuck.
    #[inline]
    pub(crate) fn locked(&self) -> Result<Guard<'_>> {
        // Uncontended (one thread per communicator, the common case): one atomic.
        match self.held.try_lock() {
            Some(g) => Ok(g),
            None => self.locked_within(),
        }
    }

    #[cold]
    #[inline(never)]
    fn locked_within(&self) -> Result<Guard<'_>> {
        let within = self.timeout().saturating_mul(2);
        self.held
            .try_lock_for(within)
            .ok_or_else(|| Error::Timeout {
                what: "the communicator's lock, held by another call".into(),
                after: within,
            })
    }

    /// What the lock holds while the communicator is live; `Aborted` after an abort,
    /// `InvalidArgument` after finalize or while suspended.
    #[inline]
    pub(crate) fn live<'g>(&self, held: &'g Held<Owned>) -> Result<&'g Owned> {
        held.live().ok_or_else(|| self.not_live(held.life()))
    }

    /// `Ok` while live, read without the lock (the state an abort or finalize publishes
    /// before its teardown): for work of unicomm's own beside the library's calls.
    pub(crate) fn live_now(&self) -> Result<()> {
        match self.life.load() {
            Life::Live => Ok(()),
            life => Err(self.not_live(life)),
        }
    }

    /// `InvalidArgument` while suspended (read without the lock).
    pub(crate) fn not_suspended(&self) -> Result<()> {
        match self.life.load() {
            Life::Suspended => Err(unicomm_core::state::suspended_error()),
            _ => Ok(()),
        }
    }

    #[cold]
    #[inline(never)]
    fn not_live(&self, life: Life) -> Error {
        match life {
            Life::Aborted => self.aborted_error(),
            Life::Suspended => unicomm_core::state::suspended_error(),
            _ => Error::invalid("comm", "the communicator was finalized"),
        }
    }

    /// The lock-free copy of the state follows `held` (called under the lock, after each
    /// change of it).
    fn mirror(&self, held: &Held<Owned>) {
        self.life.store(held.life());
    }

    #[cold]
    fn aborted_error(&self) -> Error {
        Error::aborted(format!("rank {}'s communicator was aborted", self.rank))
    }

    /// A new stream of this rank's device whose waits watch this communicator.
    pub(crate) fn create_stream(self: &Arc<Self>) -> Result<ApiStream<R>> {
        self.create_stream_with(unicomm_core::StreamPriority::Normal)
    }

    /// [`LibComm::create_stream`] of `priority`.
    pub(crate) fn create_stream_with(
        self: &Arc<Self>,
        priority: unicomm_core::StreamPriority,
    ) -> Result<ApiStream<R>> {
        let s = self.rt.create_stream_with(self.dev, priority)?;
        let st = ApiStream::new(self.rt.clone(), s, self.dev, self.timeout());
        st.watched_by(self);
        Ok(st)
    }

    /// Adopts a communicator created from this one (split): settled, polled and ended with
    /// this one, before it; lent by `Lent::child` (`call`). Where this one ended meanwhile, the
    /// child is aborted and the state's error returned.
    ///
    /// # Safety
    /// `child` has this communicator's ranks in its order (split with one color and this
    /// rank as its key: NCCL orders a split's ranks by key, then parent rank).
    pub(crate) unsafe fn adopt_child(&self, child: OwnedComm) -> Result<Child> {
        let mut g = self.locked()?;
        if let Held::Live(o) | Held::Suspended(o) = &mut *g {
            // SAFETY: the caller's contract: the parent's shape.
            o.children
                .push(unsafe { child.shaped(self.world, self.rank) });
            return Ok(Child(o.children.len() - 1));
        }
        let _ = self.api.comm_abort(child);
        Err(self.not_live(g.life()))
    }

    /// Registers what an abort must release (see [`AbortHook`]).
    pub(crate) fn add_abort_hook(&self, hook: Arc<dyn AbortHook>) {
        self.hooks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(hook);
    }

    /// Registers the hook whose device work reports failures ([`AbortHook::fault`]): from
    /// now on the stream's waits ask it. One per communicator (a second is an error).
    pub(crate) fn add_fault_hook(&self, hook: Arc<dyn AbortHook>) -> Result<()> {
        self.fault_hook
            .set(hook.clone())
            .map_err(|_| Error::invalid("hook", "a second fault hook on one communicator"))?;
        self.add_abort_hook(hook);
        Ok(())
    }

    /// With the lock held: waits until the library is done with the last calls on this
    /// communicator and its children (non-blocking mode). On an error or at the deadline
    /// the communicator is aborted (it cannot be used after either).
    pub(crate) fn settle_locked(&self, held: &mut Held<Owned>, what: &str) -> Result<()> {
        if !self.nonblocking {
            return Ok(());
        }
        let Held::Live(o) = &*held else {
            return Ok(());
        };
        let stop = || self.abort_requested.load(Ordering::Relaxed);
        let r = o
            .handles()
            .try_for_each(|c| settle_raw(&self.api, c, what, self.timeout(), &stop));
        if let Err(e) = &r {
            if !matches!(e, Error::Aborted { .. }) {
                let _ = self.destroy_locked(held, End::Abort);
            }
        }
        r
    }

    /// The first asynchronous error of this communicator and its children
    /// (`ncclCommGetAsyncError`); `ncclInProgress` is not an error.
    pub(crate) fn async_error(&self) -> Result<()> {
        let g = self.locked()?;
        self.async_error_locked(&g)
    }

    fn async_error_locked(&self, held: &Held<Owned>) -> Result<()> {
        let o = match held {
            Held::Live(o) => o,
            Held::Aborted => return Err(self.aborted_error()),
            _ => return Ok(()),
        };
        for c in o.handles() {
            // Still working is not an error; without the call there are none to read.
            if self.api.comm_get_async_error(c)?.is_none() {
                return Ok(());
            }
        }
        Ok(())
    }

    /// The raw `ncclComm_t` while the communicator is not ended (NULL after), for calling the
    /// library directly; NULL too where the lock stays held past twice the deadline.
    pub(crate) fn raw(&self) -> NcclComm {
        self.locked().ok().map_or(std::ptr::null_mut(), |g| {
            g.not_ended()
                .map_or(std::ptr::null_mut(), |o| o.comm.handle().as_raw())
        })
    }

    fn release_hooks(&self, within: Duration, report: bool) -> bool {
        let hooks = self.hooks.lock().unwrap_or_else(|e| e.into_inner()).clone();
        // Every hook is asked, also after one that could not release.
        let mut all = true;
        for h in &hooks {
            all &= h.release(within, report);
        }
        all
    }

    /// Ends the communicator and its children, with the lock held. An abort, or a finalize
    /// that failed (a peer gone), also runs the abort hooks.
    ///
    /// During an abort the hooks run before the library's teardown and beside it: NCCL
    /// 2.28's `ncclCommAbort` synchronizes with the device before it returns (its streams,
    /// its frees), which a stream wait of this rank blocks until it is released, and while
    /// it waits for the device, other threads' calls into the driver can wait for it too.
    /// Released after the abort, the two waited for each other for good (seen with one rank
    /// per process: the abort never returned). So first what needs only its release goes
    /// (at most `FIRST_RELEASE`: everything, where no library kernel holds a stream ahead
    /// of it); what is left waits behind kernels that only the abort ends, and is released
    /// on a thread of its own during it.
    pub(crate) fn destroy_locked(&self, held: &mut Held<Owned>, end: End) -> Result<()> {
        let end = match end == End::Finalize && !self.woken_for_finalize(held) {
            true => End::Abort,
            false => end,
        };
        let next = if end == End::Finalize {
            Life::Finalized
        } else {
            Life::Aborted
        };
        // A suspended communicator is ended as a live one (NCCL's finalize and abort take it).
        let Some(owned) = held.end(next) else {
            return Ok(());
        };
        self.mirror(held);
        let full = self.timeout();
        if end == End::Finalize {
            let r = self.teardown(owned, End::Finalize);
            if r.is_err() {
                self.release_hooks(full, true);
            }
            return r;
        }
        if self.release_hooks(FIRST_RELEASE.min(full), false) {
            return self.teardown(owned, End::Abort);
        }
        std::thread::scope(|s| {
            let beside = std::thread::Builder::new()
                .name("unicomm-release".into())
                .spawn_scoped(s, || self.release_hooks(full, true));
            let r = self.teardown(owned, End::Abort);
            match beside {
                // The release ends by its own deadline; it never panics (it reports).
                Ok(h) => {
                    let _ = h.join();
                }
                // No thread to be had: released after the teardown, as a last resort.
                Err(_) => {
                    self.release_hooks(full, true);
                }
            }
            r
        })
    }

    /// `finalize` or `abort` from any thread.
    pub(crate) fn destroy(&self, end: End) -> Result<()> {
        let mut g = self.locked_for_teardown(end)?;
        if end == End::Abort && g.life() == Life::Live {
            tracing::info!(
                rank = self.rank,
                world = self.world,
                "aborting the communicator"
            );
        }
        self.destroy_locked(&mut g, end)
    }

    /// The lock for a teardown ([`LibComm::locked`]'s deadline); an abort first asks a call
    /// settling under it to give up, so it never waits for that call's deadline.
    pub(crate) fn locked_for_teardown(&self, end: End) -> Result<Guard<'_>> {
        if end == End::Abort {
            self.abort_requested.store(true, Ordering::Relaxed);
        }
        self.locked()
    }

    /// Waits at most `bound` for a teardown given up at its deadline to return (NCCL's abort
    /// does once every CUDA graph that captured this communicator's work is destroyed);
    /// whether none is left running.
    pub(crate) fn wait_late_end(&self, bound: Duration) -> bool {
        let late = self
            .late_end
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        late.is_none_or(|l| l.wait(bound))
    }

    /// Whether it was finalized or aborted.
    pub(crate) fn ended(&self) -> bool {
        self.life.load().ended()
    }
}

impl<R: Runtime> Watched for LibComm<R> {
    fn timeout(&self) -> Duration {
        LibComm::timeout(self)
    }
    fn poll(&self) -> Result<()> {
        match self.held.try_lock() {
            Some(g) => self.async_error_locked(&g),
            None => Ok(()),
        }
    }
    fn abort(&self) -> Result<()> {
        self.destroy(End::Abort)
    }
    fn settle(&self, what: &str) -> Result<()> {
        let mut g = self.locked()?;
        self.settle_locked(&mut g, what)
    }
    fn aborted(&self) -> bool {
        self.life.load() == Life::Aborted
    }
    fn fault(&self) -> Option<Error> {
        self.fault_hook.get()?.fault()
    }
    fn refusal(&self) -> Option<Error> {
        self.fault_hook.get()?.refusal()
    }
}
