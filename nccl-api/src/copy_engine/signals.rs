//! How the ranks of the copy-engine path wait for each other without a kernel: stream-ordered
//! signals (`cuStreamWaitValue32` / `hipStreamWaitValue32` on flags that the peers' copy
//! engines write), in place of a one-element NCCL all-reduce before and after the copies.
//!
//! Why: the all-reduce is a kernel, and beside an SM-bound kernel it waits for SMs, so the
//! "no SMs" path was not (measured on 2x H200: the copy-engine all_to_all at 159 GB/s beside
//! a compute kernel against 197 GB/s for NCCL's, `unicomm-bench`). Stream memory
//! operations run on the GPU's front end, copies on its copy engines: no SM is involved.
//! NCCL 2.28's own copy-engine collectives order themselves the same way (`src/ce_coll.cc`):
//! flags in symmetric memory, written by peers with copies, awaited with stream waits.
//!
//! The protocol. Each rank owns a block of device memory: `ready[world]`, `done[world]` and
//! a word holding 1. One operation is two phases, each on the caller's stream:
//! - signal: write 1 into `phase[me]` of every peer's block, after everything before it on
//!   the stream has completed: a stream write (`cuStreamWriteValue32` with its memory
//!   barrier) where the runtime can write into a peer's memory (`Runtime::signal_by_write`:
//!   CUDA), else a 4-byte copy-engine copy of the constant (HIP, or `UNICOMM_CE_SIGNAL=copy`;
//!   NCCL's `ce_coll.cc` copies); on one H200 the writes cost half as much;
//! - wait: for every peer `p`, wait until `phase[p]` of this rank's block is 1, then write 0
//!   back (re-arm).
//!
//! `ready` (before the copies) says "my output is free", `done` (after them) "my copies into
//! you have landed". The re-arm cannot race with the next signal into the same word: a peer
//! writes `ready[p]` again only after its `done` wait, which needs this rank's `done`
//! signal, which this stream issues after the re-arm (and likewise for `done`). So one value,
//! 1, serves every operation, and a CUDA graph that captured the operations replays them
//! unchanged (NCCL's graph mode uses the same constant-and-reset scheme).
//!
//! The ranks agree on the mechanism once per communicator, at the first window shared for
//! the path (a collective call): every rank must offer a block (the runtime has the calls,
//! the block was allocated, exported where ranks are processes, and a probe wait on it
//! completed), else every rank uses the NCCL barriers. `UNICOMM_CE_SYNC=barrier` chooses the
//! barriers on purpose (one rank asking is enough).
//!
//! After a failure. A stream wait is not a kernel, so `ncclCommAbort` does not end it; the
//! abort releases this rank's waits itself (`SignalRelease`, an abort hook): it writes 1 into all
//! of this rank's flags from a stream of its own, again and again (each wait it releases
//! re-arms its word, and the next operation's wait may be on it), until every copy-engine
//! operation enqueued before the abort has completed, or a deadline passes. The streams then
//! drain as they do after an abort of NCCL's kernels: the work after the collective runs on
//! undefined data, and the caller's wait reports `Aborted` or `Timeout`. Operations
//! enqueued after the abort are refused (`Aborted`), so nothing is left waiting; a graph
//! captured earlier and launched after the abort is the caller's.

#![allow(
    unsafe_code,
    reason = "calls the NCCL-API library or the device runtime at its call sites (the architecture test's UNSAFE_FILES lists them)"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use unicomm_core::{env, Result};

use super::pending::Pending;
use crate::libcomm::AbortHook;
use crate::memory::ApiMemory;
use crate::sys::runtime::Runtime;
use crate::wait::Backoff;

/// How the copy-engine path orders the ranks of one communicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyEngineSync {
    /// Stream-ordered flags written by the copy engines (no kernel, no SM).
    Signals,
    /// A one-element all-reduce before and after the copies (a library kernel).
    Barrier,
    /// A world of one rank: nothing to wait for.
    Alone,
}

impl CopyEngineSync {
    /// The name `UNICOMM_CE_SYNC` and the benchmark use.
    pub fn name(self) -> &'static str {
        match self {
            CopyEngineSync::Signals => "signals",
            CopyEngineSync::Barrier => "barrier",
            CopyEngineSync::Alone => "alone",
        }
    }
}

