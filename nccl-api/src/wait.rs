//! The waits every layer above shares: one back-off, the bounded call on a helper thread
//! (for blocking library calls that wait for the peers with no deadline of their own), and
//! the settling of a non-blocking call (`ncclInProgress` polled to its end).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use unicomm_core::{Error, Result};

use crate::sys::api::Api;
use crate::sys::calls::Handle;
use crate::sys::calls::Progress;

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
    comm: Handle<'_>,
    what: &str,
    timeout: Duration,
    stop: &dyn Fn() -> bool,
) -> Result<()> {
    let start = Instant::now();
    let mut backoff = Backoff::new();
    loop {
        let Some(state) = api.comm_get_async_error(comm)? else {
            return Ok(()); // without it, no call returns ncclInProgress (blocking library)
        };
        if state == Progress::Done {
            return Ok(());
        }
        if stop() {
            return Err(Error::aborted(format!(
                "{what}: aborted while the library was still working"
            )));
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
    let shared = Arc::new((Mutex::new(Slot::Waiting), Condvar::new()));
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
    let slot = m.lock().unwrap_or_else(|e| e.into_inner());
    let (mut slot, _) = cv
        .wait_timeout_while(slot, timeout, |s| matches!(s, Slot::Waiting))
        .unwrap_or_else(|e| e.into_inner());
    match std::mem::replace(&mut *slot, Slot::Abandoned) {
        Slot::Done(r) => Ok(r),
        _ => Err(Error::Timeout {
            what: format!(
                "{what} (a blocking call waiting for the peers; it was left to finish on its own thread)"
            ),
            after: start.elapsed(),
        }),
    }
}

/// Frees still running on their helper threads past their deadline (a device that does not
/// go idle): while there is one, later frees do not wait at all.
static LATE_FREES: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

/// Runs `free` (a device synchronization, then the free: what a drop of owned memory does)
/// on a helper thread and waits for it at most `bound`; past it the helper finishes on its
/// own and reports there. Where an earlier free is still stuck past its deadline (the
/// device's work never ends, say a kernel waiting on a lost peer whose abort was given up),
/// the drop does not wait at all, so a teardown dropping several allocations waits one
/// deadline, not one per allocation. Errors are logged (a drop reports nothing).
pub(crate) fn released(
    what: String,
    bound: Duration,
    free: impl FnOnce() -> Result<()> + Send + 'static,
) {
    use std::sync::atomic::Ordering;
    let bound = match LATE_FREES.load(Ordering::Acquire) > 0 {
        true => Duration::ZERO,
        false => bound,
    };
    let late_what = what.clone();
    let late = move |r: Result<()>| {
        LATE_FREES.fetch_sub(1, Ordering::AcqRel);
        if let Err(e) = r {
            tracing::warn!("{late_what}: {e}");
        }
    };
    match bounded(&what, bound, free, late) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("{what}: {e}"),
        Err(_) => {
            LATE_FREES.fetch_add(1, Ordering::AcqRel);
            tracing::warn!("{what}: the device was not idle within {bound:?}; freed once it is");
        }
    }
}

/// A call [`bounded`] gave up at its deadline, still running on its thread: whether it has
/// returned since. NCCL's abort is one (it returns only once every CUDA graph that captured
/// the communicator's work is destroyed): a process that exits while it runs exits under
/// the library's teardown.
#[derive(Default)]
pub(crate) struct Late {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Late {
    /// The call returned.
    pub(crate) fn finish(&self) {
        *self.done.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }

    /// Waits at most `bound` for the call to return; whether it did.
    pub(crate) fn wait(&self, bound: Duration) -> bool {
        let done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        let (done, _) = self
            .cv
            .wait_timeout_while(done, bound, |d| !*d)
            .unwrap_or_else(|e| e.into_inner());
        *done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_that_returns_in_time_gives_its_result() {
        let r = bounded("quick", Duration::from_secs(5), || 7, |_| {});
        assert_eq!(r.ok(), Some(7));
    }

    /// Past the deadline the caller gets `Timeout` and the late result goes to `late`
    /// (what frees a communicator created after the caller gave up).
    #[test]
    fn a_call_past_its_deadline_is_a_timeout_and_its_late_result_is_handed_on() {
        let (tx, rx) = std::sync::mpsc::channel();
        let r = bounded(
            "slow",
            Duration::from_millis(20),
            || {
                std::thread::sleep(Duration::from_millis(200));
                9
            },
            move |v| {
                let _ = tx.send(v);
            },
        );
        assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).ok(), Some(9));
    }
}
