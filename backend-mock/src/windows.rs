//! The windows of a mock communicator by the ordinal every rank gives them: where one-sided
//! puts land.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use unicomm_core::RawHandle;

use crate::memory::HostAlloc;

/// This rank's part of a window: its allocation and the offset of the window in it.
#[derive(Clone)]
pub(crate) struct Part {
    pub alloc: Arc<HostAlloc>,
    pub offset: usize,
}

impl Part {
    pub(crate) fn addr(&self) -> usize {
        self.alloc.addr() + self.offset
    }
}

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
    parts: HashMap<u64, (Part, usize)>,
}

impl Windows {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A window registered (collectively): the next ordinal, this rank's part of it.
    pub(crate) fn add(&self, handle: RawHandle, part: Part, bytes: usize) {
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

    pub(crate) fn ordinal(&self, handle: RawHandle) -> Option<u64> {
        self.table().ordinals.get(&handle).copied()
    }

    /// This rank's part of window `ord` and its size in bytes.
    pub(crate) fn part(&self, ord: u64) -> Option<(Part, usize)> {
        self.table().parts.get(&ord).cloned()
    }
}

/// The windows of a new communicator.
pub(crate) fn windows() -> Arc<Windows> {
    Arc::new(Windows::default())
}
