//! The copy-engine path for all-to-all and all-gather: the bytes move by device-to-device
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
//! peers on the same host over Unix sockets (`ipc.rs`); each rank maps its peers' windows
//! into its own address space, and the copies are the same. The ranks agree per window: if
//! one rank cannot reach, export or map, no rank takes the path for that window and the
//! library's path runs. Mapped peer memory is unmapped when the window is deregistered,
//! once the copies that used it have completed (an event per stream, waited for with the
//! communicator's deadline).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use unicomm_core::{Error, Kind, Op, RawHandle, Result};

use crate::comm::ApiComm;
use crate::memory::ApiMemory;
use crate::runtime::Runtime;
use crate::signals::{Phase, Sync};

/// One window as every rank sees it: per rank, (device, address, bytes).
pub(crate) type Peers = Arc<Vec<(usize, usize, usize)>>;

/// Memory swapped between processes: every rank's (device, address here, bytes), and the
/// peers' allocations mapped into this process for it, (address, size).
pub(crate) type Swapped = (Vec<(usize, usize, usize)>, Vec<(usize, usize)>);

/// The ranks of one world created in one process: a table where window registrations meet.
#[derive(Debug)]
pub(crate) struct LocalWorld {
    world: usize,
    slots: Mutex<HashMap<u64, Slot>>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct Slot {
    entries: Vec<Option<(usize, usize, usize)>>,
    taken: usize,
}

/// How long a rank waits for its peers at a window registration.
const EXCHANGE_DEADLINE: Duration = Duration::from_secs(60);

impl LocalWorld {
    pub(crate) fn new(world: usize) -> Self {
        LocalWorld {
            world,
            slots: Mutex::new(HashMap::new()),
            cv: Condvar::new(),
        }
    }

