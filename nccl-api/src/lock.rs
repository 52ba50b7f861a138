//! The communicator's lock: its library calls one at a time (NCCL's rule for a communicator
//! shared between threads) and never after its teardown.
//!
//! Every collective takes and releases it around the library call, and on a GPU host the
//! library's enqueue (5-10 us in the driver) leaves its cache line cold. `std::sync::Mutex`
//! releases with a locked exchange (it must learn whether to wake a sleeper), which stalls
//! until that line arrives; a release here is a plain store, which retires into the store
//! buffer without waiting (round 12's profile on 1x H200: the exchange and the read that
//! missed before it were a third of the call's own time). The price is paid only under
//! contention, which NCCL's rule makes rare (a second thread, an abort, a watchdog's poll,
//! which only tries): a waiter spins briefly, then yields, then sleeps in growing steps of
//! at most 200 us instead of being woken, and gives up with `Timeout` at its deadline (the
//! `Mutex` would have waited for ever behind a stuck holder). A guard dropped while
//! unwinding releases the lock, as the `Mutex` with its poison ignored did.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use unicomm_core::{Error, Result};

/// Mutual exclusion with a plain-store release (see the module's comment).
#[derive(Debug, Default)]
pub(crate) struct CommLock {
    held: AtomicBool,
}

/// Holds a [`CommLock`] until dropped.
#[derive(Debug)]
pub(crate) struct CommGuard<'a>(&'a CommLock);

impl CommLock {
    pub(crate) const fn new() -> CommLock {
        CommLock {
            held: AtomicBool::new(false),
        }
    }

    /// The lock if it is free now.
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<CommGuard<'_>> {
        self.held
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| CommGuard(self))
    }

    /// Waits for the lock, at most `within()` (asked only when the lock is taken):
    /// `Timeout` after it.
    #[inline]
    pub(crate) fn lock(&self, within: impl FnOnce() -> Duration) -> Result<CommGuard<'_>> {
        match self.try_lock() {
            Some(g) => Ok(g),
            None => self.lock_contended(within()),
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self, within: Duration) -> Result<CommGuard<'_>> {
        let start = Instant::now();
        let mut tries = 0u32;
        let mut nap = Duration::from_micros(5);
        loop {
            // Read first: a failed compare-and-swap takes the line from the holder.
            if !self.held.load(Ordering::Relaxed) {
                if let Some(g) = self.try_lock() {
                    return Ok(g);
                }
            }
            // Saturating: a deadline of days polls more often than a u32 counts.
            tries = tries.saturating_add(1);
            if tries < 64 {
                std::hint::spin_loop();
            } else if tries < 128 {
                std::thread::yield_now();
            } else if start.elapsed() >= within {
                return Err(Error::Timeout {
                    what: "the communicator's lock, held by another call".into(),
                    after: within,
                });
            } else {
                std::thread::sleep(nap.min(within.saturating_sub(start.elapsed())));
                nap = (nap * 2).min(Duration::from_micros(200));
            }
        }
    }
}

impl Drop for CommGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.held.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    const LONG: Duration = Duration::from_secs(60);

    /// Four threads each add 1 a hundred thousand times by a load and a store that are not
    /// one atomic step: without mutual exclusion increments are lost and the sum falls
    /// short.
    #[test]
    fn excludes_other_threads() {
        let (lock, n) = (CommLock::new(), AtomicUsize::new(0));
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..100_000 {
                        let _g = lock.lock(|| LONG).unwrap();
                        let v = n.load(Ordering::Relaxed);
                        std::hint::black_box(v);
                        n.store(v + 1, Ordering::Relaxed);
                    }
                });
            }
        });
        assert_eq!(n.load(Ordering::Relaxed), 400_000);
    }

    #[test]
    fn try_lock_fails_while_held_and_a_waiter_gets_it_after() {
        let lock = CommLock::new();
        let g = lock.lock(|| LONG).unwrap();
        assert!(lock.try_lock().is_none());
        let got = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let _g = lock.lock(|| LONG).unwrap();
                got.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(Duration::from_millis(50));
            assert!(!got.load(Ordering::SeqCst), "the waiter got a held lock");
            drop(g);
        });
        assert!(got.load(Ordering::SeqCst));
        assert!(lock.try_lock().is_some());
    }

    #[test]
    fn a_panic_while_held_releases_it() {
        let lock = CommLock::new();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _g = lock.lock(|| LONG).unwrap();
            panic!("while held");
        }));
        assert!(r.is_err());
        assert!(lock.try_lock().is_some());
    }

    #[test]
    fn a_wait_past_its_deadline_is_a_timeout() {
        let lock = CommLock::new();
        let _g = lock.lock(|| LONG).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                let t = Instant::now();
                let e = lock.lock(|| Duration::from_millis(30)).unwrap_err();
                assert!(matches!(e, Error::Timeout { .. }), "{e}");
                let waited = t.elapsed();
                assert!(waited >= Duration::from_millis(30), "{waited:?}");
                assert!(waited < Duration::from_secs(5), "{waited:?}");
            });
        });
    }
}
