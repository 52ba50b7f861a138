//! Completion handles: [`Completion::start`] enqueues a step of collectives and returns a
//! handle that orders another stream after them ([`Completion::marker`] for
//! [`DeviceStream::wait`]), answers "done?" without blocking, waits with the communicators'
//! deadline, and is a [`Future`] woken without blocking an executor's thread: a host
//! function enqueued after the work fires the waker (`cuLaunchHostFunc`,
//! `hipLaunchHostFunc`, the mock's stream), and one watcher thread per process wakes a
//! handle at its deadline (PyTorch's `Work`: `wait`, `is_completed`, `get_future`).
//!
//! A failure of the work (a peer's abort, a `Mismatch`, the communicator aborted from
//! another thread) ends `wait` and the future with its own error as soon as the stream
//! reports it ([`DeviceStream::query`]: looked at every 1 ms, doubling to 50 ms, while the
//! work runs), once the stream has reached the handle's point, never as `Timeout` at the
//! deadline.
//!
//! The handle borrows every communicator and buffer the step used. Dropping it before the
//! work is done (a cancelled future) returns at once where the work uses only memory
//! unicomm allocated, whose free waits for the device's work (so neither a drop nor a
//! `mem::forget` of the handle lets a buffer be freed under the device); where the work
//! uses memory lent by another owner (a cudarc slice), the drop waits for the work, at most
//! until the deadline, and past it aborts the communicators, as every other wait does.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::backend::Collective;
use crate::capturing::Phase;
use crate::comm::Comm;
use crate::device::DeviceStream;
use crate::marker::Marker;
use crate::step::Step;
use crate::{Error, Result};

/// Whether the work is done, and who to wake when it is.
#[derive(Default)]
struct Slot {
    state: Mutex<(bool, Option<Waker>)>,
    cv: Condvar,
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, (bool, Option<Waker>)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The work is done: wakes the waiter and the future.
    fn fire(&self) {
        let waker = {
            let mut st = self.lock();
            st.0 = true;
            st.1.take()
        };
        self.cv.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Wakes the future without marking the work done (its deadline passed).
    fn nudge(&self) {
        if let Some(w) = self.lock().1.take() {
            w.wake();
        }
    }
}

/// The process's one watcher thread: wakes each pending future at its deadline.
struct Watcher {
    due: Mutex<Vec<(Instant, Weak<Slot>)>>,
    cv: Condvar,
}

fn watcher() -> &'static Watcher {
    static W: OnceLock<&'static Watcher> = OnceLock::new();
    W.get_or_init(|| {
        let w: &'static Watcher = Box::leak(Box::new(Watcher {
            due: Mutex::new(Vec::new()),
            cv: Condvar::new(),
        }));
        // Without the thread, a future whose work hangs is woken by nothing: its deadline
        // then ends it at its next poll only. The spawn failing is that case, reported.
        if let Err(e) = std::thread::Builder::new()
            .name("unicomm-deadlines".into())
            .spawn(move || w.run())
        {
            tracing::warn!(
                "no deadline watcher thread ({e}): futures are woken by their work only"
            );
        }
        w
    })
}

impl Watcher {
    fn add(&self, at: Instant, slot: &Arc<Slot>) {
        self.due
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((at, Arc::downgrade(slot)));
        self.cv.notify_all();
    }

