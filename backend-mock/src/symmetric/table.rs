//! A communicator's symmetric allocations ([`Table`]) and one rank's view of one
//! ([`Record`]): its own memory, its mappings of the peers', where each part lies.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use unicomm_core::registry::RawHandle;
use unicomm_core::symmetric::{LAMPORT_HEADER, PAD_BYTES};
use unicomm_core::{DataType, Error, Result};

use crate::memory::MockMemory;

/// One rank's view of a symmetric allocation: its own memory and its mappings of every
/// peer's, kept while the allocation or work on it lives.
pub(crate) struct Record {
    /// This rank's allocation (what `Symmetric`'s buffer is), kept while work uses it.
    pub _own: MockMemory,
    /// The peers' allocations mapped here (`None` for this rank).
    #[cfg(target_os = "linux")]
    pub _maps: Vec<Option<crate::shm::PeerMap>>,
    /// Each rank's allocation, at its address here.
    pub bases: Vec<usize>,
    /// Bytes of data per rank, and where the pad and the workspaces start.
    pub bytes: usize,
    pub pad_at: usize,
    pub lamport: Option<DataType>,
    /// This rank.
    pub rank: usize,
}

impl Record {
    /// Rank `p`'s signal pad, at its address here.
    pub(crate) fn pad(&self, p: usize) -> usize {
        self.bases[p] + self.pad_at
    }

    /// Bytes from one Lamport slot to the next: its header, then the data's bytes.
    pub(crate) fn lamport_stride(&self) -> usize {
        LAMPORT_HEADER + self.pad_at
    }

    /// Rank `p`'s Lamport workspace `b` (0..3), slot `slot` (its header), at its address
    /// here.
    pub(crate) fn lamport_slot(&self, p: usize, b: usize, slot: usize) -> usize {
        let world = self.bases.len();
        self.bases[p] + self.pad_at + PAD_BYTES + (b * world + slot) * self.lamport_stride()
    }
}

/// A communicator's symmetric allocations by handle.
#[derive(Default)]
pub(crate) struct Table {
    pub(crate) next: std::sync::atomic::AtomicUsize,
    pub(crate) live: Mutex<HashMap<RawHandle, Arc<Record>>>,
}

impl Table {
    /// The allocation `handle` names (`InvalidArgument` for one this communicator does not
    /// hold).
    pub(crate) fn get(&self, handle: RawHandle) -> Result<Arc<Record>> {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&handle)
            .cloned()
            .ok_or_else(|| unknown(handle))
    }
}

pub(crate) fn unknown(handle: RawHandle) -> Error {
    Error::invalid(
        "handle",
        format!("symmetric allocation {handle:?} is not one of this communicator's (freed, or another's)"),
    )
}
