//! The lock every access to a mock allocation's bytes goes through: readers and writers with
//! deadlines, and a revocation after which no access is granted again (host memory lent by a
//! scope that has ended).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use unicomm_core::{Error, Result};

/// Who holds the lock, and whether it was revoked.
#[derive(Default)]
struct State {
    readers: usize,
    writer: bool,
    revoked: bool,
}

/// A readers-writer lock whose waits have a deadline (std's `RwLock` has none, and a stream
/// that uses one buffer twice in a group must not hang).
#[derive(Default)]
pub(crate) struct Lock {
    state: Mutex<State>,
    cv: Condvar,
}

/// Holds a [`Lock`]; releases on drop.
pub(crate) struct Guard<'a> {
    lock: &'a Lock,
    write: bool,
}

impl Lock {
    pub(crate) fn acquire(&self, write: bool, timeout: Duration, addr: usize) -> Result<Guard<'_>> {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if st.revoked {
                return Err(revoked(addr));
            }
            if !st.writer && (!write || st.readers == 0) {
                if write {
                    st.writer = true;
                } else {
                    st.readers += 1;
                }
                return Ok(Guard { lock: self, write });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    what: format!(
                        "buffer {addr:#x}, in use by other work of the same rank (the same \
                         buffer on two streams, or twice in one group)"
                    ),
                    after: timeout,
                });
            }
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Waits (at most `timeout`) until no access is in progress, then refuses every later
    /// one. Returning `Ok` orders every access made before it before the caller's next step
    /// (the same mutex).
    pub(crate) fn revoke(&self, timeout: Duration, addr: usize) -> Result<()> {
        match self.acquire(true, timeout, addr) {
            Ok(g) => {
                self.state.lock().unwrap_or_else(|e| e.into_inner()).revoked = true;
                drop(g);
                Ok(())
            }
            // Revoked already: nothing can reach the bytes.
            Err(Error::InvalidArgument { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cold]
fn revoked(addr: usize) -> Error {
    Error::invalid(
        "memory",
        format!(
            "host memory {addr:#x} was lent to a scope that has ended: work enqueued in the \
             scope ran after its end (the scope waits for that work up to the communicator's \
             deadline)"
        ),
    )
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let mut st = self.lock.state.lock().unwrap_or_else(|e| e.into_inner());
        if self.write {
            st.writer = false;
        } else {
            st.readers -= 1;
        }
        drop(st);
        self.lock.cv.notify_all();
    }
}

/// Waits until `alloc` (at `addr`) is held through this `Arc` and the `forgotten` views'
/// alone (no work or live view holds another), at most until `deadline`.
pub(crate) fn wait_unheld<T>(
    alloc: &Arc<T>,
    addr: usize,
    deadline: Instant,
    forgotten: usize,
    timeout: Duration,
) -> Result<()> {
    let mut pause = Duration::from_micros(10);
    while Arc::strong_count(alloc) > 1 + forgotten {
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Timeout {
                what: format!("the work holding host memory {addr:#x} lent to a scope"),
                after: timeout,
            });
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(1));
    }
    Ok(())
}
