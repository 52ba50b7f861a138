//! What a stream's host waits watch: the communicators that enqueued work on it, polled
//! for asynchronous errors while the stream is busy and aborted when the wait passes its
//! deadline (what PyTorch's `TORCH_NCCL_ASYNC_ERROR_HANDLING` watchdog does, in the waits
//! themselves).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use unicomm_core::{Error, Result};

use crate::wait::Backoff;

/// A communicator as its streams see it: polled for asynchronous errors while they wait,
/// aborted when a wait passes its deadline, settled at the end of a group.
pub(crate) trait Watched: Send + Sync {
    /// The deadline of waits on its work.
    fn timeout(&self) -> Duration;
    /// Its first asynchronous error, if any; `Ok` while it is busy on another thread.
    fn poll(&self) -> Result<()>;
    /// Aborts it (a wait on its work failed or timed out); `Err` (`Timeout`) when the
    /// library's abort did not finish within the deadline and was given up.
    fn abort(&self) -> Result<()>;
    /// Waits until the library is done with its last calls (non-blocking mode).
    fn settle(&self, what: &str) -> Result<()>;
    /// Whether it was aborted (its work on the stream may have been cut short).
    fn aborted(&self) -> bool;
    /// A failure its own kernels reported on the device (unicomm's symmetric kernels give
    /// up at their deadline, or find a count that differs): asked when the stream is idle
    /// too, since such a kernel ends and leaves the stream idle. Default: none.
    fn fault(&self) -> Option<Error> {
        None
    }
    /// A call its own kernels refused on every rank alike, taken once (asked when the
    /// stream is idle: the refused call's kernel has ended). Default: none.
    fn refusal(&self) -> Option<Error> {
        None
    }
}

