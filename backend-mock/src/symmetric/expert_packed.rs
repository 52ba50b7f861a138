//! Expert parallelism's high-throughput dispatch and combine on the mock (the protocol a
//! GPU kernel of it must run; its layout: `ExpertGroupParts::mode`). Dispatch: the
//! signature agreed; each source writes its per-expert counts into every holder's count
//! matrix; a barrier; every rank reads every holder's matrix, so a holder's total past
//! `max_recv` (or an expert id out of range) is the same `InvalidArgument` on every rank;
//! each source pushes its rows (and their origins) into each holder's packed rows at
//! `base(l) + sum over s' < s of count(l, s')`, in its `(token, k)` order; a barrier; each
//! rank's packed rows are its output, with each local expert's count and first row.
//! Combine: each holder pushes each row back to its origin's `(token, k)` landing row; a
//! barrier; the weighted sum as at low latency.

use std::sync::atomic::Ordering;

use unicomm_core::{Error, Result};

use super::expert::{push_back_and_sum, words, CombineJob, DispatchJob, Elem, Group, BAD_ID};
use super::kernels::{write, Run, Ty};
use super::protocol;

/// Holder `p`'s first packed row of slot range `(l, s)`: the rows of its local experts
/// before `l`, then of `l`'s sources before `s`.
fn first_row(g: &Group, p: usize, l: usize, s: usize) -> Result<usize> {
    let mut at = 0;
    for l2 in 0..=l {
        let sources = if l2 == l { s } else { g.world };
        for s2 in 0..sources {
            at += g.count(p, l2, s2)?.load(Ordering::Relaxed) as usize;
        }
    }
    Ok(at)
}

/// Every holder's counts read: a source's expert id out of range, or a holder's total
/// past `max_recv`, as the same error on every rank.
fn verdict(g: &Group, max_recv: usize) -> Result<()> {
    for p in 0..g.world {
        let mut total = 0usize;
        for l in 0..g.local() {
            for s in 0..g.world {
                match g.count(p, l, s)?.load(Ordering::Relaxed) {
                    BAD_ID => {
                        return Err(Error::invalid(
                            "ids",
                            format!(
                                "rank {s}'s routing names an expert outside 0..{}",
                                g.config.experts
                            ),
                        ))
                    }
                    c => total += c as usize,
                }
            }
        }
        if total > max_recv {
            return Err(Error::invalid(
                "max_recv",
                format!("rank {p} would receive {total} token copies, past max_recv {max_recv}"),
            ));
        }
    }
    Ok(())
}

/// The high-throughput dispatch on this rank (see the module doc).
pub(crate) fn dispatch(run: &Run, g: &Group, d: &DispatchJob, max_recv: usize) -> Result<()> {
    protocol::agree(run)?;
    let (me, t) = (run.ctx.rank, run.ctx.timeout);
    let (e, k, local) = (g.config.experts, g.config.top_k, g.local());
    let ids = words(&d.ids, d.n * k, t)?;
    let mut per = vec![0u64; e];
    let mut bad = false;
    for &id in &ids {
        match id as i32 {
            id if id < 0 => {}
            id if id as usize >= e => bad = true,
            id => per[id as usize] += 1,
        }
    }
    for (id, &c) in per.iter().enumerate() {
        let Some(r) = g.holder(id) else { continue };
        let c = if bad { BAD_ID } else { c };
        g.count(r, id % local, me)?.store(c, Ordering::Relaxed);
    }
    protocol::barrier(run)?;
    verdict(g, max_recv)?;
    let el = Elem::of(g, d);
    let mut next = vec![0usize; e];
    {
        let _r = d.tokens.alloc.read_lock(t)?;
        let _s = match &d.fp8 {
            Some(q) => Some(q.scales.alloc.read_lock(t)?),
            None => None,
        };
        for (i, &id) in ids.iter().enumerate() {
            let id = id as i32;
            let Some(r) = (id >= 0).then(|| g.holder(id as usize)).flatten() else {
                continue;
            };
            let id = id as usize;
            let row = first_row(g, r, id % local, me)? + next[id];
            next[id] += 1;
            g.place(el, d, i, r, row)?;
        }
    }
    protocol::barrier(run)?;
    unpack(run, g, d)
}

/// This rank's packed rows (and an FP8 dispatch's scales) into the output, each local
/// expert's count, then its first row.
fn unpack(run: &Run, g: &Group, d: &DispatchJob) -> Result<()> {
    let (me, t, h, el) = (
        run.ctx.rank,
        run.ctx.timeout,
        g.config.hidden,
        Elem::of(g, d),
    );
    let mut counts = Vec::with_capacity(2 * g.local());
    for l in 0..g.local() {
        let n: u64 = (0..g.world)
            .map(|s| g.count(me, l, s).map(|c| c.load(Ordering::Relaxed)))
            .sum::<Result<u64>>()?;
        counts.push(n as u32);
    }
    let total = counts.iter().map(|&c| c as usize).sum::<usize>();
    let mut first = 0u32;
    for l in 0..g.local() {
        counts.push(first);
        first += counts[l];
    }
    let rows: Vec<u32> = (0..total * h)
        .map(|i| el.data(&g.recv, me, i))
        .collect::<Result<_>>()?;
    el.write(&d.out, 0, &rows, t)?;
    if let Some(q) = &d.fp8 {
        let scales: Vec<u32> = (0..total * q.per)
            .map(|i| q.slots.data(Ty::F32, me, i))
            .collect::<Result<_>>()?;
        write(&q.out_scales, Ty::F32, &scales, t)?;
    }
    write(&d.counts, Ty::F32, &counts, t)
}

/// The high-throughput combine on this rank (see the module doc): the packed rows in order.
pub(crate) fn combine(run: &Run, g: &Group, c: &CombineJob) -> Result<()> {
    push_back_and_sum(run, g, c, |_, next| next, |_, _, _, pos| pos)
}