/// `UNICOMM_CE_SYNC`: `signals` (the default) or `barrier`.
pub fn wanted() -> Result<CopyEngineSync> {
    use CopyEngineSync::*;
    env::choice(
        "UNICOMM_CE_SYNC",
        Signals,
        &[("signals", Signals), ("barrier", Barrier)],
    )
}

/// `UNICOMM_CE_SIGNAL`: how a rank signals a peer where the runtime can do both: `write`
/// (the default: a stream write into the peer's flag) or `copy` (a 4-byte copy-engine copy
/// of the constant, what NCCL's `ce_coll.cc` does). `Ok(true)` for writes.
pub(crate) fn by_write_wanted() -> Result<bool> {
    env::choice(
        "UNICOMM_CE_SIGNAL",
        true,
        &[("write", true), ("copy", false)],
    )
}

/// The two phases of one operation.
#[derive(Debug, Clone, Copy)]
pub enum Phase {
    /// Before the copies: every peer's output is free.
    Ready = 0,
    /// After the copies: every copy into this rank's output has landed.
    Done = 1,
}

/// Bytes of one rank's block: `ready[world]`, `done[world]`, the constant 1.
pub fn block_bytes(world: usize) -> usize {
    4 * (2 * world + 1)
}

/// A block's initial contents: every flag 0, the constant 1 in its last word.
pub fn block_image(world: usize) -> Vec<u8> {
    let bytes = block_bytes(world);
    let mut init = vec![0u8; bytes];
    init[bytes - 4..].copy_from_slice(&1u32.to_ne_bytes());
    init
}

pub(crate) fn slot(base: usize, world: usize, phase: Phase, rank: usize) -> usize {
    base + 4 * (phase as usize * world + rank)
}

fn one(base: usize, world: usize) -> usize {
    base + 8 * world
}

/// Peers' memory mapped into this process: (address, size) each.
pub type Mappings = Vec<(usize, usize)>;

/// The agreed mechanism of a communicator, fixed at the first shared window.
pub(crate) enum Phases<R: Runtime> {
    Barrier,
    Alone,
    Signals(Signals<R>),
}

impl<R: Runtime> Phases<R> {
    pub(crate) fn kind(&self) -> CopyEngineSync {
        match self {
            Phases::Barrier => CopyEngineSync::Barrier,
            Phases::Alone => CopyEngineSync::Alone,
            Phases::Signals(_) => CopyEngineSync::Signals,
        }
    }
}

/// This rank's signal block and every rank's, as this rank addresses them.
pub struct Signals<R: Runtime> {
    /// This rank's block; `None` once given up (leaked because work may still use it).
    pub block: Option<ApiMemory<R>>,
    /// Each rank's block base here (this rank's own at its index).
    pub bases: Vec<usize>,
    /// Peers' blocks mapped into this process (one rank per process): (address, size).
    pub mapped: Mappings,
    /// Signal a peer with a stream write into its flag (`Runtime::write_value32`) instead
    /// of a 4-byte copy of the constant (`Runtime::signal_by_write`).
    pub by_write: bool,
}

impl<R: Runtime> Signals<R> {
    /// One phase on `s`: signal every peer, then wait for every peer and re-arm.
    pub fn phase(
        &self,
        rt: &R,
        dev: usize,
        rank: usize,
        phase: Phase,
        s: &R::Stream,
    ) -> Result<()> {
        let world = self.bases.len();
        let mine = self.bases[rank];
        for k in 1..world {
            // Peers in a rotating order, as the data copies.
            let p = (rank + k) % world;
            let dst = slot(self.bases[p], world, phase, rank);
            // SAFETY: `dst` is this rank's word in peer `p`'s block (peer access or a
            // mapping made at the agreement), the copy's source this rank's constant word;
            // both blocks live until this communicator is dropped, which waits for this
            // stream's work (`Pending`) before freeing or unmapping them. A write
            // has the default memory barrier: the work before it is visible to the peer
            // first.
            unsafe {
                if self.by_write {
                    rt.write_value32(dev, dst, 1, s)
                } else {
                    rt.copy_async(dev, dst, one(mine, world), 4, s)
                }
            }?;
        }
        for k in 1..world {
            let p = (rank + world - k) % world;
            let w = slot(mine, world, phase, p);
            // SAFETY: a word of this rank's own block (aligned: the block is a device
            // allocation and every word is at a multiple of 4), alive as above.
            unsafe { rt.wait_value32(dev, w, 1, s) }?;
            // SAFETY: the same word.
            unsafe { rt.write_value32(dev, w, 0, s) }?;
        }
        Ok(())
    }
}