/// The communicators that enqueued work on one stream (weakly: a stream may outlive them),
/// each with whether this stream's waits already reported its abort; and which one was
/// added last, so that a communicator enqueuing again and again on its stream (every call
/// of a training step) takes no lock here.
#[derive(Default)]
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

    /// Aborts every one of `ws` and marks their aborts reported by this stream's waits;
    /// returns the first abort the library did not finish within the deadline (`Timeout`).
    fn abort_all(&self, ws: &[(Arc<dyn Watched>, bool)]) -> Option<Error> {
        let ends: Vec<Result<()>> = ws.iter().map(|(w, _)| w.abort()).collect();
        self.reported(ws);
        ends.into_iter().find_map(|r| match r {
            Err(a @ Error::Timeout { .. }) => Some(a),
            _ => None,
        })
    }

    /// One look at the stream's work without waiting: `Ok(true)` when the stream is idle
    /// and no communicator with work on it was aborted while it ran (an abort ends the
    /// kernels, so an idle stream after one did not complete its work: `Aborted`);
    /// `Ok(false)` while it runs. With `poll`, a communicator's asynchronous error aborts
    /// them all and is the error, with the abort's own failure beside it.
    fn step(
        &self,
        what: &str,
        ws: &[(Arc<dyn Watched>, bool)],
        idle: bool,
        poll: bool,
    ) -> std::result::Result<bool, Box<(Error, Option<Error>)>> {
        if let Some(e) = ws
            .iter()
            .find_map(|(w, told)| (!told).then(|| w.fault()).flatten())
        {
            return Err(Box::new((e, self.abort_all(ws))));
        }
        if idle {
            // Not the communicator's failure: reported, nothing aborted.
            if let Some(e) = ws.iter().find_map(|(w, _)| w.refusal()) {
                return Err(Box::new((e, None)));
            }
            let aborted: Vec<&(Arc<dyn Watched>, bool)> =
                ws.iter().filter(|(w, _)| w.aborted()).collect();
            if aborted.is_empty() {
                return Ok(true);
            }
            {
                let mut v = self.list();
                v.retain(|(x, _)| !aborted.iter().any(|(w, _)| same(x, w)));
                self.last.store(0, Ordering::Release);
            }
            if aborted.iter().all(|(_, told)| *told) {
                return Ok(true);
            }
            // Not `poll`: the aborting thread may still hold the lock.
            return Err(Box::new((
                Error::aborted(format!(
                    "{what}: a communicator with work on it was aborted while it ran"
                )),
                None,
            )));
        }
        if poll {
            for (w, _) in ws {
                if let Err(e) = w.poll() {
                    return Err(Box::new((e, self.abort_all(ws))));
                }
            }
        }
        Ok(false)
    }

    /// [`Watchers::wait`]'s one look, without waiting (`cuStreamQuery` with the
    /// communicators' asynchronous errors): whether the stream's work is done, or the
    /// failure that ended it.
    pub(crate) fn query(&self, what: &str, idle: bool) -> Result<bool> {
        let ws = self.live();
        self.step(what, &ws, idle, true).map_err(|b| match *b {
            (e, None) => e,
            (e, Some(a)) => Error::aborted(format!(
                "{what}: {e}; then aborting the communicator(s) did not finish: {a}"
            )),
        })
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
            n = n.wrapping_add(1);
            // An asynchronous error ends the wait at once (polled every 64 rounds: the
            // stream query is the cheap, common exit).
            match self
                .step(what, &ws, idle()?, n.is_multiple_of(64))
                .map_err(|b| *b)
            {
                Ok(false) => {}
                Ok(true) => return Ok(()),
                Err((e, None)) => return Err(e),
                // The stream may still hold the communicators' work: what a deadline that
                // passed means, with the error that began it.
                Err((e, Some(a))) => {
                    return Err(Error::Timeout {
                        what: format!(
                            "{what}: {e}; then aborting the communicator(s) did not finish: {a}"
                        ),
                        after: start.elapsed(),
                    })
                }
            }
            if start.elapsed() >= timeout {
                let e = Error::Timeout {
                    what: format!(
                        "{what}; the communicator(s) that enqueued work on it were aborted"
                    ),
                    after: start.elapsed(),
                };
                // A Timeout either way. ncclCommAbort ends the communicators' kernels; what
                // else the stream holds is the caller's (documented in docs/reliability.md).
                let _ = self.abort_all(&ws);
                return Err(e);
            }
            backoff.pause();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// A communicator as a stream's waits see it: aborted or not, and the fault its own
    /// kernels reported, if any.
    #[derive(Default)]
    struct Fake {
        aborted: AtomicBool,
        fault: Option<&'static str>,
        /// A refusal its kernels reported, taken by the first wait that asks.
        refusal: std::sync::Mutex<Option<&'static str>>,
    }

    /// A communicator with an asynchronous error whose abort never finishes (NCCL 2.28.9's
    /// `ncclCommAbort` with a peer SIGKILLed during a graph's replays), or finishes.
    struct Lost {
        abort_finishes: bool,
    }

    impl Watched for Lost {
        fn timeout(&self) -> Duration {
            Duration::from_secs(1)
        }
        fn poll(&self) -> Result<()> {
            Err(Error::aborted(
                "ncclRemoteError: the peer's connection closed",
            ))
        }
        fn abort(&self) -> Result<()> {
            match self.abort_finishes {
                true => Ok(()),
                false => Err(Error::Timeout {
                    what: "ncclCommAbort".into(),
                    after: Duration::from_secs(1),
                }),
            }
        }
        fn settle(&self, _: &str) -> Result<()> {
            Ok(())
        }
        fn aborted(&self) -> bool {
            true
        }
    }

    /// A wait that finds the asynchronous error reports it; if the abort that must follow
    /// is given up at the deadline, the stream may still hold the work, so the wait's error
    /// is `Timeout`, naming the asynchronous error.
    #[test]
    fn an_asynchronous_error_whose_abort_is_given_up_is_a_timeout_naming_it() {
        for abort_finishes in [true, false] {
            let w = Watchers::default();
            let c = Arc::new(Lost { abort_finishes });
            w.add(&c);
            let r = w.wait("test stream", Duration::from_secs(1), || Ok(false));
            match (abort_finishes, r) {
                (true, Err(Error::Aborted { reason, .. })) => {
                    assert!(reason.contains("ncclRemoteError"))
                }
                (false, Err(Error::Timeout { what, .. })) => {
                    assert!(
                        what.contains("ncclRemoteError") && what.contains("ncclCommAbort"),
                        "{what}"
                    )
                }
                (f, r) => panic!("abort finishing {f}: {r:?}"),
            }
        }
    }

    impl Watched for Fake {
        fn timeout(&self) -> Duration {
            Duration::from_secs(1)
        }
        fn poll(&self) -> Result<()> {
            Ok(())
        }
        fn abort(&self) -> Result<()> {
            self.aborted.store(true, Ordering::Release);
            Ok(())
        }
        fn settle(&self, _: &str) -> Result<()> {
            Ok(())
        }
        fn aborted(&self) -> bool {
            self.aborted.load(Ordering::Acquire)
        }
        fn fault(&self) -> Option<Error> {
            self.fault.map(|what| Error::Timeout {
                what: what.into(),
                after: Duration::from_secs(1),
            })
        }
        fn refusal(&self) -> Option<Error> {
            let taken = self.refusal.lock().unwrap().take();
            taken.map(|why| Error::invalid("max_tokens", why))
        }
    }

    /// A call every rank's kernel refused alike (a dispatch past its capacity) is the
    /// call's error, reported once by the idle stream's wait; the communicator goes on (the
    /// next call of the same group is exact), so nothing is aborted.
    #[test]
    fn a_kernels_refusal_is_reported_once_without_an_abort() {
        let w = Watchers::default();
        let c = Arc::new(Fake {
            refusal: std::sync::Mutex::new(Some("expert 3 would receive 9 tokens")),
            ..Fake::default()
        });
        w.add(&c);
        let r = w.wait("test stream", Duration::from_secs(1), || Ok(true));
        assert!(
            matches!(
                &r,
                Err(Error::InvalidArgument {
                    argument: "max_tokens",
                    ..
                })
            ),
            "{r:?}"
        );
        assert!(!c.aborted(), "a refusal aborted the communicator");
        let again = w.wait("test stream", Duration::from_secs(1), || Ok(true));
        assert!(again.is_ok(), "reported twice: {again:?}");
    }

    /// A kernel that gave up ends and leaves its stream idle: the idle stream's wait must
    /// still report its fault (not `Ok` over a result never computed), abort the
    /// communicator, and report it once.
    #[test]
    fn a_kernels_fault_is_reported_by_the_wait_of_an_idle_stream() {
        let w = Watchers::default();
        let c = Arc::new(Fake {
            fault: Some("a symmetric kernel: rank 1 never arrived"),
            ..Fake::default()
        });
        w.add(&c);
        let r = w.wait("test stream", Duration::from_secs(1), || Ok(true));
        assert!(
            matches!(&r, Err(Error::Timeout { what, .. }) if what.contains("rank 1 never arrived")),
            "{r:?}"
        );
        assert!(c.aborted(), "the communicator was not aborted");
        let again = w.wait("test stream", Duration::from_secs(1), || Ok(true));
        assert!(again.is_ok(), "reported twice: {again:?}");
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
        a.abort().unwrap();
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
