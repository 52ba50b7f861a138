//! One-sided operations on the mock (NCCL 2.29.2's `ncclPutSignal`, `ncclSignal`,
//! `ncclWaitSignal`), with NCCL's rules: the release the mock stands for, a put's source
//! inside a symmetric window, its destination a window of the communicator. A put's bytes
//! travel in its message and land in the peer's window when the peer's wait takes them:
//! never later than NCCL would show them, so a program that reads only after its wait (as
//! NCCL requires) sees the same bytes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use unicomm_core::one_sided::OneSided;
use unicomm_core::{Error, RawHandle, Result};

use crate::comm::MockComm;
use crate::exec::{Span, Work};
use crate::memory::MockMemory;
use crate::stream::MockStream;

/// The windows of one communicator by the ordinal every rank gives them (windows are
/// registered by every rank in one order, so the n-th is the same window everywhere).
#[derive(Default)]
pub(crate) struct Windows {
    inner: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next: u64,
    ordinals: HashMap<RawHandle, u64>,
    parts: HashMap<u64, (Span, usize)>,
}

impl Windows {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A window registered (collectively): the next ordinal, this rank's part of it.
    pub(crate) fn add(&self, handle: RawHandle, part: Span, bytes: usize) {
        let mut t = self.table();
        let ord = t.next;
        t.next += 1;
        t.ordinals.insert(handle, ord);
        t.parts.insert(ord, (part, bytes));
    }

    /// A window deregistered: puts into it land nowhere from now on (an error).
    pub(crate) fn remove(&self, handle: RawHandle) {
        let mut t = self.table();
        if let Some(ord) = t.ordinals.remove(&handle) {
            t.parts.remove(&ord);
        }
    }

    fn ordinal(&self, handle: RawHandle) -> Option<u64> {
        self.table().ordinals.get(&handle).copied()
    }

    /// This rank's part of window `ord` and its size in bytes.
    pub(crate) fn part(&self, ord: u64) -> Option<(Span, usize)> {
        self.table().parts.get(&ord).cloned()
    }
}

impl MockComm {
    /// One one-sided operation, checked as NCCL checks it, as one task of `stream`.
    pub(crate) fn one_sided_op(
        &self,
        op: OneSided<'_, MockMemory>,
        stream: &MockStream,
    ) -> Result<()> {
        self.live()?;
        self.check_stream(stream)?;
        self.ctx.target.one_sided()?;
        op.check(self.ctx.world)?;
        let work = match op {
            OneSided::Signal(peer) => Work::Signal { put: None, peer },
            OneSided::Wait(waits) => Work::Wait {
                waits: waits.to_vec(),
                windows: self.windows.clone(),
            },
            OneSided::Put(p) => {
                self.check_memory_of(p.src.mem)?;
                p.src.holds(p.count, p.dtype, "src")?;
                let bytes = p.count * p.dtype.size();
                // NCCL's rule: the source lies in a symmetric window of the communicator.
                if !self
                    .registry
                    .covering(p.src.address(), bytes)?
                    .is_some_and(|k| k.is_window())
                {
                    return Err(Error::invalid(
                        "src",
                        "a put's source must lie inside a symmetric window of the communicator (NCCL's rule)",
                    ));
                }
                let ord = self
                    .windows
                    .ordinal(p.window)
                    .ok_or_else(|| Error::invalid("dst", "not a window of this communicator"))?;
                let span = Span {
                    alloc: p.src.mem.inner.clone(),
                    offset: p.src.offset,
                    write: false,
                };
                Work::Signal {
                    put: Some((span, bytes, (ord, p.offset))),
                    peer: p.peer,
                }
            }
        };
        self.enqueue_work(work, false, stream)
    }
}

/// The windows of a new communicator.
pub(crate) fn windows() -> Arc<Windows> {
    Arc::new(Windows::default())
}
