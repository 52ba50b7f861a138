//! Registration bookkeeping shared by the backends: which handles are live, over which
//! address ranges, so that a handle deregistered twice or taken from another communicator
//! is an error, never a call into the library with a dangling pointer.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::backend::RawHandle;
use crate::{Error, Result};

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

/// The live registrations of one communicator.
#[derive(Debug, Default)]
pub struct Registry {
    live: Mutex<HashMap<RawHandle, Entry>>,
}

impl Registry {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RawHandle, Entry>> {
        // A poisoned lock only means another thread panicked while holding it; the map is
        // still consistent (every update is a single insert or remove).
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
        if live.contains_key(&handle) {
            return Err(Error::invalid(
                "handle",
                format!("{handle:?} is already registered"),
            ));
        }
        live.insert(
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

    fn live_entry(
        live: &HashMap<RawHandle, Entry>,
        handle: RawHandle,
        kind: RegKind,
    ) -> Result<Entry> {
        match live.get(&handle) {
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

    /// Removes `handle` (check and removal are one step under the lock: of two threads
    /// removing one handle, exactly one succeeds).
    pub fn remove(&self, handle: RawHandle, kind: RegKind) -> Result<()> {
        let mut live = self.lock();
        Self::live_entry(&live, handle, kind)?;
        live.remove(&handle);
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
            live.remove(&handle);
            e
        };
        release().inspect_err(|_| {
            self.lock().insert(handle, entry);
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
        let end = address.saturating_add(bytes);
        let live = self.lock();
        let mut partial = None;
        for e in live.values() {
            let e_end = e.address + e.bytes;
            if e.address <= address && end <= e_end {
                return Ok(Some(e.kind));
            }
            if e.address < end && address < e_end {
                partial = Some(*e);
            }
        }
        match partial {
            Some(e) => Err(Error::invalid(
                "buffer",
                format!(
                    "bytes {address:#x}..{end:#x} are only partly covered by the registration \
                     {:#x}..{:#x}",
                    e.address,
                    e.address + e.bytes
                ),
            )),
            None => Ok(None),
        }
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
        Ok(live
            .iter()
            .find(|(_, e)| e.kind.is_window() && e.address <= address && end <= e.address + e.bytes)
            .map(|(h, e)| (*h, e.kind, e.address)))
    }

    /// Number of live registrations.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every live handle of `kind` (for cleanup at destroy time).
    pub fn handles(&self, kind: RegKind) -> Vec<RawHandle> {
        self.lock()
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
}
