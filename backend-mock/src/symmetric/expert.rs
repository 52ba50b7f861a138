//! Expert parallelism's dispatch and combine on the mock, with the protocol a GPU kernel
//! runs over the group's symmetric memory (its layout: `unicomm_core::symmetric`'s expert
//! module). Dispatch: the signature agreed at a barrier; each source pushes every routed
//! token into its expert's rank's slot `(local expert, source)` with its origin, then
//! publishes each slot's count in that rank's metadata; a barrier; every rank reads every
//! rank's counts, so a slot over `max_tokens` or an expert id out of range is the same
//! `InvalidArgument` on every rank; each rank compacts its slots expert-major. Combine: the
//! signature agreed; each expert's rank pushes every output row back to its token's rank at
//! `(token, k)`; a barrier; each rank sums its tokens' rows by their weights in f32, in `k`
//! order, rounded once. The next call's first barrier keeps any rank from writing a slot a
//! peer still reads. A layout with masked ranks (the group over the survivors): an entry
//! naming a masked rank's expert is passed over at dispatch and at combine, as a `-1`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use unicomm_core::symmetric::{ExpertConfig, ExpertGroupParts, ExpertMode, RankMask};
use unicomm_core::{Error, Result};

use super::kernels::{read, read_u8, write, write_bytes, Local, Run, Ty};
use super::protocol;
use super::table::Record;

/// A count that says the source's routing named an expert outside `0..experts`.
pub(super) const BAD_ID: u64 = u64::MAX;

/// The group's memory on this rank and its capacities.
pub(crate) struct Group {
    pub recv: Arc<Record>,
    pub meta: Arc<Record>,
    pub back: Arc<Record>,
    pub config: ExpertConfig,
    pub mask: RankMask,
    pub ty: Ty,
    pub world: usize,
    pub mode: ExpertMode,
}

/// One dispatch's operands on this rank.
pub(crate) struct DispatchJob {
    pub n: usize,
    pub tokens: Local,
    pub ids: Local,
    pub out: Local,
    pub counts: Local,
    /// FP8 tokens: the scale slots, the scales a token, the scales and where they go.
    pub fp8: Option<Fp8Job>,
}

/// An FP8 dispatch's scales on this rank.
pub(crate) struct Fp8Job {
    pub slots: Arc<Record>,
    pub per: usize,
    pub scales: Local,
    pub out_scales: Local,
}

/// An element a dispatch moves: one of the group's type, or an FP8 byte.
#[derive(Clone, Copy)]
pub(super) enum Elem {
    Ty(Ty),
    Byte,
}

impl Elem {
    pub(super) fn of(g: &Group, d: &DispatchJob) -> Elem {
        if d.fp8.is_some() {
            Elem::Byte
        } else {
            Elem::Ty(g.ty)
        }
    }

    /// Element `i` of `l` (read-locked by the caller), as bits.
    pub(super) fn read(self, l: &Local, i: usize) -> u32 {
        match self {
            Elem::Ty(t) => read(l, t, i),
            Elem::Byte => u32::from(read_u8(l, i)),
        }
    }

    pub(super) fn set(self, rec: &Record, p: usize, i: usize, x: u32) -> Result<()> {
        match self {
            Elem::Ty(t) => rec.set(t, p, i, x),
            Elem::Byte => rec.set_byte(p, i, x as u8),
        }
    }

    pub(super) fn data(self, rec: &Record, p: usize, i: usize) -> Result<u32> {
        match self {
            Elem::Ty(t) => rec.data(t, p, i),
            Elem::Byte => rec.byte(p, i).map(u32::from),
        }
    }

    pub(super) fn write(
        self,
        l: &Local,
        at: usize,
        bits: &[u32],
        t: std::time::Duration,
    ) -> Result<()> {
        match self {
            Elem::Ty(ty) => write(&shifted(l, at * ty.size()), ty, bits, t),
            Elem::Byte => {
                let b: Vec<u8> = bits.iter().map(|&x| x as u8).collect();
                write_bytes(&shifted(l, at), &b, t)
            }
        }
    }
}

/// `l` moved on by `bytes`.
fn shifted(l: &Local, bytes: usize) -> Local {
    Local {
        alloc: l.alloc.clone(),
        offset: l.offset + bytes,
    }
}

/// One combine's operands on this rank.
pub(crate) struct CombineJob {
    pub n: usize,
    pub expert_out: Local,
    pub ids: Local,
    pub weights: Local,
    pub out: Local,
}

