//! The copy-engine path for all-to-all, all-to-all-v (`var.rs`) and all-gather: the bytes
//! move by device-to-device
//! copies (`cuMemcpyDtoDAsync` over NVLink with peer access), which run on the GPUs' copy
//! engines and use no SMs, so they also overlap compute.
//!
//! How it works, for ranks that live in one process (created together by
//! [`ApiComm::init_local`]):
//! - registering a symmetric window is collective; when the copy-engine path is on, each
//!   rank also deposits the window's device address in the world's [`LocalWorld`] table and
//!   takes its peers' (a rendezvous with a deadline), and enables peer access to their
//!   devices;
//! - an all-to-all (or all-gather) whose output lies in such a window, issued outside a
//!   group, becomes: a barrier (a one-element all-reduce, so every peer's output is free to
//!   be overwritten), one copy per peer of this rank's chunk straight into the peer's output
//!   (and a local copy of its own chunk), then a second barrier (so every copy into this
//!   rank's output has landed before the work after it on the caller's stream). All of it
//!   is enqueued on the caller's stream, so ordering holds.
//! - Windows are symmetric: a peer's output is at the same offset of its window as this
//!   rank's (NCCL's rule for symmetric collectives).
//!
//! For one rank per process (communicators joined with [`ApiComm::init_rank`]), the
//! window's allocation is exported (a cuMem / hipMem POSIX descriptor) and swapped with the
//! peers on the same host over Unix sockets (`export.rs`, `ipc.rs`); each rank maps its peers' windows
//! into its own address space, and the copies are the same. The ranks agree per window: if
//! one rank cannot reach, export or map, no rank takes the path for that window and the
//! library's path runs. Mapped peer memory is unmapped when the window is deregistered,
//! once the copies that used it have completed (an event per stream, waited for with the
//! communicator's deadline).

#![allow(
    unsafe_code,
    reason = "calls the NCCL-API library or the device runtime at its call sites (the architecture test's UNSAFE_FILES lists them)"
)]

#[cfg(target_os = "linux")]
mod export;
#[cfg(target_os = "linux")]
pub(crate) mod ipc;
pub(crate) mod local;
mod pending;
pub(crate) mod region;
mod share;
mod var;

pub(crate) use share::Sharing;
pub(crate) mod signals;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use unicomm_core::{Error, Kind, Op, RawHandle, Result};

use crate::base::Base;
use crate::group;
use crate::memory::{ApiMemory, ApiStream};
use crate::sys::calls::StreamRef;
use crate::sys::runtime::Runtime;
use pending::Pending;
use region::Region;
use signals::{CopyEngineSync, Phase, Phases, SignalRelease, Signals};

/// What an all-to-all or all-gather becomes on the copy-engine path.
pub(crate) struct Plan {
    /// (destination, source, bytes, into this rank's own window) per copy, peers' first.
    copies: Vec<(usize, usize, usize, bool)>,
}

/// A communicator's copy-engine path.
pub(crate) struct CopyEngine<R: Runtime> {
    sharing: Sharing,
    pending: Arc<Pending<R>>,
    /// How the ranks wait for each other, agreed at the first shared window.
    phases: OnceLock<Phases<R>>,
    /// The side stream of the local copies, created at first use.
    side: Mutex<Option<R::Stream>>,
    enabled: AtomicBool,
    /// Operations that took the path.
    calls: AtomicU64,
}

impl<R: Runtime> std::fmt::Debug for CopyEngine<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyEngine")
            .field("local", &self.sharing.world.is_some())
            .field("enabled", &self.enabled)
            .finish_non_exhaustive()
    }
}

impl<R: Runtime> CopyEngine<R> {
    /// The path of a child of split number `split` with `color` and `members` ranks: its
    /// peers are found where this communicator's are (see `Sharing::child`).
    pub(crate) fn child_sharing(&self, split: u64, color: u32, members: usize) -> Sharing {
        self.sharing.child(split, color, members)
    }

