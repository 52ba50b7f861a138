//! Calling the library on a [`LibComm`]: the lock, the live state and the device around one
//! call ([`LibComm::call`], [`LibComm::call_enqueue`]), non-blocking settling, and a
//! blocking call bounded by the deadline on a helper thread ([`LibComm::bounded_locked`]).

#![allow(
    unsafe_code,
    reason = "the owner of the communicator lends it for one call (the architecture test's UNSAFE_FILES lists it)"
)]

use std::sync::Arc;

use unicomm_core::Result;

use super::LibComm;
use crate::group;
use crate::sys::calls::{take_in_progress, CommRef, Handle};
use crate::sys::runtime::Runtime;
use crate::wait::bounded;
use unicomm_core::state::Life;

impl<R: Runtime> LibComm<R> {
    /// Runs `f` on the communicator: not destroyed, not used by another thread, with this
    /// rank's device current. A non-blocking call that answered ncclInProgress is settled
    /// (inside a group, left to the group's end): one that answered ncclSuccess is enqueued
    /// (NCCL's non-blocking rule), so it is not polled.
    pub(crate) fn call<T>(self: &Arc<Self>, f: impl FnOnce(CommRef<'_>) -> Result<T>) -> Result<T> {
        self.call_in(true, f)
    }

    /// [`LibComm::call`] for a collective or point-to-point call, without making the device
    /// current: NCCL and RCCL make the communicator's device current themselves for every
    /// operation they enqueue and launch (NCCL's documented single-thread, several-GPU
    /// example calls them for each device's communicator without `cudaSetDevice`), so the
    /// driver call that would check it (`cuCtxGetCurrent`) is left out of the hot path.
    #[inline]
    pub(crate) fn call_enqueue<T>(
        self: &Arc<Self>,
        f: impl FnOnce(CommRef<'_>) -> Result<T>,
    ) -> Result<T> {
        self.call_in(false, f)
    }

    #[inline]
    fn call_in<T>(
        self: &Arc<Self>,
        set_device: bool,
        f: impl FnOnce(CommRef<'_>) -> Result<T>,
    ) -> Result<T> {
        // The state is read under the lock that the teardown also takes, so a communicator
        // aborted by another thread is never used after it was freed.
        let _g = self.locked()?;
        self.live()?;
        // SAFETY: live (checked under the lock, which every ending takes) for as long as the
        // borrow, which ends with `f`; one thread (the lock); `world` and `rank` its shape.
        let c = unsafe { CommRef::borrow_raw(self.comm, self.world, self.rank) };
        let nonblocking = self.nonblocking;
        if nonblocking {
            take_in_progress(); // what an earlier call of this thread left is not this call's
        }
        // One call site of `f`, so that it is inlined here.
        let r = match set_device {
            true => self.rt.with_device(self.dev, || f(c)),
            false => f(c),
        };
        if !nonblocking {
            return r;
        }
        if group::in_group() {
            group::join(self.clone()); // ncclGroupEnd settles every member
        } else if take_in_progress() {
            self.settle_locked("a non-blocking call")?;
        }
        r
    }

    /// [`LibComm::call`] on a communicator in state `from`, left in state `to` once `f`
    /// succeeded (suspend: live to suspended; resume: the reverse), the state read and
    /// changed under the lock every ending takes. In another state: the state's error.
    #[cold]
    pub(crate) fn call_in_state<T>(
        self: &Arc<Self>,
        (from, to): (Life, Life),
        f: impl FnOnce(CommRef<'_>) -> Result<T>,
    ) -> Result<T> {
        let _g = self.locked()?;
        let now = self.state.load();
        if now != from {
            return Err(self.live().err().unwrap_or_else(|| {
                unicomm_core::Error::invalid("comm", "the communicator is not suspended")
            }));
        }
        // SAFETY: neither finalized nor aborted (checked under the lock, which every ending
        // takes) for as long as the borrow, which ends with `f`; one thread (the lock).
        let c = unsafe { CommRef::borrow_raw(self.comm, self.world, self.rank) };
        if self.nonblocking {
            take_in_progress();
        }
        let t = self.rt.with_device(self.dev, || f(c))?;
        // Settled as a live communicator (a non-blocking suspend or resume may still run).
        self.state.store(Life::Live);
        let settled = match self.nonblocking && take_in_progress() {
            true => self.settle_locked("ncclCommSuspend/ncclCommResume"),
            false => Ok(()),
        };
        if settled.is_ok() {
            self.state.store(to);
        }
        settled.map(|_| t)
    }

    /// Before a suspended communicator is finalized (with the lock held): resumed, as
    /// `ncclCommFinalize` flushes work a suspended communicator cannot run. `false` where the
    /// resume failed (the caller aborts instead).
    pub(crate) fn woken_for_finalize(&self) -> bool {
        if self.state.load() != Life::Suspended {
            return true;
        }
        // SAFETY: suspended, not ended (the caller holds the lock every ending takes).
        let h = unsafe { Handle::borrow_raw(self.comm) };
        let ok = self.api.comm_resume(h).is_ok();
        if ok {
            self.state.store(Life::Live);
        }
        ok
    }

    /// A blocking communicator's library call that waits for the peers on the host
    /// (collective window registration, split), with the lock held: run by [`bounded`]
    /// under the deadline on the communicator `c` the caller was lent by [`LibComm::call`].
    /// Past it the communicator is given up (aborted state: nothing here calls or ends it
    /// again, its thread keeps it) and the result is `Timeout`; `late` receives the call's
    /// result if it ever returns.
    pub(crate) fn bounded_locked<T: Send + 'static>(
        &self,
        what: &str,
        c: CommRef<'_>,
        work: impl FnOnce(Handle<'static>) -> T + Send + 'static,
        late: impl FnOnce(T) + Send + 'static,
    ) -> Result<T> {
        let (rt, dev) = (self.rt.clone(), self.dev);
        // SAFETY: the caller holds the lock for the whole wait, so nothing else uses or ends
        // the communicator while `work` may run; past the deadline the state is aborted
        // before the lock is released, and a given-up communicator is never ended, so it
        // outlives the thread that keeps it.
        let h = unsafe { Handle::borrow_raw(c.handle().as_raw()) };
        let h = SendHandle(h);
        let r = bounded(
            what,
            self.timeout(),
            move || {
                let h = h;
                rt.with_device(dev, || Ok(work(h.0)))
            },
            move |r| {
                if let Ok(t) = r {
                    late(t)
                }
            },
        );
        r.inspect_err(|_| self.state.store(Life::Aborted))?
    }
}

/// A borrowed communicator handed to the thread of a bounded call.
struct SendHandle(Handle<'static>);
// SAFETY: a communicator may move between threads; the lender keeps NCCL's one-thread rule
// (`LibComm::bounded_locked` holds the lock while the thread may use it).
unsafe impl Send for SendHandle {}