    fn run(&self) {
        let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let now = Instant::now();
            due.retain(|(at, s)| match s.upgrade() {
                Some(s) if *at <= now => {
                    s.nudge();
                    false
                }
                Some(_) => true,
                None => false,
            });
            let next = due.iter().map(|(at, _)| *at).min();
            let wait = next.map_or(Duration::from_secs(3600), |at| at - now);
            due = self
                .cv
                .wait_timeout(due, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// The work of one step on a stream, in flight; see the [module](self) doc.
pub struct Completion<'a, C: Collective> {
    slot: Arc<Slot>,
    marker: Marker,
    stream: &'a C::Stream,
    comms: Vec<&'a Comm<C>>,
    timeout: Duration,
    deadline: Instant,
    /// `wait` or the future reported the outcome: nothing left for the drop.
    settled: bool,
    /// The future's next look at the stream.
    look: Look,
    /// Every memory the work uses outlives it (owned allocations, whose free waits for the
    /// device): a pending handle's drop need not wait.
    outlived: bool,
    /// The failure the stream reported, until the work has let go of the device.
    failed: Mutex<Option<Error>>,
}

impl<'a, C: Collective> Completion<'a, C> {
    /// Enqueues what `f` enqueues through its [`Step`] on `stream` and returns its handle.
    /// Collectives keep NCCL's rules: every rank enqueues the same ones in the same order.
    /// If `f` fails after enqueuing some work, that work is waited for (within the
    /// deadline) before the error returns, so its buffers are never freed under it.
    pub fn start(
        stream: &'a C::Stream,
        f: impl FnOnce(&Step<'a, C>) -> Result<()>,
    ) -> Result<Self> {
        let step = Step::new(stream, Phase::Eager);
        if let Err(e) = f(&step) {
            let _ = stream.synchronize();
            return Err(e);
        }
        let outlived = step.outlived();
        let comms = step.into_comms();
        let timeout = match comms.iter().filter_map(|c| c.backend().timeout()).min() {
            Some(t) => t,
            None => crate::env::timeout()?,
        };
        let marker = stream.record()?;
        let slot = Arc::new(Slot::default());
        let fired = slot.clone();
        stream.launch_host_fn(Box::new(move || fired.fire()))?;
        Ok(Completion {
            slot,
            marker,
            stream,
            comms,
            timeout,
            deadline: Instant::now() + timeout,
            settled: false,
            look: Look::new(),
            outlived,
            failed: Mutex::new(None),
        })
    }

    /// The point after the work on its stream: `other.wait(handle.marker())` orders another
    /// stream's later work after it, without the host waiting.
    pub fn marker(&self) -> &Marker {
        &self.marker
    }

    /// Whether the work is done, without waiting.
    pub fn is_done(&self) -> bool {
        self.slot.lock().0
    }

    /// Blocks until the work is done, at most until the deadline (the communicators' own);
    /// past it the communicators are aborted and the result is `Timeout`.
    pub fn wait(mut self) -> Result<()> {
        self.settled = true;
        self.block()
    }

    fn block(&self) -> Result<()> {
        let mut look = Look::new();
        loop {
            if let Some(r) = self.outcome() {
                return r;
            }
            let now = Instant::now();
            if now >= self.deadline {
                return Err(self.expired());
            }
            let st = self.slot.lock();
            if !st.0 {
                drop(
                    self.slot
                        .cv
                        .wait_timeout(st, look.next().min(self.deadline - now))
                        .unwrap_or_else(|e| e.into_inner()),
                );
            }
        }
    }

    /// The work's outcome where it is known without waiting: done (`Ok`, unless a
    /// communicator failed or was aborted while it ran: its kernels then end without
    /// completing), or failed (a peer's abort, a `Mismatch`, this rank's own abort) and
    /// ended on the device, so its buffers are free again. `None` while it runs, and while
    /// work that failed still holds the device (the abort ends it; then the marker is
    /// reached).
    fn outcome(&self) -> Option<Result<()>> {
        let fired = self.slot.lock().0;
        let query = self.stream.query();
        // A failure is reported once by the stream (its next query finds the aborted
        // communicator already told): kept here until the work has let go of the device.
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = query {
            failed.get_or_insert(e);
        }
        match &*failed {
            Some(e) if fired || self.marker.inner().reached() != Some(false) => {
                Some(Err(e.clone()))
            }
            Some(_) => None,
            None if fired => Some(Ok(())),
            None => None,
        }
    }
    /// Past the deadline: the communicators aborted (their peers stop waiting too).
    fn expired(&self) -> Error {
        for c in &self.comms {
            let _ = c.abort();
        }
        Error::Timeout {
            what: "a completion handle's collectives".into(),
            after: self.timeout,
        }
    }
}

impl<C: Collective> Future for Completion<'_, C> {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if let Some(r) = self.outcome() {
            self.settled = true;
            return Poll::Ready(r);
        }
        let now = Instant::now();
        if now < self.deadline {
            {
                let mut st = self.slot.lock();
                if st.0 {
                    // Fired between the look and the lock: polled again at once.
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                st.1 = Some(cx.waker().clone());
            }
            // Woken by the work's host function, or by the watcher at the next look (a
            // failure does not fire the host function) or at the deadline.
            let at = (now + self.look.next()).min(self.deadline);
            watcher().add(at, &self.slot);
            return Poll::Pending;
        }
        self.settled = true;
        Poll::Ready(Err(self.expired()))
    }
}

/// How often a waiter looks at the stream for a failure while the work runs: at 1 ms,
/// then twice as long each time up to 50 ms (a failure reported within one look; a long
/// collective costs a few looks a second).
struct Look(Duration);

impl Look {
    fn new() -> Self {
        Look(Duration::from_micros(500))
    }
    fn next(&mut self) -> Duration {
        self.0 = (self.0 * 2).min(Duration::from_millis(50));
        self.0
    }
}

impl<C: Collective> Drop for Completion<'_, C> {
    /// A pending handle (a cancelled future, a handle never awaited) returns at once where
    /// every memory its work uses outlives that work (the allocations unicomm owns: their
    /// free waits for the device), so cancelling costs an executor nothing; the work goes on
    /// and its failure reaches the stream's next wait. Where the work uses memory lent by an
    /// owner that frees it on its own terms (a cudarc slice, a raw pointer), the drop waits
    /// for the work, within the deadline (past it the communicators are aborted; the error
    /// cannot be reported from a drop), so that memory is never freed under it.
    fn drop(&mut self) {
        if !self.settled && !self.outlived {
            let _ = self.block();
        }
    }
}
