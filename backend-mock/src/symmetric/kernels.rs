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

use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use half::{bf16, f16};
use unicomm_core::symmetric::{
    pad_arrival, pad_signature, SymmetricAlgorithm, PAD_EPOCH, SIGNATURE_WORDS,
};
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

    pub(crate) fn dtype(self) -> DataType {
        match self {
            Ty::F32 => DataType::F32,
            Ty::F16 => DataType::F16,
            Ty::Bf16 => DataType::Bf16,
        }
    }

    pub(crate) fn size(self) -> usize {
        match self {
            Ty::F32 => 4,
            _ => 2,
        }
    }

    /// Negative zero: Lamport's "not written yet".
    pub(crate) fn poison(self) -> u32 {
        match self {
            Ty::F32 => 0x8000_0000,
            _ => 0x8000,
        }
    }

    /// Element `i` at `addr`, as bits.
    ///
    /// # Safety
    /// `addr + (i + 1) * size` lies inside a live mapping, `addr` aligned to the size.
    pub(crate) unsafe fn load(self, addr: usize, i: usize) -> u32 {
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
    pub(crate) unsafe fn store(self, addr: usize, i: usize, b: u32) {
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

    /// `x` rounded once to the type, as bits (a GPU kernel's `__float2bfloat16_rn`).
    pub(crate) fn bits_f32(self, x: f32) -> u32 {
        match self {
            Ty::F32 => x.to_bits(),
            Ty::F16 => u32::from(f16::from_f32(x).to_bits()),
            Ty::Bf16 => u32::from(bf16::from_f32(x).to_bits()),
        }
    }

    /// `acc` and `x` (bits) reduced by `op` in f32 and rounded once to the type, as the GPU
    /// kernels and NCCL's reduce 16-bit types (a sum at each step of the rank order).
    pub(crate) fn reduce(self, op: ReduceOp, acc: u32, x: u32) -> u32 {
        let (a, b) = (self.to_f64(acc) as f32, self.to_f64(x) as f32);
        let r = match op {
            ReduceOp::Max => a.max(b),
            ReduceOp::Min => a.min(b),
            _ => a + b,
        };
        self.bits_f32(r)
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

/// The `u32` word at byte `at` of rank `p`'s pad, as long as `rec` lives.
pub(crate) fn pad_word(rec: &Record, p: usize, at: usize) -> &AtomicU32 {
    // SAFETY: the pad lies inside rank `p`'s mapping, which `rec` keeps (this rank's own
    // through its allocation, dropped after the record's own drop); `at` is one of the
    // pad's documented offsets (4-byte aligned, inside `PAD_BYTES`).
    unsafe { &*((rec.pad(p) + at) as *const AtomicU32) }
}

/// One run of a kernel on one rank: the allocation, the world, until when, and the
/// signature of the call every rank must make alike.
pub(crate) struct Run {
    pub rec: Arc<Record>,
    pub ctx: Arc<RankCtx>,
    pub deadline: Instant,
    pub sig: [u32; SIGNATURE_WORDS],
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
    pub(crate) fn world(&self) -> usize {
        self.rec.bases.len()
    }

    /// Waits on rank `peer` until `ready`, watching the world's poison, the peer's
    /// departure (it released its part: `Mismatch` at once), `diverged` (a peer's call of
    /// another kind: it poisons the world, the ranks' counters being out of step) and the
    /// deadline (then `Timeout` naming `what`, the world poisoned so that the peers end too).
    pub(crate) fn wait(
        &self,
        (peer, what): (usize, impl Fn() -> String),
        ready: impl Fn() -> bool,
        diverged: impl Fn() -> Option<Error>,
    ) -> Result<()> {
        let mut spins = 0u32;
        while !ready() {
            spins += 1;
            if spins.is_multiple_of(64) {
                if let Some(e) = self.ctx.fabric.poisoned() {
                    return Err(e);
                }
                if let Some(e) = diverged() {
                    self.ctx.fabric.poison(e.clone());
                    return Err(e);
                }
                // A call of another kind first: a peer that left after it had arrived there.
                // Its last writes come before its departure word: seen gone, read again.
                if self.rec.gone(peer) && !ready() {
                    return Err(Error::Mismatch {
                        what: "the number of symmetric calls",
                        detail: format!(
                            "rank {peer} released its part of the allocation (freed it, or ended its communicator) without making the call rank {} waits in: {}",
                            self.ctx.rank,
                            what()
                        ),
                    });
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
    pub(crate) fn word(&self, p: usize, at: usize) -> &AtomicU32 {
        pad_word(&self.rec, p, at)
    }

    /// The `SIGNATURE_WORDS` words from byte `at` of rank `p`'s pad.
    pub(crate) fn words(&self, p: usize, at: usize) -> [u32; SIGNATURE_WORDS] {
        std::array::from_fn(|i| self.word(p, at + 4 * i).load(Ordering::Relaxed))
    }

    /// The barrier: this rank's epoch advanced, written into every rank's arrival word for
    /// it, then every rank's word for this epoch awaited. Its epoch.
    pub(crate) fn barrier(&self) -> Result<u32> {
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
                (p, || {
                    format!("a symmetric barrier of rank {me} (epoch {e}): rank {p} never arrived")
                }),
                || word.load(Ordering::Acquire).wrapping_sub(e) as i32 >= 0,
                || super::lamport::in_lamport(self, p, e),
            )?;
        }
        Ok(e)
    }

    /// The call's signature published in this rank's pad, the first barrier, and every
    /// rank's compared: `Mismatch` on every rank where any differs (every rank reads the
    /// same words: each stays in place until its rank's next first barrier, which no rank
    /// passes before every rank read them).
    pub(crate) fn agree(&self) -> Result<()> {
        let me = self.ctx.rank;
        let next = self
            .word(me, PAD_EPOCH)
            .load(Ordering::Relaxed)
            .wrapping_add(1);
        for (i, &w) in self.sig.iter().enumerate() {
            self.word(me, pad_signature(next) + 4 * i)
                .store(w, Ordering::Relaxed);
        }
        let e = self.barrier()?;
        for p in 0..self.world() {
            let theirs = self.words(p, pad_signature(e));
            unicomm_core::symmetric::compare(me, &self.sig, p, &theirs)?;
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
        SymmetricAlgorithm::Lamport => super::lamport::lamport(run, k),
    }
}

/// Every rank's first `count` elements reduced in rank order, read between two barriers.
fn one_shot(run: &Run, k: &Reduce) -> Result<Vec<u32>> {
    run.agree()?;
    let sums = reduce_range(run, k, 0..k.count);
    run.barrier()?;
    Ok(sums)
}

/// Chunk `r` of every rank reduced by rank `r` into its own chunk, a barrier, every chunk
/// read from its rank, a barrier.
fn two_shot(run: &Run, k: &Reduce) -> Result<Vec<u32>> {
    let (me, w) = (run.ctx.rank, run.world());
    run.agree()?;
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
