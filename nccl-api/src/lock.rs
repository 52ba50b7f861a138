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
//! at most 200 us instead of being woken. A guard dropped while unwinding releases the lock,
//! as the `Mutex` with its poison ignored did.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

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

    /// Waits for the lock. Holders are bounded by the communicator's deadlines (a library
    /// call that waits for peers runs under `Core::bounded_locked`).
    #[inline]
    pub(crate) fn lock(&self) -> CommGuard<'_> {
        match self.try_lock() {
            Some(g) => g,
            None => self.lock_contended(),
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) -> CommGuard<'_> {
        let mut tries = 0u32;
        let mut nap = Duration::from_micros(5);
        loop {
            // Read first: a failed compare-and-swap takes the line from the holder.
            if !self.held.load(Ordering::Relaxed) {
                if let Some(g) = self.try_lock() {
                    return g;
                }
            }
            tries += 1;
            if tries < 64 {
                std::hint::spin_loop();
            } else if tries < 128 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(nap);
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
                        let _g = lock.lock();
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
        let g = lock.lock();
        assert!(lock.try_lock().is_none());
        let got = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let _g = lock.lock();
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
            let _g = lock.lock();
            panic!("while held");
        }));
        assert!(r.is_err());
        assert!(lock.try_lock().is_some());
    }
}