/// How long an abort spends releasing its rank's signal waits at most (less where the
/// communicator's deadline is shorter).
const RELEASE_DEADLINE: Duration = Duration::from_secs(10);

/// Releases the signal waits of `rank` (whose block is at `base`): writes 1 into each of its
/// flags on a stream of its own, round after round (each once the last is done), until
/// `drained` says the streams that waited are done (`true`) or `within` has passed
/// (`false`). The flags are left at 1.
///
/// # Safety
/// `base` is the block of `rank` in a world of `world` ranks (`block_bytes(world)` bytes of
/// device memory of `dev`), alive until the writes have completed: the caller keeps it
/// until every stream that used it is idle, or leaks it.
pub unsafe fn release<R: Runtime>(
    rt: &R,
    dev: usize,
    base: usize,
    world: usize,
    rank: usize,
    within: Duration,
    mut drained: impl FnMut() -> Result<bool>,
) -> Result<bool> {
    let s = rt.create_stream(dev)?;
    let end = Instant::now() + within;
    let mut backoff = Backoff::new();
    loop {
        // A new round only once the last one was written: on a device that does not move,
        // the stream never fills up (a full stream would block this thread).
        if rt.query(&s)? {
            for p in (0..world).filter(|&p| p != rank) {
                for ph in [Phase::Ready, Phase::Done] {
                    // SAFETY: a word of the block (the caller's contract), aligned as in
                    // `Signals::phase`; nothing reads it but as a flag.
                    unsafe { rt.write_value32(dev, slot(base, world, ph, p), 1, &s) }?;
                }
            }
        }
        if drained()? {
            return Ok(true);
        }
        if Instant::now() >= end {
            return Ok(false);
        }
        backoff.pause();
    }
}

/// What an abort of a communicator with signals releases ([`AbortHook`]): this rank's
/// signal waits, until every copy-engine operation enqueued before the abort has completed
/// (`release`). What it cannot release it reports on stderr, and the communicator's drop
/// then leaks the block rather than free it under a waiting stream.
pub(crate) struct SignalRelease<R: Runtime> {
    pub(crate) rt: Arc<R>,
    pub(crate) dev: usize,
    pub(crate) rank: usize,
    /// This rank's block: (base address, world).
    pub(crate) block: (usize, usize),
    pub(crate) pending: Arc<Pending<R>>,
}

impl<R: Runtime> AbortHook for SignalRelease<R> {
    fn release(&self, within: Duration, report: bool) -> bool {
        let within = within.min(RELEASE_DEADLINE);
        let (base, world) = self.block;
        // What has to complete: every stream's last operation, seen under the lock that
        // enqueuing holds (the state says aborted already, so no operation starts now).
        // Taken without blocking, between rounds of writes: an enqueue holding it may
        // itself be held up by a full stream, which the writes drain.
        let mut check: Option<R::Stream> = None;
        let mut drained = || -> Result<bool> {
            if check.is_none() {
                let Some(list) = self.pending.try_lock() else {
                    return Ok(false);
                };
                check = Some(self.pending.waiter(&list)?);
            }
            match &check {
                Some(s) => self.rt.query(s),
                None => Ok(false),
            }
        };
        // SAFETY: this rank's own block (set at the agreement); the communicator frees it
        // only after this returns and its pending copies completed, else leaks it.
        let r = unsafe {
            release(
                &*self.rt,
                self.dev,
                base,
                world,
                self.rank,
                within,
                &mut drained,
            )
        };
        match r {
            Ok(true) => return true,
            _ if !report => {}
            Ok(false) => tracing::warn!(
                "unicomm: rank {}: copy-engine operations still waiting {within:?} after their signals were released (the device is stuck, or a graph launched them)",
                self.rank
            ),
            Err(e) => tracing::warn!(
                "unicomm: rank {}: the copy-engine signal waits could not be released: {e}",
                self.rank
            ),
        }
        false
    }
}
