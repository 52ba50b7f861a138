//! Windows shared for the copy-engine path: every rank's address of each window, by an
//! in-process table for ranks created together (`local.rs`), or, for one rank per process,
//! the allocation exported and the peers' mapped here (`ipc.rs`). The ranks agree per
//! window: if one rank cannot reach, export or map, no rank takes the path for that window
//! and the library's path runs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use unicomm_core::{RawHandle, Result};

use super::local::{LocalWorld, PeerPart, Peers};
use super::pending::Pending;
use super::region::Region;
use crate::base::Base;
use crate::sys::runtime::Runtime;

/// Where the peers' memory is found, and what has been shared so far.
#[derive(Debug, Default)]
pub(crate) struct Sharing {
    /// The in-process world, when the ranks were created together.
    pub(crate) world: Option<Arc<LocalWorld>>,
    /// One rank per process (or thread), joined with a unique id: peers' windows are
    /// exported and mapped (`ipc.rs`).
    #[cfg(target_os = "linux")]
    pub(crate) job: Option<super::ipc::Job>,
    /// Ranks created together in this process: the exchange that swaps memory which each
    /// rank maps for itself (symmetric memory: a mapping keeps the peer's memory alive
    /// after its owner frees it, where peer access would not), named by the world's own
    /// unique id. The copy-engine path keeps peer access.
    #[cfg(target_os = "linux")]
    pub(crate) local_job: Option<super::ipc::Job>,
    /// Exchanges so far (each one's sequence number).
    exchanges: AtomicU64,
    /// Every rank's (device, address, bytes) per window handle.
    peers: Mutex<HashMap<RawHandle, Peers>>,
    /// Peers' memory mapped into this process, per window: (address, size).
    mapped: Mutex<HashMap<RawHandle, Vec<(usize, usize)>>>,
}

impl Sharing {
    /// Peers in this process's `world` (created together), or, on Linux, in other
    /// processes of the job whose unique id is `job_id` (joined by id).
    pub(crate) fn new(world: Option<Arc<LocalWorld>>, job_id: Option<&[u8]>) -> Self {
        #[cfg(not(target_os = "linux"))]
        let _ = job_id;
        Sharing {
            world,
            #[cfg(target_os = "linux")]
            job: job_id.map(super::ipc::Job::from_id),
            ..Sharing::default()
        }
    }

    /// The local world's exchange for swapped memory, named by its unique id (`id`).
    pub(crate) fn with_local_job(self, id: &[u8]) -> Self {
        #[cfg(not(target_os = "linux"))]
        let _ = id;
        Sharing {
            #[cfg(target_os = "linux")]
            local_job: Some(super::ipc::Job::from_id(id)),
            ..self
        }
    }

    /// The exchange memory is swapped over: the job's, or the local world's.
    #[cfg(target_os = "linux")]
    pub(crate) fn memory_job(&self) -> Option<super::ipc::Job> {
        self.job.or(self.local_job)
    }

    /// Where the peers of the child of split number `split` (this communicator's) with
    /// `color` and `members` ranks are found: an in-process world of their own, made by the
    /// first member to arrive (every member is in this process where the parent's are), or
    /// the parent's job's child (one rank per process).
    pub(crate) fn child(&self, split: u64, color: u32, members: usize) -> Self {
        let world = self.world.as_ref().map(|w| w.child(split, color, members));
        Sharing {
            world,
            #[cfg(target_os = "linux")]
            job: self.job.as_ref().map(|j| j.child(split, color)),
            #[cfg(target_os = "linux")]
            local_job: self.local_job.as_ref().map(|j| j.child(split, color)),
            ..Sharing::default()
        }
    }

    /// Whether peers' memory can be reached at all (ranks in this process, or exchanged).
    pub(crate) fn reachable(&self) -> bool {
        #[cfg(target_os = "linux")]
        if self.job.is_some() {
            return true;
        }
        self.world.is_some()
    }

    /// Every rank's (device, address, bytes) of window `handle`, where it was shared.
    pub(crate) fn peers_of(&self, handle: RawHandle) -> Option<Peers> {
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.get(&handle).cloned()
    }

