//! Registration bookkeeping shared by the backends: which handles are live, over which
//! address ranges, so that a handle deregistered twice or taken from another communicator
//! is an error, never a call into the library with a dangling pointer.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use crate::{Error, Result};

/// An opaque registration handle a backend hands out (`ncclCommRegister`'s `void*`, a
/// window pointer, or the mock's id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawHandle(pub usize);

/// Ordinary registration or symmetric window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegKind {
    /// `ncclCommRegister`.
    Buffer,
    /// `ncclCommWindowRegister`.
    Window,
    /// Registered for every path the backend's automatic policy may pick (on NCCL/RCCL: a
    /// window, plus `ncclCommRegister` on a second communicator over the same ranks).
    Auto,
}

impl RegKind {
    /// Whether the memory is in a symmetric window (windows and automatic registrations).
    pub fn is_window(self) -> bool {
        matches!(self, RegKind::Window | RegKind::Auto)
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    address: usize,
    bytes: usize,
    kind: RegKind,
}

impl Entry {
    fn end(&self) -> usize {
        self.address.saturating_add(self.bytes)
    }

    /// Whether this registration holds all of `[address, end)`.
    fn covers(&self, address: usize, end: usize) -> bool {
        self.address <= address && end <= self.end()
    }
}

/// The live registrations, by handle and by start address: a call's buffers are looked up
/// on every collective that may take another path (automatic registration, copy engines),
/// so the lookup must not grow with the number of registrations (an engine registers
/// thousands of buffers).
#[derive(Debug, Default)]
struct Table {
    by_handle: HashMap<RawHandle, Entry>,
    /// The same entries keyed by (start address, handle), ordered: the ones that can
    /// contain an address are a range of it.
    by_start: BTreeMap<(usize, usize), Entry>,
    /// How many live entries have each size; `largest` is the largest of them, which bounds
    /// how far before an address an entry containing it can start.
    sizes: BTreeMap<usize, usize>,
    largest: usize,
    /// The answers of the last few `covering` queries, exactly as asked (start, end): an
    /// engine calls with the same buffers every step, so its lookups are answered without
    /// walking the index. Cleared by every insertion and removal, so an answer here is
    /// always the one the index would give now.
    recent: [Option<(usize, usize, Option<RegKind>)>; RECENT],
    next_recent: usize,
}

/// How many `covering` answers a table keeps (send and receive buffers of a couple of
/// alternating calls).
const RECENT: usize = 4;

impl Table {
    fn changed(&mut self) {
        self.recent = [None; RECENT];
    }

    fn recall(&self, address: usize, end: usize) -> Option<Option<RegKind>> {
        self.recent
            .iter()
            .flatten()
            .find(|(a, e, _)| *a == address && *e == end)
            .map(|r| r.2)
    }

    fn remember(&mut self, address: usize, end: usize, kind: Option<RegKind>) {
        self.recent[self.next_recent] = Some((address, end, kind));
        self.next_recent = (self.next_recent + 1) % RECENT;
    }

    fn add(&mut self, handle: RawHandle, e: Entry) {
        self.changed();
        self.by_handle.insert(handle, e);
        self.by_start.insert((e.address, handle.0), e);
        *self.sizes.entry(e.bytes).or_insert(0) += 1;
        self.largest = self.largest.max(e.bytes);
    }

    fn take(&mut self, handle: RawHandle) -> Option<Entry> {
        let e = self.by_handle.remove(&handle)?;
        self.changed();
        self.by_start.remove(&(e.address, handle.0));
        if let Some(n) = self.sizes.get_mut(&e.bytes) {
            *n -= 1;
            if *n == 0 {
                self.sizes.remove(&e.bytes);
                self.largest = self.sizes.keys().next_back().copied().unwrap_or(0);
            }
        }
        Some(e)
    }

    /// The registration that covers all of `[address, end)` (the nearest-starting one), or
    /// an error when none does and one overlaps it in part; remembered for the next ask.
    fn covering(&mut self, address: usize, end: usize) -> Result<Option<RegKind>> {
        if let Some(known) = self.recall(address, end) {
            return Ok(known);
        }
        let mut partial = None;
        let mut found = None;
        for (_, e) in self.candidates(address, end) {
            if e.covers(address, end) {
                found = Some(e.kind);
                break;
            }
            if e.address < end && address < e.end() {
                partial = partial.or(Some(e));
            }
        }
        if let (None, Some(e)) = (found, partial) {
            return Err(Error::invalid(
                "buffer",
                format!(
                    "bytes {address:#x}..{end:#x} are only partly covered by the registration \
                     {:#x}..{:#x}",
                    e.address,
                    e.end()
                ),
            ));
        }
        self.remember(address, end, found);
        Ok(found)
    }

