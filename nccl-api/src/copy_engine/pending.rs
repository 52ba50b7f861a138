//! The copy-engine path's last operation per stream (an event each): what unmapping peers'
//! memory, freeing signal blocks and an abort's release wait for, since a copy or a signal
//! wait still queued may use them.

#![allow(
    unsafe_code,
    reason = "calls the NCCL-API library or the device runtime at its call sites (the architecture test's UNSAFE_FILES lists them)"
)]

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use unicomm_core::Result;

use crate::memory::ApiStream;
use crate::sys::runtime::Runtime;

/// Per stream (its raw handle), the event recorded after its last operation.
pub(crate) type List<R> = Vec<(usize, <R as Runtime>::Event)>;

/// Per stream (its raw handle), the event recorded after its last copy-engine operation.
pub(crate) struct Pending<R: Runtime> {
    rt: Arc<R>,
    dev: usize,
    rank: usize,
    /// With signals, held while an operation is enqueued. Lock order: the communicator's
    /// lock before this one, never the other way.
    events: Mutex<List<R>>,
}

impl<R: Runtime> Pending<R> {
    pub(crate) fn new(rt: Arc<R>, dev: usize, rank: usize) -> Self {
        Pending {
            rt,
            dev,
            rank,
            events: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, List<R>> {
        self.events.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The list if no enqueue holds it now (an abort's release must not wait for an
    /// enqueue held up by a full stream, which its writes drain).
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, List<R>>> {
        match self.events.try_lock() {
            Ok(p) => Some(p),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Records that `stream` (raw handle `key`) ran an operation: its event recorded again
    /// (no event created per operation).
    pub(crate) fn record(&self, list: &mut List<R>, key: usize, stream: &R::Stream) -> Result<()> {
        match list.iter().position(|(s, _)| *s == key) {
            Some(i) => {
                let mut e = list.remove(i);
                let again = self.rt.record_again(&mut e.1, stream);
                // On failure the event keeps its last recording: still waited for.
                list.push(e);
                again
            }
            None => {
                let ev = self.rt.with_device(self.dev, || self.rt.record(stream))?;
                list.push((key, ev));
                Ok(())
            }
        }
    }

    /// A stream that waits (on the device) for every operation recorded so far.
    pub(crate) fn waiter(&self, list: &[(usize, R::Event)]) -> Result<R::Stream> {
        let s = self.rt.create_stream(self.dev)?;
        for (_, e) in list {
            self.rt.wait_event(self.dev, &s, e)?;
        }
        Ok(s)
    }

    /// Waits until every operation enqueued so far has completed: at most `timeout`
    /// (`None`: a stream's default, `UNICOMM_TIMEOUT_MS`); `take` also empties the list.
    fn wait(&self, take: bool, timeout: Option<Duration>) -> Result<()> {
        let (s, _taken) = {
            let mut list = self.lock();
            if list.is_empty() {
                return Ok(());
            }
            let s = self.waiter(&list)?;
            // Taken events are kept until the wait below is over.
            let taken = if take {
                std::mem::take(&mut *list)
            } else {
                Vec::new()
            };
            (s, taken)
        };
        let mut st = ApiStream::from_runtime(self.rt.clone(), s, self.dev)?;
        if let Some(t) = timeout {
            st.timeout = t;
        }
        st.synchronize()
    }

    /// Whether every operation enqueued so far has completed, waited for at most `within`
    /// (at once where none is pending). The drop asks this before it finalizes: an
    /// operation held by a signal wait (a peer that never signals) would hold the library's
    /// teardown too, which waits for the device.
    pub(crate) fn done_within(&self, within: Duration) -> bool {
        self.wait(false, Some(within)).is_ok()
    }

    /// Runs `release` once every operation so far has completed (within the default
    /// deadline); otherwise says what is left (`what` things) and leaves them. Whether it
    /// ran.
    pub(crate) fn release_after(&self, what: usize, release: impl FnOnce()) -> bool {
        match self.wait(true, None) {
            Ok(()) => {
                release();
                true
            }
            Err(e) => {
                tracing::warn!(
                    "unicomm: rank {}: {what} mapping(s) or block(s) of the copy-engine path left in place: the copies that used them did not finish ({e})",
                    self.rank
                );
                false
            }
        }
    }

    /// Unmaps peers' memory once every operation that may have used it has completed;
    /// if that wait fails the mappings are left (leaked, never unmapped under a running
    /// copy). Whether the operations were seen complete.
    pub(crate) fn unmap_after(&self, maps: Vec<(usize, usize)>) -> bool {
        if maps.is_empty() {
            return true;
        }
        self.release_after(maps.len(), || self.unmap_now(maps))
    }

    /// Unmaps peers' memory at once: only inside [`Self::release_after`], once every copy
    /// that used it completed.
    pub(crate) fn unmap_now(&self, maps: Vec<(usize, usize)>) {
        for (va, size) in maps {
            // SAFETY: mappings of `import_memory`, taken out of their tables by the caller
            // (so unmapped once); every copy that used them completed (the caller waited).
            let _ = unsafe { self.rt.unmap_imported(self.dev, va, size) };
        }
    }
}
