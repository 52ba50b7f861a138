//! Calling the library on a [`LibComm`]: the lock, the live state and the device around one
//! call ([`LibComm::call`], [`LibComm::call_enqueue`], [`LibComm::call_lent`]), non-blocking
//! settling, and a blocking call bounded by the deadline on a helper thread
//! ([`Lent::bounded`]).

use std::sync::Arc;

use unicomm_core::state::{Held, Life};
use unicomm_core::{Error, Result};

use super::{Child, LibComm, Owned};
use crate::group;
use crate::sys::calls::{take_in_progress, CommRef, Handle, ShapedComm};
use crate::sys::runtime::Runtime;
use crate::wait::bounded;

/// The communicator lent to one call with its lock held: the communicator and its
/// children, the settling of a non-blocking call, and a blocking call bounded by the
/// deadline.
pub(crate) struct Lent<'g, R: Runtime> {
    lc: &'g LibComm<R>,
    held: &'g mut Held<Owned>,
}

impl<R: Runtime> Lent<'_, R> {
    /// The communicator, while live.
    #[inline]
    pub(crate) fn comm(&self) -> Result<CommRef<'_>> {
        Ok(self.lc.live(self.held)?.comm.lend())
    }

    /// A child adopted by [`LibComm::adopt_child`], while this communicator is live.
    pub(crate) fn child(&self, id: Child) -> Result<CommRef<'_>> {
        self.lc.live(self.held)?.child(id)
    }

    /// Waits until the library is done with the last calls (non-blocking mode; see
    /// [`LibComm::settle_locked`]).
    pub(crate) fn settle(&mut self, what: &str) -> Result<()> {
        self.lc.settle_locked(self.held, what)
    }

    /// A blocking library call on the communicator that waits for the peers on the host
    /// (collective window registration, split), run by [`bounded`] under the deadline. The
    /// communicator and its children go to the call's thread and come back with its result;
    /// past the deadline they stay there, given up (the state is aborted: nothing here calls
    /// or ends them again) and the result is `Timeout`; `late` receives the call's result if
    /// it ever returns.
    pub(crate) fn bounded<T: Send + 'static>(
        &mut self,
        what: &str,
        work: impl FnOnce(Handle<'_>) -> T + Send + 'static,
        late: impl FnOnce(T) + Send + 'static,
    ) -> Result<T> {
        let lc = self.lc;
        // Taken only while live; otherwise put back as it was, with its state's error.
        let owned = match std::mem::replace(self.held, Held::Aborted) {
            Held::Live(o) => o,
            other => {
                let e = lc.not_live(other.life());
                *self.held = other;
                return Err(e);
            }
        };
        let (rt, dev) = (lc.rt.clone(), lc.dev);
        let r = bounded(
            what,
            lc.timeout(),
            move || {
                let r = rt.with_device(dev, || Ok(work(owned.comm.handle())));
                (owned, r)
            },
            move |(owned, r)| {
                drop(owned); // given up: dropping leaks the library's communicators
                if let Ok(t) = r {
                    late(t)
                }
            },
        );
        match r {
            Ok((owned, r)) => {
                *self.held = Held::Live(owned);
                r
            }
            Err(e) => {
                lc.mirror(self.held);
                Err(e)
            }
        }
    }
}

impl Owned {
    /// A child adopted by [`LibComm::adopt_child`].
    #[inline]
    fn child(&self, id: Child) -> Result<CommRef<'_>> {
        self.children
            .get(id.0)
            .map(ShapedComm::lend)
            .ok_or_else(|| Error::invalid("comm", "no such child communicator"))
    }
}

impl<R: Runtime> LibComm<R> {
    /// Runs `f` on the communicator: not destroyed, not used by another thread, with this
    /// rank's device current. A non-blocking call that answered ncclInProgress is settled
    /// (inside a group, left to the group's end): one that answered ncclSuccess is enqueued
    /// (NCCL's non-blocking rule), so it is not polled.
    pub(crate) fn call<T>(self: &Arc<Self>, f: impl FnOnce(CommRef<'_>) -> Result<T>) -> Result<T> {
        self.call_with(true, |l| f(l.comm()?))
    }

    /// [`LibComm::call`] with the communicator lent as [`Lent`]: its children, settling
    /// inside the call, a bounded blocking call.
    pub(crate) fn call_lent<T>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Lent<'_, R>) -> Result<T>,
    ) -> Result<T> {
        self.call_with(true, f)
    }

