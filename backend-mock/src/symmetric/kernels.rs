//! unicomm's symmetric kernels, run by the mock's stream worker over the ranks' mappings
//! with the protocols of the GPU kernels: a barrier on the signal pads (every rank's epoch
//! word, each peer's arrival word, compared as wrapping `u32`s), the all-reduces of one
//! shot, two shots and Lamport's poison (three workspaces in turn, each cleared a round
//! after it was read), and the fused residual add and RMSNorm. Every element and pad word is
//! read and written atomically (peers' threads and processes share them); every wait on a
//! peer also watches the world's poison (an abort) and the deadline.

#![allow(
    unsafe_code,
    reason = "peers' memory reached through its mapping's addresses, as a GPU kernel does"
)]

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use half::{bf16, f16};
use unicomm_core::symmetric::{pad_arrival, SymmetricAlgorithm, PAD_COUNT, PAD_EPOCH, PAD_ROUND};
use unicomm_core::{DataType, Error, ReduceOp, Result};

use super::table::Record;
use crate::exec::RankCtx;
use crate::memory::{HostAlloc, MockMemory};

/// An element type of the kernels, read and written as its bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ty {
    F32,
    F16,
    Bf16,
}

impl Ty {
    pub(crate) fn of(d: DataType) -> Result<Ty> {
        match d {
            DataType::F32 => Ok(Ty::F32),
            DataType::F16 => Ok(Ty::F16),
            DataType::Bf16 => Ok(Ty::Bf16),
            other => Err(Error::invalid(
                "dtype",
                format!("{other}: not a symmetric kernel's"),
            )),
        }
    }

    pub(crate) fn size(self) -> usize {
        match self {
            Ty::F32 => 4,
            _ => 2,
        }
    }

    /// Negative zero: Lamport's "not written yet".
    fn poison(self) -> u32 {
        match self {
            Ty::F32 => 0x8000_0000,
            _ => 0x8000,
        }
    }

    /// Element `i` at `addr`, as bits.
    ///
    /// # Safety
    /// `addr + (i + 1) * size` lies inside a live mapping, `addr` aligned to the size.
    unsafe fn load(self, addr: usize, i: usize) -> u32 {
        // SAFETY: the caller's: inside a live mapping, aligned; atomics (peers share it).
        unsafe {
            match self {
                Ty::F32 => (*(addr as *const AtomicU32).add(i)).load(Ordering::Relaxed),
                _ => u32::from((*(addr as *const AtomicU16).add(i)).load(Ordering::Relaxed)),
            }
        }
    }

    /// Stores bits `b` as element `i` at `addr`.
    ///
    /// # Safety
    /// As [`Ty::load`].
    unsafe fn store(self, addr: usize, i: usize, b: u32) {
        // SAFETY: as `load`.
        unsafe {
            match self {
                Ty::F32 => (*(addr as *const AtomicU32).add(i)).store(b, Ordering::Relaxed),
                _ => (*(addr as *const AtomicU16).add(i)).store(b as u16, Ordering::Relaxed),
            }
        }
    }

    pub(crate) fn to_f64(self, b: u32) -> f64 {
        match self {
            Ty::F32 => f64::from(f32::from_bits(b)),
            Ty::F16 => f16::from_bits(b as u16).to_f64(),
            Ty::Bf16 => bf16::from_bits(b as u16).to_f64(),
        }
    }

    /// `x` rounded to the type, as bits.
    pub(crate) fn bits(self, x: f64) -> u32 {
        match self {
            Ty::F32 => (x as f32).to_bits(),
            Ty::F16 => u32::from(f16::from_f64(x).to_bits()),
            Ty::Bf16 => u32::from(bf16::from_f64(x).to_bits()),
        }
    }

    /// `acc` and `x` (bits) reduced by `op`, rounded to the type at each step as the
    /// mock's library path rounds them (for two ranks, one rounding of the exact result).
    pub(crate) fn reduce(self, op: ReduceOp, acc: u32, x: u32) -> u32 {
        let (a, b) = (self.to_f64(acc), self.to_f64(x));
        let r = match op {
            ReduceOp::Max => a.max(b),
            ReduceOp::Min => a.min(b),
            _ if self == Ty::F32 => f64::from(f32::from_bits(acc) + f32::from_bits(x)),
            _ => a + b,
        };
        self.bits(r)
    }
}

/// Fills `bytes` bytes of `mem` from `offset` with the poison of `dtype` (the Lamport
/// workspaces, at allocation, before any peer can write them).
pub(crate) fn poison(
    mem: &MockMemory,
    offset: usize,
    bytes: usize,
    dtype: DataType,
    timeout: Duration,
) -> Result<()> {
    let t = Ty::of(dtype)?;
    let _g = mem.inner.write_lock(timeout)?;
    let base = mem.inner.addr() + offset;
    for i in 0..bytes / t.size() {
        // SAFETY: inside the allocation just made (`offset + bytes` is its size), aligned
        // (256-byte parts), write-locked.
        unsafe { t.store(base, i, t.poison()) };
    }
    Ok(())
}

