//! Lamport's all-reduce on the mock, with the GPU kernel's protocol: no barrier; each rank
//! stores its input into its slot of every peer's workspace of this round (its own part it
//! reads from its input: nothing of a rank's goes through its own workspace), behind a header
//! (the call's signature and the round, [`unicomm_core::symmetric::LAMPORT_HEADER`] bytes, its first word stored
//! last); each rank waits for every slot's header, compares it with its own call, and only
//! then reduces the slots' elements, each awaited until it no longer holds the poison. Every
//! call, of count 0 too, exchanges its headers, so the rounds stay in step; a call whose
//! header differs on any rank is `Mismatch` on every rank (every rank reads the same
//! headers), its round ended as any other's. Three workspaces in turn, each cleared a round
//! after it was read.

use std::sync::atomic::Ordering;

use unicomm_core::symmetric::{compare, PAD_ROUND, SIGNATURE_ROUND};
use unicomm_core::{Error, Result};

use super::kernels::{Run, WORD};
use super::protocol::{in_barrier, Reduce};

/// Lamport's one shot: this rank's input stored (negative zeros as positive ones, and only
/// where its type is the workspace's) behind its header into its slot of every peer's
/// workspace of this round; every peer's header awaited and compared; the slots reduced in rank
/// order; the workspace of the round before cleared; the round advanced.
pub(crate) fn lamport(run: &Run, k: &Reduce) -> Result<Vec<u32>> {
    let (me, t) = (run.ctx.rank, k.ty);
    let round = run.word(me, PAD_ROUND).load(Ordering::Relaxed);
    let b = (round % 3) as usize;
    let mut sig = run.sig;
    sig[SIGNATURE_ROUND] = round & WORD;
    let typed = run.rec.lamport == Some(t.dtype());
    for p in run.peers() {
        let slot = run.rec.slot(p, b, me)?;
        for i in (0..k.count).filter(|_| typed) {
            slot.store(t, i, own(run, t, i)?)?;
        }
        slot.set_header(&sig);
    }
    let mut verdict = Ok(());
    for p in run.peers() {
        let slot = run.rec.slot(me, b, p)?;
        run.wait(
            p, || format!("a Lamport all-reduce of rank {me} (round {round}): rank {p}'s header never came"),
            || slot.written(),
            || in_barrier(run, &sig, p, slot),
        )?;
        if verdict.is_ok() {
            verdict = compare(me, &sig, p, &slot.header());
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
    // The whole of this rank's workspace of the round before, which no peer writes until
    // this rank's next round's header (every peer wrote its header of this round, so it is
    // done with the round before).
    run.rec.clear_workspace(t, me, (b + 2) % 3)?;
    run.word(me, PAD_ROUND)
        .store(round.wrapping_add(1), Ordering::Relaxed);
    sums
}

/// Element i of this rank's input as Lamport sends it (the poison, a negative zero, as +0).
fn own(run: &Run, t: super::kernels::Ty, i: usize) -> Result<u32> {
    let x = run.rec.data(t, run.ctx.rank, i)?;
    Ok(if x == t.poison() { 0 } else { x })
}

/// This rank's slots of workspace `b` reduced in rank order (its own part from its input),
/// each element awaited.
fn reduce_slots(run: &Run, k: &Reduce, round: u32, b: usize) -> Result<Vec<u32>> {
    let (me, w, t) = (run.ctx.rank, run.world(), k.ty);
    let mut sums = vec![0u32; k.count];
    for (i, sum) in sums.iter_mut().enumerate() {
        for p in 0..w {
            if p == me {
                let x = own(run, t, i)?;
                *sum = if p == 0 { x } else { t.reduce(k.op, *sum, x) };
                continue;
            }
            let slot = run.rec.slot(me, b, p)?;
            slot.load(t, i)?;
            let read = || slot.load(t, i).unwrap_or(t.poison());
            run.wait(
                p, || format!("a Lamport all-reduce of rank {me} (round {round}): rank {p}'s element {i} never came"),
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