    /// [`LibComm::call`] for a collective or point-to-point call, on this communicator or
    /// its `child`, without making the device current: NCCL and RCCL make the
    /// communicator's device current themselves for every operation they enqueue and launch
    /// (NCCL's documented single-thread, several-GPU example calls them for each device's
    /// communicator without `cudaSetDevice`), so the driver call that would check it
    /// (`cuCtxGetCurrent`) is left out of the hot path.
    #[inline]
    pub(crate) fn call_enqueue<T>(
        self: &Arc<Self>,
        child: Option<Child>,
        f: impl FnOnce(CommRef<'_>) -> Result<T>,
    ) -> Result<T> {
        // Every collective passes here: the communicator is lent straight from the guard
        // (one call site of `f`, so that it is inlined here).
        let mut g = self.locked()?;
        let c = match (&*g, child) {
            (Held::Live(o), None) => o.comm.lend(),
            (Held::Live(o), Some(id)) => o.child(id)?,
            (other, _) => return Err(self.not_live(other.life())),
        };
        let nonblocking = self.nonblocking;
        if nonblocking {
            take_in_progress(); // what an earlier call of this thread left is not this call's
        }
        let r = f(c);
        if nonblocking {
            self.after_nonblocking(&mut g)?;
        }
        r
    }

    #[inline]
    fn call_with<T>(
        self: &Arc<Self>,
        set_device: bool,
        f: impl FnOnce(&mut Lent<'_, R>) -> Result<T>,
    ) -> Result<T> {
        // The communicator is reached only through the lock that the teardown also takes,
        // and lent only while live (`Lent::comm`), so one aborted by another thread is never
        // used after it was freed.
        let mut g = self.locked()?;
        let nonblocking = self.nonblocking;
        if nonblocking {
            take_in_progress(); // what an earlier call of this thread left is not this call's
        }
        let mut lent = Lent {
            lc: self,
            held: &mut g,
        };
        // One call site of `f`, so that it is inlined here.
        let r = match set_device {
            true => self.rt.with_device(self.dev, || f(&mut lent)),
            false => f(&mut lent),
        };
        if nonblocking {
            self.after_nonblocking(&mut g)?;
        }
        r
    }

    /// After a non-blocking call, with the lock held: inside a group the group's end settles
    /// it; one that answered ncclInProgress is settled now.
    #[cold]
    #[inline(never)]
    fn after_nonblocking(self: &Arc<Self>, g: &mut Held<Owned>) -> Result<()> {
        if group::in_group() {
            group::join(self.clone()); // ncclGroupEnd settles every member
            return Ok(());
        }
        match take_in_progress() {
            true => self.settle_locked(g, "a non-blocking call"),
            false => Ok(()),
        }
    }

    /// [`LibComm::call`] on a communicator in state `from`, left in state `to` once `f`
    /// succeeded (suspend: live to suspended; resume: the reverse), the state read and
    /// changed under the lock every ending takes. In another state: the state's error.
    #[cold]
    pub(crate) fn call_in_state<T>(
        self: &Arc<Self>,
        from: Life,
        to: Life,
        f: impl FnOnce(CommRef<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut g = self.locked()?;
        let Some(o) = g.not_ended().filter(|_| g.life() == from) else {
            return Err(match self.live(&g) {
                Err(e) => e,
                Ok(_) => Error::invalid("comm", "the communicator is not suspended"),
            });
        };
        let c = o.comm.lend();
        if self.nonblocking {
            take_in_progress();
        }
        let t = self.rt.with_device(self.dev, || f(c))?;
        // Settled as a live communicator (a non-blocking suspend or resume may still run).
        g.rest(Life::Live);
        self.mirror(&g);
        let settled = match self.nonblocking && take_in_progress() {
            true => self.settle_locked(&mut g, "ncclCommSuspend/ncclCommResume"),
            false => Ok(()),
        };
        if settled.is_ok() {
            g.rest(to);
            self.mirror(&g);
        }
        settled.map(|_| t)
    }

    /// Before a suspended communicator is finalized (with the lock held): resumed, as
    /// `ncclCommFinalize` flushes work a suspended communicator cannot run. `false` where the
    /// resume failed (the caller aborts instead).
    pub(crate) fn woken_for_finalize(&self, held: &mut Held<Owned>) -> bool {
        let Held::Suspended(o) = &*held else {
            return true;
        };
        let ok = self.api.comm_resume(o.comm.handle()).is_ok();
        if ok {
            held.rest(Life::Live);
            self.mirror(held);
        }
        ok
    }
}