    /// The path over `base`, its peers found as `sharing` says (in this process's world, by
    /// the job's exchange, or nowhere).
    pub(crate) fn with_sharing(base: &Base<R>, sharing: Sharing) -> Self {
        let lc = &base.lc;
        CopyEngine {
            sharing,
            pending: Arc::new(Pending::new(lc.rt.clone(), lc.dev, lc.rank)),
            phases: OnceLock::new(),
            side: Mutex::new(None),
            enabled: AtomicBool::new(false),
            calls: AtomicU64::new(0),
        }
    }

    /// Whether peers' memory can be reached at all.
    pub(crate) fn reachable(&self) -> bool {
        self.sharing.reachable()
    }

    /// Whether peers' memory is exchanged and mapped here (one rank per process joined by
    /// unique id, or ranks created together in this process; Linux): what symmetric memory
    /// across ranks takes.
    pub(crate) fn exchanges_memory(&self) -> bool {
        #[cfg(target_os = "linux")]
        return self.sharing.memory_job().is_some();
        #[cfg(not(target_os = "linux"))]
        false
    }

    /// Device memory swapped between the job's processes (collective): every rank's
    /// (device, address here, bytes) and the peers' mappings made, or `None` where some
    /// rank could not export or map (nothing stays mapped then) or there is no job.
    pub(crate) fn swap_memory(
        &self,
        base: &Base<R>,
        range: Region,
    ) -> Result<Option<local::Swapped>> {
        #[cfg(target_os = "linux")]
        if let Some(job) = self.sharing.memory_job() {
            return self.sharing.swap_ipc(base, &self.pending, job, range, true);
        }
        let _ = (base, range);
        Ok(None)
    }

    /// Whether windows registered now are shared for the path (`set_copy_engine`).
    pub(crate) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// How many operations took the path so far.
    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Which mechanism orders the ranks (`None` before the first shared window).
    pub(crate) fn sync(&self) -> Option<CopyEngineSync> {
        self.phases.get().map(Phases::kind)
    }