    /// Every mapping of peers' windows, taken out (the communicator's drop).
    pub(crate) fn take_mapped(&self) -> Vec<(usize, usize)> {
        let mut mapped = self.mapped.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *mapped)
            .into_values()
            .flatten()
            .collect()
    }

    /// Records a window: exchanges its address with the peers (collective, like the
    /// registration) and enables peer access to their devices; for one rank per process,
    /// exports it and maps the peers'.
    pub(crate) fn share_window<R: Runtime>(
        &self,
        base: &Base<R>,
        pending: &Pending<R>,
        handle: RawHandle,
        region: Region,
    ) -> Result<()> {
        #[cfg(target_os = "linux")]
        if let Some(job) = self.job {
            let Some((peers, maps)) = self.swap_ipc(base, pending, job, region, true)? else {
                return Ok(());
            };
            self.insert(handle, Arc::new(peers), Some(maps));
            return Ok(());
        }
        let _ = pending;
        if let Some(peers) = self.exchange_here(base, region)? {
            enable_peers(base, &peers)?;
            self.insert(handle, peers, None);
        }
        Ok(())
    }

    /// Swaps `addr..addr+bytes` with the peers in this process's table (the next exchange's
    /// number): every rank's (device, address, bytes), or `None` without a local world.
    fn exchange_here<R: Runtime>(
        &self,
        base: &Base<R>,
        Region { addr, bytes }: Region,
    ) -> Result<Option<Peers>> {
        let Some(world) = &self.world else {
            return Ok(None);
        };
        let seq = self.exchanges.fetch_add(1, Ordering::Relaxed);
        let mine = PeerPart {
            dev: base.lc.dev,
            addr,
            bytes,
        };
        Ok(Some(world.exchange(seq, base.lc.rank, mine)?))
    }

    fn insert(&self, handle: RawHandle, peers: Peers, maps: Option<Vec<(usize, usize)>>) {
        let mut p = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        p.insert(handle, peers);
        if let Some(maps) = maps {
            let mut m = self.mapped.lock().unwrap_or_else(|e| e.into_inner());
            m.insert(handle, maps);
        }
    }

    /// Forgets a window's peers (at deregistration), and unmaps the peers' memory mapped
    /// for it once the copies that used it are done.
    pub(crate) fn forget_window<R: Runtime>(&self, pending: &Pending<R>, handle: RawHandle) {
        self.peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&handle);
        let maps = self
            .mapped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&handle);
        if let Some(maps) = maps {
            pending.unmap_after(maps);
        }
    }

    /// Swaps `addr..addr+bytes` (`addr` 0: this rank offers nothing) with the peers in this
    /// process's table: every rank's (device, address, bytes), with peer access enabled,
    /// or `None` where some rank offered nothing.
    pub(crate) fn swap_local<R: Runtime>(
        &self,
        base: &Base<R>,
        region: Region,
    ) -> Result<Option<Peers>> {
        let Some(all) = self.exchange_here(base, region)? else {
            return Ok(None);
        };
        if all.iter().any(|p| p.addr == 0) {
            return Ok(None);
        }
        enable_peers(base, &all)?;
        Ok(Some(all))
    }

    /// Device memory swapped between processes (collective): export this rank's allocation
    /// holding `addr..addr+bytes` (unless `offer` is false), swap it with the peers' (a
    /// barrier first, so every rank's listener is bound), map theirs, and agree. Every
    /// rank's (device, address here, bytes) and the mappings made, or `None` where some
    /// rank could not (nothing stays mapped then).
    #[cfg(target_os = "linux")]
    pub(crate) fn swap_ipc<R: Runtime>(
        &self,
        base: &Base<R>,
        pending: &Pending<R>,
        job: super::ipc::Job,
        region: Region,
        offer: bool,
    ) -> Result<Option<super::export::Swapped>> {
        let seq = self.exchanges.fetch_add(1, Ordering::Relaxed);
        super::export::swap(base, pending, job, seq, region, offer)
    }
}

/// Lets this rank's device reach every other device in `peers` (in-process worlds).
fn enable_peers<R: Runtime>(base: &Base<R>, peers: &[PeerPart]) -> Result<()> {
    let lc = &base.lc;
    for p in peers {
        if p.dev != lc.dev {
            lc.rt.enable_peer_access(lc.dev, p.dev)?;
        }
    }
    Ok(())
}