impl Group {
    pub(crate) fn new(
        get: impl Fn(unicomm_core::registry::RawHandle) -> Result<Arc<Record>>,
        g: &ExpertGroupParts,
    ) -> Result<Group> {
        let recv = get(g.recv)?;
        Ok(Group {
            world: recv.bases.len(),
            meta: get(g.meta)?,
            back: get(g.back)?,
            recv,
            config: g.config,
            mask: g.mask,
            ty: Ty::of(g.dtype)?,
            mode: g.mode,
        })
    }

    pub(super) fn local(&self) -> usize {
        self.config.experts / self.mask.world()
    }

    /// The group's rank holding expert `id` (`None` where its layout rank is masked).
    pub(super) fn holder(&self, id: usize) -> Option<usize> {
        self.mask.group_rank(id / self.local())
    }

    /// Slot `(l, s)`'s count word in rank `p`'s metadata.
    pub(super) fn count(
        &self,
        p: usize,
        l: usize,
        s: usize,
    ) -> Result<&std::sync::atomic::AtomicU64> {
        self.meta.count(p, l * self.world + s)
    }

    /// Entry `i` of a dispatch's routing (its token's row, an FP8 dispatch's scales, its
    /// origin) into holder `r`'s slot `slot`.
    pub(super) fn place(
        &self,
        el: Elem,
        d: &DispatchJob,
        i: usize,
        r: usize,
        slot: usize,
    ) -> Result<()> {
        let (h, k) = (self.config.hidden, self.config.top_k);
        for j in 0..h {
            el.set(
                &self.recv,
                r,
                slot * h + j,
                el.read(&d.tokens, (i / k) * h + j),
            )?;
        }
        if let Some(q) = &d.fp8 {
            for s in 0..q.per {
                let x = read(&q.scales, Ty::F32, (i / k) * q.per + s);
                q.slots.set(Ty::F32, r, slot * q.per + s, x)?;
            }
        }
        let origin = self.meta.count(r, self.local() * self.world + slot)?;
        origin.store(i as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Index of slot `(l, s)`'s entry `idx` among the slots.
    fn slot(&self, l: usize, s: usize, idx: usize) -> usize {
        (l * self.world + s) * self.config.max_tokens + idx
    }
}

/// `n` i32 (as u32 bits) from `l`, under its read lock.
pub(super) fn words(l: &Local, n: usize, timeout: std::time::Duration) -> Result<Vec<u32>> {
    let _g = l.alloc.read_lock(timeout)?;
    Ok((0..n).map(|i| read(l, Ty::F32, i)).collect())
}

/// The dispatch on this rank (see the module doc).
pub(crate) fn dispatch(run: &Run, g: &Group, d: &DispatchJob) -> Result<()> {
    protocol::agree(run)?;
    let (me, t) = (run.ctx.rank, run.ctx.timeout);
    let ExpertConfig {
        experts: e,
        max_tokens: m,
        top_k: k,
        ..
    } = g.config;
    let local = g.local();
    let ids = words(&d.ids, d.n * k, t)?;
    let mut next = vec![0u64; e];
    let mut bad = false;
    let el = Elem::of(g, d);
    {
        let _r = d.tokens.alloc.read_lock(t)?;
        let _s = match &d.fp8 {
            Some(q) => Some(q.scales.alloc.read_lock(t)?),
            None => None,
        };
        for (i, &id) in ids.iter().enumerate() {
            let id = id as i32;
            if id < 0 {
                continue;
            }
            let id = id as usize;
            if id >= e {
                bad = true;
                continue;
            }
            let Some(r) = g.holder(id) else { continue };
            let (l, idx) = (id % local, next[id] as usize);
            next[id] += 1;
            if idx >= m {
                continue;
            }
            g.place(el, d, i, r, g.slot(l, me, idx))?;
        }
    }
    for (id, &c) in next.iter().enumerate() {
        let Some(r) = g.holder(id) else { continue };
        let c = if bad { BAD_ID } else { c };
        g.count(r, id % local, me)?.store(c, Ordering::Relaxed);
    }
    protocol::barrier(run)?;
    verdict(g)?;
    compact(run, g, d)
}

/// Every rank's counts read: the first slot over `max_tokens`, or a source whose routing
/// named an expert out of range, as the same error on every rank.
fn verdict(g: &Group) -> Result<()> {
    let (w, local, m) = (g.world, g.local(), g.config.max_tokens as u64);
    for p in 0..w {
        for l in 0..local {
            for s in 0..w {
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
                    c if c > m => {
                        return Err(Error::invalid(
                            "max_tokens",
                            format!(
                                "expert {} (rank {p}) would receive {c} tokens from rank {s}, past max_tokens {m}",
                                g.mask.layout_rank(p) * local + l
                            ),
                        ))
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(())
}

/// This rank's slots compacted expert-major into the output (and an FP8 dispatch's scales
/// alongside), with each expert's count.
fn compact(run: &Run, g: &Group, d: &DispatchJob) -> Result<()> {
    let (me, w, t) = (run.ctx.rank, g.world, run.ctx.timeout);
    let (m, h, el) = (g.config.max_tokens, g.config.hidden, Elem::of(g, d));
    let mut counts = Vec::with_capacity(g.local());
    for l in 0..g.local() {
        let (mut rows, mut scales) = (Vec::new(), Vec::new());
        for s in 0..w {
            let c = g.count(me, l, s)?.load(Ordering::Relaxed) as usize;
            for idx in 0..c {
                let slot = g.slot(l, s, idx);
                for j in 0..h {
                    rows.push(el.data(&g.recv, me, slot * h + j)?);
                }
                if let Some(q) = &d.fp8 {
                    for k in 0..q.per {
                        scales.push(q.slots.data(Ty::F32, me, slot * q.per + k)?);
                    }
                }
            }
        }
        counts.push((rows.len() / h) as u32);
        el.write(&d.out, l * w * m * h, &rows, t)?;
        if let Some(q) = &d.fp8 {
            write(
                &shifted(&q.out_scales, 4 * l * w * m * q.per),
                Ty::F32,
                &scales,
                t,
            )?;
        }
    }
    write(&d.counts, Ty::F32, &counts, t)
}

/// The combine on this rank (see the module doc).
pub(crate) fn combine(run: &Run, g: &Group, c: &CombineJob) -> Result<()> {
    let (w, m) = (g.world, g.config.max_tokens);
    push_back_and_sum(
        run,
        g,
        c,
        |l, _| l * w * m,
        |l, s, idx, _| g.slot(l, s, idx),
    )
}

/// A combine on this rank: the signature agreed; each row of the experts' output (local
/// expert `l`'s rows from `first(l, next)`, `next` the row after the last expert's; the
/// source's `idx`-th at row `pos` has its origin at metadata entry `origin(l, s, idx, pos)`)
/// pushed back to its token's rank at `(token, k)`; a barrier; the weighted sum.
pub(super) fn push_back_and_sum(
    run: &Run,
    g: &Group,
    c: &CombineJob,
    first: impl Fn(usize, usize) -> usize,
    origin: impl Fn(usize, usize, usize, usize) -> usize,
) -> Result<()> {
    protocol::agree(run)?;
    let (me, w, t, h) = (run.ctx.rank, g.world, run.ctx.timeout, g.config.hidden);
    let local = g.local();
    {
        let _r = c.expert_out.alloc.read_lock(t)?;
        let mut pos = 0;
        for l in 0..local {
            pos = first(l, pos);
            for s in 0..w {
                let n = g.count(me, l, s)?.load(Ordering::Relaxed) as usize;
                for idx in 0..n {
                    let at = g.meta.count(me, local * w + origin(l, s, idx, pos))?;
                    let row = at.load(Ordering::Relaxed) as usize;
                    for j in 0..h {
                        let x = read(&c.expert_out, g.ty, pos * h + j);
                        g.back.set(g.ty, s, row * h + j, x)?;
                    }
                    pos += 1;
                }
            }
        }
    }
    protocol::barrier(run)?;
    sum_back(run, g, c)
}

/// Each of this rank's tokens: its rows weighted and summed in `k` order (f32), rounded.
fn sum_back(run: &Run, g: &Group, c: &CombineJob) -> Result<()> {
    let (me, t) = (run.ctx.rank, run.ctx.timeout);
    let (h, k) = (g.config.hidden, g.config.top_k);
    let ids = words(&c.ids, c.n * k, t)?;
    let weights = words(&c.weights, c.n * k, t)?;
    let mut out = Vec::with_capacity(c.n * h);
    for tok in 0..c.n {
        for j in 0..h {
            let mut acc = 0.0f32;
            for q in 0..k {
                let id = ids[tok * k + q] as i32;
                if id < 0 || g.holder(id as usize).is_none() {
                    continue;
                }
                let x = g.ty.to_f64(g.back.data(g.ty, me, (tok * k + q) * h + j)?) as f32;
                acc += f32::from_bits(weights[tok * k + q]) * x;
            }
            out.push(g.ty.bits_f32(acc));
        }
    }
    write(&c.out, g.ty, &out, t)
}
