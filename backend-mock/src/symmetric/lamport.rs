//! Lamport's all-reduce on the mock, with the GPU kernel's protocol: no barrier; each rank
//! stores its input into its slot of every rank's workspace of this round, behind a header
//! (the call's signature and the round, [`LAMPORT_HEADER`] bytes, its first word stored
//! last); each rank waits for every slot's header, compares it with its own call, and only
//! then reduces the slots' elements, each awaited until it no longer holds the poison. Every
//! call, of count 0 too, exchanges its headers, so the rounds stay in step; a call whose
//! header differs on any rank is `Mismatch` on every rank (every rank reads the same
//! headers), its round ended as any other's. Three workspaces in turn, each cleared a round
//! after it was read.

#![allow(
    unsafe_code,
    reason = "peers' workspaces reached through their mappings' addresses, as a GPU kernel does"
)]

use std::sync::atomic::{AtomicU32, Ordering};

use unicomm_core::symmetric::{
    compare, mismatch, pad_arrival, pad_signature, LAMPORT_HEADER, PAD_EPOCH, PAD_ROUND,
    SIGNATURE_ROUND, SIGNATURE_WORDS,
};
use unicomm_core::{Error, Result};

use super::kernels::{Reduce, Run};

/// The largest value a signature word holds: a word with its top bit set is the poison.
const WORD: u32 = 0x7fff_ffff;

/// Word `i` of the header at `slot`.
fn header_word(slot: usize, i: usize, order: Ordering) -> u32 {
    // SAFETY: `slot` is a Lamport slot of a live mapping (the run's record keeps it), whose
    // first `LAMPORT_HEADER` bytes are the header; 32-byte aligned (slots are laid out in
    // multiples of 32 bytes from 256-byte aligned parts).
    unsafe { (*((slot + 4 * i) as *const AtomicU32)).load(order) }
}

/// Stores `x` as word `i` of the header at `slot`.
fn set_header_word(slot: usize, i: usize, x: u32, order: Ordering) {
    // SAFETY: as `header_word`.
    unsafe { (*((slot + 4 * i) as *const AtomicU32)).store(x, order) }
}

/// Whether the header at `slot` was written (its first word is not the poison).
fn written(slot: usize) -> bool {
    header_word(slot, 0, Ordering::Acquire) >> 31 == 0
}

fn header(slot: usize) -> [u32; SIGNATURE_WORDS] {
    std::array::from_fn(|i| header_word(slot, i, Ordering::Relaxed))
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
    run.rec.lamport?;
    let me = run.ctx.rank;
    let round = run.word(me, PAD_ROUND).load(Ordering::Relaxed);
    let slot = run.rec.lamport_slot(me, (round % 3) as usize, p);
    if !written(slot) {
        return None;
    }
    let theirs = header(slot);
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

/// For a Lamport call (signature `sig`) waiting on rank `p`'s header at `slot`: `Mismatch`
/// where `p` arrived at a barrier this rank never entered and its header is still not
/// there (read in that order: `p` writes its header before any later barrier). `p` then
/// runs a barrier kernel where this rank runs a Lamport call; its signature is the one in
/// its pad for that barrier.
fn in_barrier(run: &Run, sig: &[u32; SIGNATURE_WORDS], p: usize, slot: usize) -> Option<Error> {
    let me = run.ctx.rank;
    let a = run.word(me, pad_arrival(p)).load(Ordering::Acquire);
    let e = run.word(me, PAD_EPOCH).load(Ordering::Relaxed);
    if a.wrapping_sub(e) as i32 <= 0 || written(slot) {
        return None;
    }
    let theirs = run.words(p, pad_signature(a));
    let i = first_difference(sig, &theirs);
    Some(mismatch(me, sig, p, &theirs, i))
}

/// Lamport's one shot: this rank's input stored (negative zeros as positive ones, and only
/// where its type is the workspace's) behind its header into its slot of every rank's
/// workspace of this round; every header awaited and compared; the slots reduced in rank
/// order; the workspace of the round before cleared; the round advanced.
pub(crate) fn lamport(run: &Run, k: &Reduce) -> Result<Vec<u32>> {
    let (me, w, t) = (run.ctx.rank, run.world(), k.ty);
    let round = run.word(me, PAD_ROUND).load(Ordering::Relaxed);
    let b = (round % 3) as usize;
    let mut sig = run.sig;
    sig[SIGNATURE_ROUND] = round & WORD;
    let typed = run.rec.lamport == Some(t.dtype());
    let input = run.rec.bases[me];
    for p in 0..w {
        let slot = run.rec.lamport_slot(p, b, me);
        for i in (0..k.count).filter(|_| typed) {
            // SAFETY: element `i < count` of this rank's data and of slot `me` of rank `p`'s
            // workspace `b` (each slot holds the data's bytes after its header).
            let x = unsafe { t.load(input, i) };
            let x = if x == t.poison() { 0 } else { x };
            // SAFETY: as above, the store into the peer's slot.
            unsafe { t.store(slot + LAMPORT_HEADER, i, x) };
        }
        for (i, &x) in sig.iter().enumerate().skip(1) {
            set_header_word(slot, i, x, Ordering::Relaxed);
        }
        set_header_word(slot, 0, sig[0], Ordering::Release);
    }
    let mut verdict = Ok(());
    for p in 0..w {
        let slot = run.rec.lamport_slot(me, b, p);
        run.wait(
            (p, || format!("a Lamport all-reduce of rank {me} (round {round}): rank {p}'s header never came")),
            || written(slot),
            || in_barrier(run, &sig, p, slot),
        )?;
        if verdict.is_ok() {
            verdict = compare(me, &sig, p, &header(slot));
        }
    }
    if verdict.is_ok() && !typed {
        verdict = Err(Error::invalid(
            "dtype",
            format!(
                "{}: the allocation's Lamport workspace is for {:?} (every rank called it so)",
                t.dtype(),
                run.rec.lamport
            ),
        ));
    }
    let sums = match verdict {
        Ok(()) => reduce_slots(run, k, round, b),
        Err(e) => Err(e),
    };
    let stale = run.rec.lamport_slot(me, (b + 2) % 3, 0);
    for i in 0..w * run.rec.lamport_stride() / t.size() {
        // SAFETY: the whole of this rank's workspace of the round before (`world` slots),
        // which no peer writes until this rank's next round's header (every peer wrote
        // its header of this round, so it is done with the round before).
        unsafe { t.store(stale, i, t.poison()) };
    }
    run.word(me, PAD_ROUND)
        .store(round.wrapping_add(1), Ordering::Relaxed);
    sums
}

/// This rank's slots of workspace `b` reduced in rank order, each element awaited.
fn reduce_slots(run: &Run, k: &Reduce, round: u32, b: usize) -> Result<Vec<u32>> {
    let (me, w, t) = (run.ctx.rank, run.world(), k.ty);
    let mut sums = vec![0u32; k.count];
    for (i, sum) in sums.iter_mut().enumerate() {
        for p in 0..w {
            let slot = run.rec.lamport_slot(me, b, p) + LAMPORT_HEADER;
            // SAFETY: element `i < count` of slot `p` of this rank's own workspace `b`.
            let read = || unsafe { t.load(slot, i) };
            run.wait(
                (p, || format!("a Lamport all-reduce of rank {me} (round {round}): rank {p}'s element {i} never came")),
                || read() != t.poison(),
                || None,
            )?;
            *sum = if p == 0 {
                read()
            } else {
                t.reduce(k.op, *sum, read())
            };
        }
    }
    Ok(sums)
}