    /// `set_copy_engine`: needs peers' memory within reach (the ranks in this process, a
    /// world from `local_comms`/`init_local`; or, on Linux, ranks joined with `init_rank`,
    /// whose windows are exchanged between the processes), elsewhere `Unsupported`. Windows
    /// registered while it is on are shared with the peers (where every rank can: agreed
    /// per window); only outputs in such windows take the path.
    pub(crate) fn switch(&self, on: bool) -> Result<()> {
        if on && !self.reachable() {
            return Err(Error::unsupported(
                "the copy-engine path",
                "ranks in one process (local_comms / init_local), or joined with init_rank on Linux, where peers' memory is reachable",
                "a communicator joined with init_rank on a system without the memory exchange (Linux only)",
            ));
        }
        self.enabled.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Shares a window for the path (collective, like its registration): the ranks'
    /// mechanism first (once per communicator), then the window's addresses.
    pub(crate) fn share_window(
        &self,
        base: &Base<R>,
        handle: RawHandle,
        range: Region,
    ) -> Result<()> {
        self.agree_phases(base)?;
        self.sharing
            .share_window(base, &self.pending, handle, range)
    }

    /// Forgets a window at its deregistration (its peers' mappings go once unused).
    pub(crate) fn forget_window(&self, handle: RawHandle) {
        self.sharing.forget_window(&self.pending, handle);
    }

    /// The copies of `op` on the copy-engine path, or `None` when the library's path runs
    /// (path off, inside a group, not a local world, output not in a window).
    /// `forced`: the automatic policy asked for it (the path need not be switched on).
    #[inline]
    pub(crate) fn plan(
        &self,
        base: &Base<R>,
        op: &Op<'_, ApiMemory<R>>,
        forced: bool,
    ) -> Result<Option<Plan>> {
        if !matches!(op.kind, Kind::AllToAll | Kind::AllGather)
            || !(forced || self.enabled())
            || group::in_group()
        {
            return Ok(None);
        }
        self.plan_of(base, op)
    }

    /// The plan itself, out of line: only copy-engine candidates get here.
    #[inline(never)]
    fn plan_of(&self, b: &Base<R>, op: &Op<'_, ApiMemory<R>>) -> Result<Option<Plan>> {
        let (send, recv) = op.pair()?;
        let chunk = op.count * op.dtype.size();
        let total = chunk * b.lc.world;
        let Some((handle, _, base)) = b.registry.window_covering(recv.address(), total)? else {
            return Ok(None);
        };
        let Some(peers) = self.sharing.peers_of(handle) else {
            return Ok(None);
        };
        let off = recv.address() - base;
        let mut copies = Vec::with_capacity(b.lc.world);
        for k in 1..=b.lc.world {
            // Peers first, in a rotating order so the ranks do not all write to one peer at
            // once; this rank's own chunk last.
            let p = (b.lc.rank + k) % b.lc.world;
            let local::PeerPart {
                addr: peer_base,
                bytes: peer_bytes,
                ..
            } = peers[p];
            let at = off + b.lc.rank * chunk;
            if at + chunk > peer_bytes {
                return Err(Error::invalid(
                    "recv",
                    format!(
                        "rank {p}'s window holds {peer_bytes} bytes, the copy needs {}; symmetric windows need the same size and offsets on every rank",
                        at + chunk
                    ),
                ));
            }
            let src = match op.kind {
                Kind::AllToAll => send.address() + p * chunk,
                _ => send.address(),
            };
            let dst = peer_base + at;
            if chunk > 0 && src != dst {
                copies.push((dst, src, chunk, p == b.lc.rank));
            }
        }
        Ok(Some(Plan { copies }))
    }

    /// Runs a plan on `stream`: the ranks' first phase (every peer's output free), the
    /// copies, the second phase (every copy into this rank's output landed). The phases are
    /// signals (`signals.rs`: no kernel) where the ranks agreed on them, else one-element
    /// all-reduces; a world of one needs neither.
    ///
    /// The local copy (this rank's own chunk, device-local) runs on a side stream forked
    /// from the caller's by events, so it overlaps the peer copies over NVLink instead of
    /// adding its time to theirs; it needs no peer, so it starts before the first phase, and
    /// the caller's stream waits for it before the second.
    pub(crate) fn run(&self, b: &Base<R>, plan: Plan, stream: &R::Stream) -> Result<()> {
        let lc = &b.lc;
        let st = R::raw_stream(stream);
        let phases = self.phases.get();
        let signals = matches!(phases, Some(Phases::Signals(_)));
        // Peers' memory is mapped only for ranks joined by unique id (one per process).
        let mapped = self.reachable() && self.sharing.world.is_none();
        // Events for what outlives the call (mapped peers' memory, signal blocks) and for
        // the order between streams; none while a graph is captured (they would be nodes
        // of the graph, not something to wait for later).
        let track = (mapped || signals) && !lc.rt.capturing(stream)?;
        // With signals the whole operation is enqueued holding the pending events' lock,
        // after a check that the communicator is live: an abort marks it aborted first,
        // then takes this lock to see what to release (`SignalRelease`), so it sees
        // every operation enqueued before it and none starts after. (The barriers take
        // the communicator's lock, which comes first in the lock order: they run without this held.)
        let mut held = signals.then(|| self.pending.lock());
        lc.live_now()?;
        if track {
            // Signals pair the ranks' operations in issue order: one on another stream
            // must not overtake the previous one (NCCL orders one communicator's work so).
            if let Some((s, ev)) = held.as_ref().and_then(|p| p.last()) {
                if *s != st as usize {
                    lc.rt.wait_event(lc.dev, stream, ev)?;
                }
            }
        }
        self.calls.fetch_add(1, Ordering::Relaxed);
        let (local, peers): (Vec<_>, Vec<_>) =
            plan.copies.into_iter().partition(|&(_, _, _, own)| own);
        let mut side = self.side.lock().unwrap_or_else(|e| e.into_inner());
        if !local.is_empty() && side.is_none() {
            *side = Some(lc.rt.create_stream(lc.dev)?);
        }
        let forked = match (&*side, local.is_empty()) {
            (Some(s), false) => {
                let start = lc.rt.with_device(lc.dev, || lc.rt.record(stream))?;
                lc.rt.wait_event(lc.dev, s, &start)?;
                for &(dst, src, bytes, _) in &local {
                    // SAFETY: both ranges are this rank's memory (send range and own output
                    // chunk, checked by `Op::check`), free by this stream's order (the
                    // event above); the caller's stream waits for the side stream below,
                    // before anything after this operation touches them.
                    unsafe { lc.rt.copy_async(lc.dev, dst, src, bytes, s) }?;
                }
                Some(lc.rt.with_device(lc.dev, || lc.rt.record(s))?)
            }
            _ => None,
        };
        let phase = |ph: Phase| match phases {
            Some(Phases::Signals(sig)) => sig.phase(&*lc.rt, lc.dev, lc.rank, ph, stream),
            Some(Phases::Alone) => Ok(()),
            // SAFETY: the caller's stream, borrowed for this call.
            Some(Phases::Barrier) | None => b.barrier_on(unsafe { StreamRef::borrow_raw(st) }),
        };
        phase(Phase::Ready)?;
        for (dst, src, bytes, _) in peers {
            // SAFETY: `src` lies in this rank's send range (checked by `Op::check`); `dst` in
            // a peer's window, registered and alive until that peer deregisters it, which
            // it does only after this operation's second phase (window deregistration
            // follows the rank's stream order); bounds checked against the peer's window.
            unsafe { lc.rt.copy_async(lc.dev, dst, src, bytes, stream) }?;
        }
        if let Some(done) = forked {
            lc.rt.wait_event(lc.dev, stream, &done)?;
        }
        phase(Phase::Done)?;
        if track {
            // What unmapping and freeing wait for (one event per stream, the latest last):
            // the stream's event recorded again (no event created per operation).
            let mut list = match held.take() {
                Some(p) => p,
                None => self.pending.lock(),
            };
            self.pending.record(&mut list, st as usize, stream)?;
        }
        Ok(())
    }

    /// This rank's signal block, ready to offer: allocated (with `ncclMemAlloc` where the
    /// library has it, so it can be exported), zeroed with the constant 1 in place, and
    /// probed (a write and a wait on it completed), or why not.
    fn signal_block(&self, b: &Base<R>) -> Result<ApiMemory<R>> {
        let lc = &b.lc;
        let init = signals::block_image(lc.world);
        let block = ApiMemory::alloc(&lc.api, lc.rt.clone(), lc.dev, lc.deadline(), init.len())?;
        let s = lc.rt.create_stream(lc.dev)?;
        let probe = signals::slot(block.ptr, lc.world, Phase::Ready, lc.rank);
        // SAFETY: `block` holds `init.len()` device bytes of this device; the probe word is one
        // of them (aligned, see `Signals::phase`).
        unsafe {
            lc.rt.htod(lc.dev, block.ptr, &init, &s)?;
            lc.rt.write_value32(lc.dev, probe, 1, &s)?;
            lc.rt.wait_value32(lc.dev, probe, 1, &s)?;
            lc.rt.write_value32(lc.dev, probe, 0, &s)?;
        }
        // The probe completes at once where the calls work; waited for with the deadline.
        let st = ApiStream::from_runtime(lc.rt.clone(), s, lc.dev)?;
        st.synchronize()?;
        Ok(block)
    }

    /// Agrees on the mechanism with the peers (collective; at the first window shared for
    /// the path): exchanges the signal blocks, in this process's table or across processes.
    fn agree_phases(&self, b: &Base<R>) -> Result<()> {
        let lc = &b.lc;
        if self.phases.get().is_some() {
            return Ok(());
        }
        let agreed = if lc.world == 1 {
            Phases::Alone
        } else {
            let want =
                signals::wanted()? == CopyEngineSync::Signals && lc.rt.stream_memory_ops(lc.dev);
            // Read before anything is exchanged, so a misspelt value fails every rank alike.
            let by_write = signals::by_write_wanted()? && lc.rt.signal_by_write(lc.dev);
            let block = if want {
                self.signal_block(b).map_err(|e| {
                    tracing::warn!(
                        "unicomm: rank {}: copy-engine signals unavailable, NCCL barriers instead: {e}",
                        lc.rank
                    );
                })
                .ok()
            } else {
                None
            };
            let addr = block.as_ref().map_or(0, |b| b.ptr);
            let bytes = signals::block_bytes(lc.world);
            match self.swap_blocks(b, addr, bytes)? {
                Some((bases, mapped)) => {
                    if block.is_some() {
                        lc.add_abort_hook(Arc::new(SignalRelease {
                            rt: lc.rt.clone(),
                            dev: lc.dev,
                            rank: lc.rank,
                            block: (addr, lc.world),
                            pending: self.pending.clone(),
                        }));
                    }
                    Phases::Signals(Signals {
                        block,
                        bases,
                        mapped,
                        by_write,
                    })
                }
                None => Phases::Barrier,
            }
        };
        // Registrations are collective and ordered, so no other thread of this rank agrees
        // at the same time; if one did, the first result stays.
        let _ = self.phases.set(agreed);
        Ok(())
    }

    /// Swaps `addr` (0: this rank offers nothing) with the peers: every rank's address as
    /// seen here and the mappings made, or `None` where some rank offered nothing.
    fn swap_blocks(
        &self,
        b: &Base<R>,
        addr: usize,
        bytes: usize,
    ) -> Result<Option<(Vec<usize>, signals::Mappings)>> {
        #[cfg(target_os = "linux")]
        if let Some(job) = self.sharing.job {
            return Ok(self
                .sharing
                .swap_ipc(b, &self.pending, job, Region { addr, bytes }, addr != 0)?
                .map(|(peers, maps)| (peers.iter().map(|p| p.addr).collect(), maps)));
        }
        // The signals are copied into the peers' blocks: this runs before the first
        // window's exchange, so peer access is enabled here.
        Ok(self
            .sharing
            .swap_local(b, Region { addr, bytes })?
            .map(|all| (all.iter().map(|p| p.addr).collect(), Vec::new())))
    }

    /// At the communicator's drop, after its teardown: peers' memory still mapped for
    /// windows the communicator took with it, and the signal blocks (peers' mapped, this
    /// rank's own), unmapped and freed once no copy uses them, else leaked.
    pub(crate) fn release_at_drop(&mut self) {
        let mut maps = self.sharing.take_mapped();
        let mut own = None;
        if let Some(Phases::Signals(sig)) = self.phases.get_mut() {
            maps.append(&mut sig.mapped);
            own = sig.block.take();
        }
        let n = maps.len() + usize::from(own.is_some());
        let pending = &self.pending;
        let freed = n == 0 || pending.release_after(n, || pending.unmap_now(maps));
        if !freed {
            // Peers' writes into it may still be pending: leaked, never freed under them.
            std::mem::forget(own);
        }
    }

    /// At a drop that could not end the communicator: its signal block is left allocated
    /// (peers and the library may still use it).
    pub(crate) fn leak_at_drop(&mut self) {
        if let Some(Phases::Signals(sig)) = self.phases.get_mut() {
            std::mem::forget(sig.block.take());
        }
    }

    /// Whether every operation so far completed within `within` (see [`Pending`]).
    pub(crate) fn done_within(&self, within: std::time::Duration) -> bool {
        self.pending.done_within(within)
    }
}