    /// Every entry that can cover or overlap `[address, end)`: those starting at most the
    /// largest entry's size before `address` (nearest first), then those starting inside
    /// the range. Callers test each for what they need.
    fn candidates(
        &self,
        address: usize,
        end: usize,
    ) -> impl Iterator<Item = (RawHandle, Entry)> + '_ {
        let from = address.saturating_sub(self.largest);
        let before = self.by_start.range((from, 0)..=(address, usize::MAX)).rev();
        let lo = address.saturating_add(1);
        let inside = self.by_start.range((lo, 0)..(end.max(lo), 0));
        before.chain(inside).map(|(&(_, h), e)| (RawHandle(h), *e))
    }
}

/// The live registrations of one communicator.
#[derive(Debug, Default)]
pub struct Registry {
    live: Mutex<Table>,
}

impl Registry {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // A poisoned lock only means another thread panicked while holding it; the table
        // is still consistent (every update completes under the lock without panicking).
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a new registration; a handle already live is an error (a library that hands
    /// out the same handle twice).
    pub fn insert(
        &self,
        handle: RawHandle,
        address: usize,
        bytes: usize,
        kind: RegKind,
    ) -> Result<()> {
        let mut live = self.lock();
        if live.by_handle.contains_key(&handle) {
            return Err(Error::invalid(
                "handle",
                format!("{handle:?} is already registered"),
            ));
        }
        live.add(
            handle,
            Entry {
                address,
                bytes,
                kind,
            },
        );
        Ok(())
    }

    /// Checks that `handle` is a live registration of `kind` without removing it.
    pub fn check(&self, handle: RawHandle, kind: RegKind) -> Result<()> {
        Self::live_entry(&self.lock(), handle, kind).map(drop)
    }

    fn live_entry(live: &Table, handle: RawHandle, kind: RegKind) -> Result<Entry> {
        match live.by_handle.get(&handle) {
            Some(e) if e.kind == kind => Ok(*e),
            Some(e) => Err(Error::invalid(
                "handle",
                format!("{handle:?} is a {:?} registration, not a {kind:?}", e.kind),
            )),
            None => Err(Error::invalid(
                "handle",
                format!(
                    "{handle:?} is not a live registration of this communicator \
                     (deregistered already, or another communicator's)"
                ),
            )),
        }
    }

    /// Runs `f` with the size in bytes of `handle`, a live registration of `kind`, while no
    /// other thread can end it (the table's lock is held): for a library call that names
    /// the registration itself (a one-sided put's window).
    pub fn while_live<T>(
        &self,
        handle: RawHandle,
        kind: RegKind,
        f: impl FnOnce(usize) -> Result<T>,
    ) -> Result<T> {
        let live = self.lock();
        let e = Self::live_entry(&live, handle, kind)?;
        f(e.bytes)
    }

    /// Removes `handle` (check and removal are one step under the lock: of two threads
    /// removing one handle, exactly one succeeds).
    pub fn remove(&self, handle: RawHandle, kind: RegKind) -> Result<()> {
        let mut live = self.lock();
        Self::live_entry(&live, handle, kind)?;
        live.take(handle);
        Ok(())
    }

    /// Ends a registration with `release` (the library's deregistration call), as one step
    /// for concurrent callers: the handle is taken out of the table first, so of two threads
    /// deregistering it only one reaches the library; if the library fails, the handle goes
    /// back (it may still be registered there) and the error is returned.
    pub fn release(
        &self,
        handle: RawHandle,
        kind: RegKind,
        release: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let entry = {
            let mut live = self.lock();
            let e = Self::live_entry(&live, handle, kind)?;
            live.take(handle);
            e
        };
        release().inspect_err(|_| {
            self.lock().add(handle, entry);
        })
    }

    /// Which registration covers `[address, address+bytes)` entirely: `Ok(Some(kind))`,
    /// `Ok(None)` when no registration touches it, and an error when one overlaps it only
    /// in part (NCCL would then use an unregistered path for a buffer the caller believes
    /// registered).
    pub fn covering(&self, address: usize, bytes: usize) -> Result<Option<RegKind>> {
        if bytes == 0 {
            return Ok(None);
        }
        self.lock().covering(address, address.saturating_add(bytes))
    }

    /// Whether every non-empty range is covered by a registration of `kind`, under one
    /// acquisition of the table's lock (a call's send and receive buffers, on every call).
    /// The ranges are asked in order, as [`covering`](Self::covering) would be, and the
    /// first not covered by `kind` ends the question.
    pub fn all_covered_by(&self, kind: RegKind, ranges: &[(usize, usize)]) -> Result<bool> {
        if ranges.iter().all(|&(_, bytes)| bytes == 0) {
            return Ok(true);
        }
        let mut live = self.lock();
        for &(address, bytes) in ranges {
            if bytes > 0 && live.covering(address, address.saturating_add(bytes))? != Some(kind) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The window (or automatic registration) that covers `[address, address+bytes)`
    /// entirely: its handle, kind and base address.
    pub fn window_covering(
        &self,
        address: usize,
        bytes: usize,
    ) -> Result<Option<(RawHandle, RegKind, usize)>> {
        let live = self.lock();
        let end = address.saturating_add(bytes);
        let found = live
            .candidates(address, end)
            .find(|(_, e)| e.kind.is_window() && e.covers(address, end));
        Ok(found.map(|(h, e)| (h, e.kind, e.address)))
    }

    /// Number of live registrations.
    pub fn len(&self) -> usize {
        self.lock().by_handle.len()
    }

    /// Whether none is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every live handle of `kind` (for cleanup at destroy time).
    pub fn handles(&self, kind: RegKind) -> Vec<RawHandle> {
        self.lock()
            .by_handle
            .iter()
            .filter(|(_, e)| e.kind == kind)
            .map(|(h, _)| *h)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn double_remove_and_partial_cover_are_errors() {
        let r = Registry::new();
        r.insert(RawHandle(1), 0x1000, 0x100, RegKind::Buffer)
            .unwrap();
        assert_eq!(r.covering(0x1010, 0x10).unwrap(), Some(RegKind::Buffer));
        assert_eq!(r.covering(0x2000, 0x10).unwrap(), None);
        assert!(r.covering(0x10f0, 0x20).is_err());
        assert!(r.remove(RawHandle(1), RegKind::Window).is_err());
        r.remove(RawHandle(1), RegKind::Buffer).unwrap();
        assert!(matches!(
            r.remove(RawHandle(1), RegKind::Buffer),
            Err(Error::InvalidArgument { .. })
        ));
    }

    /// Among thousands of disjoint registrations a lookup examines a handful of entries,
    /// not all of them.
    #[test]
    fn lookups_examine_few_entries() {
        let r = Registry::new();
        for k in 0..4000usize {
            r.insert(RawHandle(k + 1), 0x10_0000 + k * 512, 256, RegKind::Buffer)
                .unwrap();
        }
        let live = r.lock();
        for k in [0usize, 1, 1999, 3999] {
            let a = 0x10_0000 + k * 512;
            for (addr, bytes) in [(a, 256), (a + 8, 16), (a + 300, 100), (a, 4096)] {
                let n = live.candidates(addr, addr + bytes).count();
                assert!(n <= 10, "{n} entries examined for {addr:#x}+{bytes}");
            }
        }
    }

    /// The indexed lookups agree with a scan of every entry, over random overlapping and
    /// nested registrations, insertions and removals (zero-length ranges and the top of the
    /// address space included).
    #[test]
    fn indexed_lookups_agree_with_a_full_scan() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let r = Registry::new();
        let mut model: Vec<(RawHandle, Entry)> = Vec::new();
        let kinds = [RegKind::Buffer, RegKind::Window, RegKind::Auto];
        // Earlier queries are asked again after each change (an engine's repeated calls),
        // so remembered answers are checked against the table as it is now.
        let mut asked: Vec<(usize, usize)> = Vec::new();
        for step in 0..20_000u64 {
            if rnd(3) > 0 || model.is_empty() {
                let e = Entry {
                    address: if rnd(50) == 0 {
                        usize::MAX - rnd(64) as usize
                    } else {
                        rnd(4096) as usize
                    },
                    bytes: rnd(300) as usize,
                    kind: kinds[rnd(3) as usize],
                };
                let h = RawHandle(step as usize + 1);
                r.insert(h, e.address, e.bytes, e.kind).unwrap();
                model.push((h, e));
            } else {
                let (h, e) = model.swap_remove(rnd(model.len() as u64) as usize);
                r.remove(h, e.kind).unwrap();
            }
            let a = if rnd(20) == 0 {
                usize::MAX - rnd(128) as usize
            } else {
                rnd(4400) as usize
            };
            let b = rnd(200) as usize;
            let end = a.saturating_add(b);
            let covers = |e: &Entry| e.address <= a && end <= e.end();
            asked.push((a, b));
            if asked.len() > 6 {
                asked.remove(0);
            }
            for &(qa, qb) in asked.iter().rev().chain(asked.iter()) {
                let qend = qa.saturating_add(qb);
                let covers = |e: &Entry| e.address <= qa && qend <= e.end();
                let overlaps = |e: &Entry| e.address < qend && qa < e.end();
                match r.covering(qa, qb) {
                    Ok(Some(k)) => {
                        assert!(qb > 0 && model.iter().any(|(_, e)| covers(e) && e.kind == k))
                    }
                    Ok(None) => assert!(qb == 0 || !model.iter().any(|(_, e)| overlaps(e))),
                    Err(_) => assert!(
                        !model.iter().any(|(_, e)| covers(e))
                            && model.iter().any(|(_, e)| overlaps(e))
                    ),
                }
            }
            let want = model.iter().any(|(_, e)| e.kind.is_window() && covers(e));
            match r.window_covering(a, b).unwrap() {
                Some((h, k, base)) => {
                    let (_, e) = model
                        .iter()
                        .find(|(mh, _)| *mh == h)
                        .expect("a live handle");
                    assert!(e.kind.is_window() && covers(e) && e.kind == k && e.address == base);
                }
                None => assert!(!want, "a window covers {a:#x}+{b} but none was found"),
            }
            assert_eq!(r.len(), model.len());
        }
    }
}
