//! The protocols of the barrier kernels on the mock, over the memory accesses of
//! [`kernels`](super::kernels): the signature agreed after the first barrier, the one-shot
//! and two-shot all-reduces, and how a wait tells a peer that runs a call of another kind
//! (a Lamport call against a barrier kernel) from one that is only late.

use std::sync::atomic::Ordering;

use unicomm_core::symmetric::{
    mismatch, pad_arrival, pad_signature, SymmetricAlgorithm, PAD_EPOCH, PAD_ROUND,
    SIGNATURE_ROUND, SIGNATURE_WORDS,
};
use unicomm_core::{Error, ReduceOp, Result};

use super::grid::Grid;
use super::kernels::{Local, Run, Slot, Ty, WORD};

/// A barrier of this run, watching for a peer's Lamport call of this rank's next round.
pub(crate) fn barrier(run: &Run) -> Result<u32> {
    run.barrier(|p, e| in_lamport(run, p, e))
}

/// The call's signature published in this rank's pad, the first barrier, and every
/// rank's compared: `Mismatch` on every rank where any differs (every rank reads the
/// same words: each stays in place until its rank's next first barrier, which no rank
/// passes before every rank read them).
pub(crate) fn agree(run: &Run) -> Result<()> {
    let me = run.ctx.rank;
    let next = run
        .word(me, PAD_EPOCH)
        .load(Ordering::Relaxed)
        .wrapping_add(1);
    for (i, &w) in run.sig.iter().enumerate() {
        run.word(me, pad_signature(next) + 4 * i)
            .store(w, Ordering::Relaxed);
    }
    let e = barrier(run)?;
    for p in run.peers() {
        let theirs = run.words(p, pad_signature(e));
        unicomm_core::symmetric::compare(me, &run.sig, p, &theirs)?;
    }
    Ok(())
}

/// The first word where `a` and `b` differ (0 where none does).
fn first_difference(a: &[u32; SIGNATURE_WORDS], b: &[u32; SIGNATURE_WORDS]) -> usize {
    (0..SIGNATURE_WORDS).find(|&i| a[i] != b[i]).unwrap_or(0)
}

/// For a barrier of epoch `e` waiting on rank `p`: `Mismatch` where `p`'s Lamport header of
/// this rank's next round is in this rank's workspace while `p` never arrived at `e` (read
/// in that order: `p` arrives before any later call, so a header seen first makes an
/// arrival made before it visible). `p` then runs a Lamport call where this rank runs a
/// barrier kernel.
pub(crate) fn in_lamport(run: &Run, p: usize, e: u32) -> Option<Error> {
    let me = run.ctx.rank;
    let round = run.word(me, PAD_ROUND).load(Ordering::Relaxed);
    let slot = run.rec.slot(me, (round % 3) as usize, p).ok()?;
    if !slot.written() {
        return None;
    }
    let theirs = slot.header();
    let arrived = run
        .word(me, pad_arrival(p))
        .load(Ordering::Acquire)
        .wrapping_sub(e) as i32
        >= 0;
    if theirs[SIGNATURE_ROUND] != round & WORD || arrived {
        return None;
    }
    let i = first_difference(&run.sig, &theirs);
    Some(mismatch(me, &run.sig, p, &theirs, i))
}

/// For a Lamport call (signature `sig`) waiting on rank `p`'s header in `slot`: `Mismatch`
/// where `p` arrived at a barrier this rank never entered and its header is still not
/// there (read in that order: `p` writes its header before any later barrier). `p` then
/// runs a barrier kernel where this rank runs a Lamport call; its signature is the one in
/// its pad for that barrier.
pub(crate) fn in_barrier(
    run: &Run,
    sig: &[u32; SIGNATURE_WORDS],
    p: usize,
    slot: Slot<'_>,
) -> Option<Error> {
    let me = run.ctx.rank;
    let a = run.word(me, pad_arrival(p)).load(Ordering::Acquire);
    let e = run.word(me, PAD_EPOCH).load(Ordering::Relaxed);
    if a.wrapping_sub(e) as i32 <= 0 || slot.written() {
        return None;
    }
    let theirs = run.words(p, pad_signature(a));
    let i = first_difference(sig, &theirs);
    Some(mismatch(me, sig, p, &theirs, i))
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
    /// The FP8 output and its scale (one f32), if asked for.
    pub fp8: Option<(Local, Local)>,
}

/// Every rank's first `count` elements reduced in rank order, read between two barriers
/// (block 0's, then the grid's other blocks').
pub(crate) fn one_shot(run: &Run, k: &Reduce, grid: &Grid) -> Result<Vec<u32>> {
    agree(run)?;
    grid.meet(run, 1)?;
    let sums = reduce_range(run, k, 0..k.count)?;
    barrier(run)?;
    grid.meet(run, 2)?;
    Ok(sums)
}

/// Chunk `r` of every rank reduced by rank `r` into its own chunk, a barrier, every chunk
/// read from its rank, a barrier.
pub(crate) fn two_shot(run: &Run, k: &Reduce, grid: &Grid) -> Result<Vec<u32>> {
    let (me, w) = (run.ctx.rank, run.world());
    agree(run)?;
    grid.meet(run, 1)?;
    let chunk = |r: usize| (k.count * r / w)..(k.count * (r + 1) / w);
    let mine = chunk(me);
    let part = reduce_range(run, k, mine.clone());
    for (i, b) in mine.zip(part?) {
        // Only this rank writes its chunk in this phase.
        run.rec.set_own(k.ty, i, b)?;
    }
    barrier(run)?;
    grid.meet(run, 2)?;
    let mut sums = vec![0u32; k.count];
    for r in 0..w {
        for i in chunk(r) {
            // Written by rank `r` before the barrier.
            sums[i] = run.rec.data(k.ty, r, i)?;
        }
    }
    barrier(run)?;
    grid.meet(run, 3)?;
    Ok(sums)
}

/// Elements `range` of every rank's data reduced in rank order.
fn reduce_range(run: &Run, k: &Reduce, range: std::ops::Range<usize>) -> Result<Vec<u32>> {
    range
        .map(|i| {
            let mut acc = run.rec.data(k.ty, 0, i)?;
            for r in 1..run.world() {
                acc = k.ty.reduce(k.op, acc, run.rec.data(k.ty, r, i)?);
            }
            Ok(acc)
        })
        .collect()
}