    /// Deposits this rank's entry for registration number `seq` and returns every rank's,
    /// once all arrived (`Timeout` naming the missing ranks after the deadline).
    pub(crate) fn exchange(
        &self,
        seq: u64,
        rank: usize,
        entry: (usize, usize, usize),
    ) -> Result<Peers> {
        let deadline = Instant::now() + EXCHANGE_DEADLINE;
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let world = self.world;
        let slot = slots.entry(seq).or_insert_with(|| Slot {
            entries: vec![None; world],
            taken: 0,
        });
        slot.entries[rank] = Some(entry);
        self.cv.notify_all();
        loop {
            if let Some(s) = slots.get(&seq) {
                if s.entries.iter().all(Option::is_some) {
                    break;
                }
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<String> = slots
                    .get(&seq)
                    .map(|s| {
                        (0..world)
                            .filter(|&r| s.entries[r].is_none())
                            .map(|r| r.to_string())
                            .collect()
                    })
                    .unwrap_or_default();
                return Err(Error::Timeout {
                    what: format!(
                        "window registration #{seq}: rank(s) {} never registered theirs",
                        missing.join(", ")
                    ),
                    after: EXCHANGE_DEADLINE,
                });
            }
            slots = self
                .cv
                .wait_timeout(slots, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let slot = slots
            .get_mut(&seq)
            .ok_or_else(|| Error::invalid("window", "exchange slot vanished"))?;
        let all: Vec<(usize, usize, usize)> = slot.entries.iter().flatten().copied().collect();
        slot.taken += 1;
        if slot.taken == world {
            slots.remove(&seq);
        }
        Ok(Arc::new(all))
    }
}

thread_local! {
    /// Depth of this thread's NCCL group: copies cannot be deferred to the group's end, so
    /// inside a group the library's path runs.
    pub(crate) static GROUP_DEPTH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// What an all-to-all or all-gather becomes on the copy-engine path.
pub(crate) struct Plan {
    /// (destination, source, bytes, into this rank's own window) per copy, peers' first.
    copies: Vec<(usize, usize, usize, bool)>,
}

impl<R: Runtime> ApiComm<R> {
    /// The copies of `op` on the copy-engine path, or `None` when the library's path runs
    /// (path off, inside a group, not a local world, output not in a window).
    /// `forced`: the automatic policy asked for it (the path need not be switched on).
    #[inline]
    pub(crate) fn copy_engine_plan(
        &self,
        op: &Op<'_, ApiMemory<R>>,
        forced: bool,
    ) -> Result<Option<Plan>> {
        // The kind first: it is at hand, the switch and the group depth are a cache line
        // each for every all-reduce.
        if !matches!(op.kind, Kind::AllToAll | Kind::AllGather)
            || !(forced || self.ce.enabled.load(std::sync::atomic::Ordering::Relaxed))
            || GROUP_DEPTH.with(|d| d.get()) > 0
        {
            return Ok(None);
        }
        self.copy_engine_plan_of(op)
    }

    /// The plan itself, out of line: only copy-engine candidates get here.
    #[inline(never)]
    fn copy_engine_plan_of(&self, op: &Op<'_, ApiMemory<R>>) -> Result<Option<Plan>> {
        let (send, recv) = op.pair()?;
        let chunk = op.count * op.dtype.size();
        let total = chunk * self.world;
        let Some((handle, _, base)) = self.registry.window_covering(recv.address(), total)? else {
            return Ok(None);
        };
        let peers = match self
            .ce
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&handle)
        {
            Some(p) => p.clone(),
            None => return Ok(None),
        };
        let off = recv.address() - base;
        let mut copies = Vec::with_capacity(self.world);
        for k in 1..=self.world {
            // Peers first, in a rotating order so the ranks do not all write to one peer at
            // once; this rank's own chunk last.
            let p = (self.rank + k) % self.world;
            let (_, peer_base, peer_bytes) = peers[p];
            let at = off + self.rank * chunk;
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
                copies.push((dst, src, chunk, p == self.rank));
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
    pub(crate) fn run_copy_engine(&self, plan: Plan, stream: &R::Stream) -> Result<()> {
        let st = R::raw_stream(stream);
        let sync = self.ce.sync.get();
        let signals = matches!(sync, Some(Sync::Signals(_)));
        // Peers' memory is mapped only for ranks joined by unique id (one per process).
        let mapped = self.ce.reachable() && self.ce.world.is_none();
        // Events for what outlives the call (mapped peers' memory, signal blocks) and for
        // the order between streams; none while a graph is captured (they would be nodes
        // of the graph, not something to wait for later).
        let track = (mapped || signals) && !self.rt.capturing(stream)?;
        // With signals the whole operation is enqueued holding the pending events' lock,
        // after a check that the communicator is live: an abort marks it aborted first,
        // then takes this lock to see what to release (`Core::release_signals`), so it sees
        // every operation enqueued before it and none starts after. (The barriers take
        // `Core::lock`, which comes first in the lock order: they run without this held.)
        let mut held = signals.then(|| {
            self.core
                .ce_pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
        });
        self.core.live()?;
        if track {
            // Signals pair the ranks' operations in issue order: one on another stream
            // must not overtake the previous one (NCCL orders one communicator's work so).
            if let Some((s, ev)) = held.as_ref().and_then(|p| p.last()) {
                if *s != st as usize {
                    self.rt.wait_event(self.dev, stream, ev)?;
                }
            }
        }
        self.ce
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (local, peers): (Vec<_>, Vec<_>) =
            plan.copies.into_iter().partition(|&(_, _, _, own)| own);
        let mut side = self.ce.side.lock().unwrap_or_else(|e| e.into_inner());
        if !local.is_empty() && side.is_none() {
            *side = Some(self.rt.create_stream(self.dev)?);
        }
        let forked = match (&*side, local.is_empty()) {
            (Some(s), false) => {
                let start = self.rt.with_device(self.dev, || self.rt.record(stream))?;
                self.rt.wait_event(self.dev, s, &start)?;
                for &(dst, src, bytes, _) in &local {
                    // SAFETY: both ranges are this rank's memory (send range and own output
                    // chunk, checked by `Op::check`), free by this stream's order (the
                    // event above); the caller's stream waits for the side stream below,
                    // before anything after this operation touches them.
                    unsafe { self.rt.copy_async(self.dev, dst, src, bytes, s) }?;
                }
                Some(self.rt.with_device(self.dev, || self.rt.record(s))?)
            }
            _ => None,
        };
        let phase = |ph: Phase| match sync {
            Some(Sync::Signals(sig)) => sig.phase(&*self.rt, self.dev, self.rank, ph, stream),
            Some(Sync::Alone) => Ok(()),
            Some(Sync::Barrier) | None => self.barrier_on(st),
        };
        phase(Phase::Ready)?;
        for (dst, src, bytes, _) in peers {
            // SAFETY: `src` lies in this rank's send range (checked by `Op::check`); `dst` in
            // a peer's window, registered and alive until that peer deregisters it, which
            // it does only after this operation's second phase (window deregistration
            // follows the rank's stream order); bounds checked against the peer's window.
            unsafe { self.rt.copy_async(self.dev, dst, src, bytes, stream) }?;
        }
        if let Some(done) = forked {
            self.rt.wait_event(self.dev, stream, &done)?;
        }
        phase(Phase::Done)?;
        if track {
            // What unmapping and freeing wait for (one event per stream, the latest last):
            // the stream's event recorded again (no event created per operation).
            let mut p = match held.take() {
                Some(p) => p,
                None => self
                    .core
                    .ce_pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()),
            };
            let key = st as usize;
            match p.iter().position(|(s, _)| *s == key) {
                Some(i) => {
                    let mut e = p.remove(i);
                    let again = self.rt.record_again(&mut e.1, stream);
                    // On failure the event keeps its last recording: still waited for.
                    p.push(e);
                    again?;
                }
                None => p.push((
                    key,
                    self.rt.with_device(self.dev, || self.rt.record(stream))?,
                )),
            }
        }
        Ok(())
    }

    /// Records a window for the copy-engine path: exchanges its address with the peers
    /// (collective, like the registration) and enables peer access to their devices; for
    /// one rank per process, exports it and maps the peers' (`share_window_ipc`).
    pub(crate) fn share_window(&self, handle: RawHandle, addr: usize, bytes: usize) -> Result<()> {
        // The ranks' mechanism first (collective, once per communicator).
        self.agree_sync()?;
        #[cfg(target_os = "linux")]
        if let Some(job) = self.ce.job {
            return self.share_window_ipc(job, handle, addr, bytes);
        }
        let Some(world) = &self.ce.world else {
            return Ok(());
        };
        let seq = self
            .ce
            .windows
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let peers = world.exchange(seq, self.rank, (self.dev, addr, bytes))?;
        self.enable_peers(&peers)?;
        self.ce
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(handle, peers);
        Ok(())
    }

    /// Lets this rank's device reach every other device in `peers` (in-process worlds).
    pub(crate) fn enable_peers(&self, peers: &[(usize, usize, usize)]) -> Result<()> {
        for &(dev, _, _) in peers {
            if dev != self.dev {
                self.rt.enable_peer_access(self.dev, dev)?;
            }
        }
        Ok(())
    }

    /// Forgets a window's peers (at deregistration), and unmaps the peers' memory mapped
    /// for it once the copies that used it are done.
    pub(crate) fn forget_window(&self, handle: RawHandle) {
        self.ce
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&handle);
        let maps = self
            .ce
            .mapped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&handle);
        if let Some(maps) = maps {
            self.unmap_peers(maps);
        }
    }

    /// Unmaps peers' memory: after every copy-engine operation that may have used it has
    /// completed (the last event of each stream it ran on), within the deadline; if that
    /// wait fails the mappings are left (leaked, never unmapped under a running copy).
    /// Whether the operations were seen complete.
    pub(crate) fn unmap_peers(&self, maps: Vec<(usize, usize)>) -> bool {
        if maps.is_empty() {
            return true;
        }
        self.release_after_copies(maps.len(), || self.unmap_now(maps))
    }

    /// Unmaps peers' memory at once: only inside [`Self::release_after_copies`], once every
    /// copy that used it completed.
    pub(crate) fn unmap_now(&self, maps: Vec<(usize, usize)>) {
        for (va, size) in maps {
            // SAFETY: mappings of `import_memory`, taken out of their tables by the caller
            // (so unmapped once); every copy that used them completed (the caller waited).
            let _ = unsafe { self.rt.unmap_imported(self.dev, va, size) };
        }
    }

    /// Waits until every copy-engine operation enqueued so far has completed: at most
    /// `timeout` (`None`: a stream's default, `UNICOMM_TIMEOUT_MS`); `take` also empties
    /// the list of them.
    fn wait_for_copies(&self, take: bool, timeout: Option<std::time::Duration>) -> Result<()> {
        let (s, _taken) = {
            let mut pending = self
                .core
                .ce_pending
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if pending.is_empty() {
                return Ok(());
            }
            let s = self.rt.create_stream(self.dev)?;
            for (_, e) in pending.iter() {
                self.rt.wait_event(self.dev, &s, e)?;
            }
            // Taken events are kept until the wait below is over.
            let taken = if take {
                std::mem::take(&mut *pending)
            } else {
                Vec::new()
            };
            (s, taken)
        };
        let mut st = crate::memory::ApiStream::from_runtime(self.rt.clone(), s, self.dev)?;
        if let Some(t) = timeout {
            st.timeout = t;
        }
        st.synchronize()
    }

    /// Whether every copy-engine operation enqueued so far has completed, waited for at most
    /// the communicator's deadline (at once where none is pending). The drop asks this
    /// before it finalizes: an operation held by a signal wait (a peer that never signals)
    /// would hold the library's teardown too, which waits for the device.
    pub(crate) fn copies_done_in_time(&self) -> bool {
        self.wait_for_copies(false, Some(self.core.timeout()))
            .is_ok()
    }

    /// Runs `release` once every copy-engine operation so far has completed (within the
    /// deadline); otherwise says what is left (`what` things) and leaves them. Whether it ran.
    pub(crate) fn release_after_copies(&self, what: usize, release: impl FnOnce()) -> bool {
        let idle = self.wait_for_copies(true, None);
        match idle {
            Ok(()) => {
                release();
                true
            }
            Err(e) => {
                eprintln!(
                    "unicomm: rank {}: {what} mapping(s) or block(s) of the copy-engine path left in place: the copies that used them did not finish ({e})",
                    self.rank
                );
                false
            }
        }
    }

    /// A host-side barrier: a one-element all-reduce on a stream of its own, waited for
    /// with the communicator's deadline.
    #[cfg(target_os = "linux")]
    fn host_barrier(&self) -> Result<()> {
        let s = self.rt.create_stream(self.dev)?;
        let st = crate::memory::ApiStream::from_runtime(self.rt.clone(), s, self.dev)?;
        st.watched_by(&self.core);
        self.barrier_on(st.raw())?;
        st.synchronize()
    }

    /// `share_window` for one rank per process: the window swapped with the peers
    /// (`swap_ipc`); it takes the path only where every rank could export and map.
    #[cfg(target_os = "linux")]
    fn share_window_ipc(
        &self,
        job: crate::ipc::Job,
        handle: RawHandle,
        addr: usize,
        bytes: usize,
    ) -> Result<()> {
        let Some((peers, maps)) = self.swap_ipc(job, addr, bytes, true)? else {
            return Ok(());
        };
        self.ce
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(handle, Arc::new(peers));
        self.ce
            .mapped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(handle, maps);
        Ok(())
    }

    /// Device memory swapped between processes (collective): export this rank's allocation
    /// holding `addr..addr+bytes` (unless `offer` is false), swap it with the peers' (a
    /// barrier first, so every rank's listener is bound), map theirs, and agree. Every
    /// rank's (device, address here, bytes) and the mappings made, or `None` where some
    /// rank could not (nothing stays mapped then).
    #[cfg(target_os = "linux")]
    pub(crate) fn swap_ipc(
        &self,
        job: crate::ipc::Job,
        addr: usize,
        bytes: usize,
        offer: bool,
    ) -> Result<Option<Swapped>> {
        use std::os::fd::AsFd;
        let seq = self
            .ce
            .windows
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let listener = crate::ipc::Listener::bind(job, seq, self.rank)?;
        // The range must lie inside the exported allocation (the driver says so; a runtime
        // that said otherwise offers nothing rather than a wrong range).
        let exported = if offer {
            self.rt.export_memory(self.dev, addr).and_then(|x| {
                let inside = addr
                    .checked_sub(x.base)
                    .and_then(|off| off.checked_add(bytes))
                    .is_some_and(|end| end <= x.size);
                if inside {
                    Ok(x)
                } else {
                    Err(Error::invalid(
                        "export",
                        format!(
                            "the range {addr:#x}+{bytes} is not inside the exported allocation {:#x}+{}",
                            x.base, x.size
                        ),
                    ))
                }
            })
        } else {
            Err(Error::invalid("export", "this rank offers nothing"))
        };
        self.host_barrier()?;
        let deadline = Instant::now() + self.core.timeout();
        let mine = exported.as_ref().ok().map(|x| {
            (
                crate::ipc::Offer {
                    size: x.size as u64,
                    offset: (addr - x.base) as u64, // checked above
                    bytes: bytes as u64,
                },
                x.fd.as_fd(),
            )
        });
        // (rank, mapped address, mapped size, offset, bytes) per peer.
        let mut maps: Vec<(usize, usize, usize, usize, usize)> = Vec::new();
        let out = crate::ipc::exchange(&listener, self.world, mine, deadline, |p, o, fd| {
            let (size, offset, b) = (o.size as usize, o.offset as usize, o.bytes as usize);
            if offset.checked_add(b).map_or(true, |end| end > size) {
                return Err(Error::invalid(
                    "copy-engine exchange",
                    format!(
                        "rank {p}'s memory ({offset}+{b}) lies outside its allocation ({size})"
                    ),
                ));
            }
            let va = self.rt.import_memory(self.dev, fd, size)?;
            maps.push((p, va, size, offset, b));
            Ok(())
        });
        let agreed = match out {
            Ok(a) => a,
            Err(e) => {
                self.unmap_peers(maps.iter().map(|m| (m.1, m.2)).collect());
                return Err(e);
            }
        };
        if !agreed {
            // Some rank cannot take the path for this memory: none does.
            if let (true, Err(e)) = (offer, &exported) {
                eprintln!(
                    "unicomm: rank {}: memory not shared for the copy-engine path: {e}",
                    self.rank
                );
            }
            self.unmap_peers(maps.iter().map(|m| (m.1, m.2)).collect());
            return Ok(None);
        }
        let mut peers = vec![(self.dev, addr, bytes); self.world];
        for &(p, va, _, offset, b) in &maps {
            peers[p] = (self.dev, va + offset, b);
        }
        Ok(Some((peers, maps.iter().map(|m| (m.1, m.2)).collect())))
    }

    /// `set_copy_engine`: needs peers' memory within reach (the ranks in this process, a
    /// world from `local_comms`/`init_local`; or, on Linux, ranks joined with `init_rank`,
    /// whose windows are exchanged between the processes), elsewhere `Unsupported`. Windows
    /// registered while it is on are shared with the peers (where every rank can: agreed
    /// per window); only outputs in such windows take the path.
    pub(crate) fn copy_engine_switch(&self, on: bool) -> Result<()> {
        if on && !self.ce.reachable() {
            return Err(Error::unsupported(
                "the copy-engine path",
                "ranks in one process (local_comms / init_local), or joined with init_rank on Linux, where peers' memory is reachable",
                "a communicator joined with init_rank on a system without the memory exchange (Linux only)",
            ));
        }
        self.ce
            .enabled
            .store(on, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// A communicator's copy-engine state.
pub(crate) struct CopyEngine<R: Runtime> {
    /// The in-process world, when the ranks were created together.
    pub(crate) world: Option<Arc<LocalWorld>>,
    /// One rank per process (or thread), joined with a unique id: peers' windows are
    /// exported and mapped (`ipc.rs`).
    #[cfg(target_os = "linux")]
    pub(crate) job: Option<crate::ipc::Job>,
    /// Peers' memory mapped into this process, per window: (address, size).
    pub(crate) mapped: Mutex<HashMap<RawHandle, Vec<(usize, usize)>>>,
    pub(crate) enabled: std::sync::atomic::AtomicBool,
    /// Window registrations so far (the exchange's sequence number).
    pub(crate) windows: std::sync::atomic::AtomicU64,
    /// Every rank's (device, address, bytes) per window handle.
    pub(crate) peers: Mutex<HashMap<RawHandle, Peers>>,
    /// The side stream of the local copies, created at first use.
    pub(crate) side: Mutex<Option<R::Stream>>,
    /// How the ranks wait for each other, agreed at the first shared window.
    pub(crate) sync: std::sync::OnceLock<Sync<R>>,
    /// Operations that took the path.
    pub(crate) calls: std::sync::atomic::AtomicU64,
}

impl<R: Runtime> std::fmt::Debug for CopyEngine<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyEngine")
            .field("local", &self.world.is_some())
            .field("enabled", &self.enabled)
            .finish_non_exhaustive()
    }
}

impl<R: Runtime> CopyEngine<R> {
    /// Whether peers' memory can be reached at all (ranks in this process, or exchanged).
    pub(crate) fn reachable(&self) -> bool {
        #[cfg(target_os = "linux")]
        if self.job.is_some() {
            return true;
        }
        self.world.is_some()
    }
}

impl<R: Runtime> Default for CopyEngine<R> {
    fn default() -> Self {
        CopyEngine {
            world: None,
            #[cfg(target_os = "linux")]
            job: None,
            mapped: Default::default(),
            enabled: Default::default(),
            windows: Default::default(),
            peers: Default::default(),
            side: Mutex::new(None),
            sync: std::sync::OnceLock::new(),
            calls: Default::default(),
        }
    }
}