/// One run of a kernel on one rank: the allocation, the world, until when.
pub(crate) struct Run {
    pub rec: Arc<Record>,
    pub ctx: Arc<RankCtx>,
    pub deadline: Instant,
}

/// A range of this rank's memory a kernel writes or reads (its allocation kept alive).
#[derive(Clone)]
pub(crate) struct Local {
    pub alloc: Arc<HostAlloc>,
    pub offset: usize,
}

impl Local {
    fn addr(&self) -> usize {
        self.alloc.addr() + self.offset
    }
}

impl Run {
    fn world(&self) -> usize {
        self.rec.bases.len()
    }

    /// Waits until `ready`, watching the world's poison and the deadline (then `Timeout`
    /// naming `what`, the world poisoned so that the peers end too).
    fn wait(&self, what: impl Fn() -> String, ready: impl Fn() -> bool) -> Result<()> {
        let mut spins = 0u32;
        while !ready() {
            spins += 1;
            if spins.is_multiple_of(64) {
                if let Some(e) = self.ctx.fabric.poisoned() {
                    return Err(e);
                }
                if Instant::now() >= self.deadline {
                    let e = Error::Timeout {
                        what: what(),
                        after: self.ctx.timeout,
                    };
                    self.ctx.fabric.poison(e.clone());
                    return Err(e);
                }
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    /// The `u32` word at byte `at` of rank `p`'s pad.
    fn word(&self, p: usize, at: usize) -> &AtomicU32 {
        // SAFETY: the pad lies inside rank `p`'s mapping, which `rec` keeps; `at` is one of
        // the pad's documented offsets (4-byte aligned, inside `PAD_BYTES`).
        unsafe { &*((self.rec.pad(p) + at) as *const AtomicU32) }
    }

    /// The barrier: this rank's epoch advanced, written into every rank's arrival word for
    /// it, then every rank's word for this epoch awaited.
    pub(crate) fn barrier(&self) -> Result<()> {
        let (me, w) = (self.ctx.rank, self.world());
        let e = self
            .word(me, PAD_EPOCH)
            .load(Ordering::Relaxed)
            .wrapping_add(1);
        self.word(me, PAD_EPOCH).store(e, Ordering::Relaxed);
        for p in 0..w {
            self.word(p, pad_arrival(me)).store(e, Ordering::Release);
        }
        for p in 0..w {
            let word = self.word(me, pad_arrival(p));
            self.wait(
                || format!("a symmetric barrier of rank {me} (epoch {e}): rank {p} never arrived"),
                || word.load(Ordering::Acquire).wrapping_sub(e) as i32 >= 0,
            )?;
        }
        Ok(())
    }

    /// Publishes `count` in this rank's pad, meets the peers, and compares theirs.
    fn agree_count(&self, count: usize) -> Result<()> {
        let me = self.ctx.rank;
        let slot = |p: usize| {
            // SAFETY: the pad's count word, 8-byte aligned inside the pad of a live mapping.
            unsafe { &*((self.rec.pad(p) + PAD_COUNT) as *const AtomicU64) }
        };
        slot(me).store(count as u64, Ordering::Relaxed);
        self.barrier()?;
        for p in 0..self.world() {
            let theirs = slot(p).load(Ordering::Relaxed);
            if theirs != count as u64 {
                return Err(Error::Mismatch {
                    what: "count",
                    detail: format!(
                        "a symmetric all-reduce of {count} elements on rank {me}, {theirs} on rank {p}"
                    ),
                });
            }
        }
        Ok(())
    }
}

/// What an all-reduce kernel computes.
pub(crate) struct Reduce {
    pub count: usize,
    pub ty: Ty,
    pub op: ReduceOp,
    pub algorithm: SymmetricAlgorithm,
    pub out: Local,
    pub norm: Option<Norm>,
}

/// The fused residual add and RMSNorm.
pub(crate) struct Norm {
    pub residual: Local,
    pub weight: Local,
    pub hidden: usize,
    pub eps: f32,
}

/// One all-reduce on this rank: its result, as bits (written, or normed, by the caller).
pub(crate) fn sums(run: &Run, k: &Reduce) -> Result<Vec<u32>> {
    match k.algorithm {
        SymmetricAlgorithm::OneShot => one_shot(run, k),
        SymmetricAlgorithm::TwoShot => two_shot(run, k),
        SymmetricAlgorithm::Lamport => lamport(run, k),
    }
}

/// Every rank's first `count` elements reduced in rank order, read between two barriers.
fn one_shot(run: &Run, k: &Reduce) -> Result<Vec<u32>> {
    run.agree_count(k.count)?;
    let sums = reduce_range(run, k, 0..k.count);
    run.barrier()?;
    Ok(sums)
}

/// Chunk `r` of every rank reduced by rank `r` into its own chunk, a barrier, every chunk
/// read from its rank, a barrier.
fn two_shot(run: &Run, k: &Reduce) -> Result<Vec<u32>> {
    let (me, w) = (run.ctx.rank, run.world());
    run.agree_count(k.count)?;
    let chunk = |r: usize| (k.count * r / w)..(k.count * (r + 1) / w);
    let mine = chunk(me);
    let part = reduce_range(run, k, mine.clone());
    for (i, b) in mine.zip(part) {
        // SAFETY: element `i < count` of this rank's data (count checked against the
        // allocation at enqueue); only this rank writes its chunk in this phase.
        unsafe { k.ty.store(run.rec.bases[me], i, b) };
    }
    run.barrier()?;
    let mut sums = vec![0u32; k.count];
    for r in 0..w {
        for i in chunk(r) {
            // SAFETY: element `i < count` of rank `r`'s data, written before the barrier.
            sums[i] = unsafe { k.ty.load(run.rec.bases[r], i) };
        }
    }
    run.barrier()?;
    Ok(sums)
}

/// Elements `range` of every rank's data reduced in rank order.
fn reduce_range(run: &Run, k: &Reduce, range: std::ops::Range<usize>) -> Vec<u32> {
    range
        .map(|i| {
            // SAFETY: element `i < count` of a rank's data (count checked against the
            // allocation at enqueue), inside its mapping, which the record keeps.
            let load = |b: usize| unsafe { k.ty.load(b, i) };
            let mut ranks = run.rec.bases.iter();
            let first = ranks.next().map_or(0, |&b| load(b));
            ranks.fold(first, |acc, &b| k.ty.reduce(k.op, acc, load(b)))
        })
        .collect()
}

/// Lamport's one shot: this rank's input stored (negative zeros as positive ones) into
/// its slot of every rank's workspace of this round, its own slots awaited until none
/// holds the poison and reduced in rank order, the workspace of the round before cleared.
fn lamport(run: &Run, k: &Reduce) -> Result<Vec<u32>> {
    let (me, w, t) = (run.ctx.rank, run.world(), k.ty);
    let round = run.word(me, PAD_ROUND).load(Ordering::Relaxed);
    let b = (round % 3) as usize;
    let input = run.rec.bases[me];
    for p in 0..w {
        let slot = run.rec.lamport_slot(p, b, me);
        for i in 0..k.count {
            // SAFETY: element `i < count` of this rank's data and of slot `me` of rank `p`'s
            // workspace `b` (each slot holds the data's bytes).
            let x = unsafe { t.load(input, i) };
            let x = if x == t.poison() { 0 } else { x };
            // SAFETY: as above, the store into the peer's slot.
            unsafe { t.store(slot, i, x) };
        }
    }
    let mut sums = vec![0u32; k.count];
    for (i, sum) in sums.iter_mut().enumerate() {
        for p in 0..w {
            let slot = run.rec.lamport_slot(me, b, p);
            // SAFETY: element `i` of slot `p` of this rank's own workspace `b`.
            let read = || unsafe { t.load(slot, i) };
            run.wait(
                || format!("a Lamport all-reduce of rank {me} (round {round}): rank {p}'s element {i} never came"),
                || read() != t.poison(),
            )?;
            *sum = if p == 0 {
                read()
            } else {
                t.reduce(k.op, *sum, read())
            };
        }
    }
    let stale = run.rec.lamport_slot(me, (b + 2) % 3, 0);
    for i in 0..w * run.rec.bytes / t.size() {
        // SAFETY: the whole of this rank's workspace of the round before (`world` slots of
        // the data's bytes), which no peer writes until this rank's next round's stores.
        unsafe { t.store(stale, i, t.poison()) };
    }
    run.word(me, PAD_ROUND)
        .store(round.wrapping_add(1), Ordering::Relaxed);
    Ok(sums)
}

/// `bits` written to `out` under its allocation's write lock.
pub(crate) fn write(out: &Local, ty: Ty, bits: &[u32], timeout: Duration) -> Result<()> {
    let _g = out.alloc.write_lock(timeout)?;
    for (i, &b) in bits.iter().enumerate() {
        // SAFETY: `out` holds `count` elements (checked at enqueue) and is write-locked.
        unsafe { ty.store(out.addr(), i, b) };
    }
    Ok(())
}

/// Element `i` of `l`, as bits (its allocation read-locked by the caller).
pub(crate) fn read(l: &Local, ty: Ty, i: usize) -> u32 {
    // SAFETY: the caller checked `i` against the range at enqueue and holds its lock.
    unsafe { ty.load(l.addr(), i) }
}

/// `b` written as element `i` of `l` (its allocation write-locked by the caller).
pub(crate) fn put(l: &Local, ty: Ty, i: usize, b: u32) {
    // SAFETY: as `read`.
    unsafe { ty.store(l.addr(), i, b) }
}
