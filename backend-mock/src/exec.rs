//! What a mock stream worker does for one operation, or one group of them.

#![allow(
    unsafe_code,
    reason = "the mock's host memory and shared mappings, read and written as device memory"
)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use unicomm_core::{DataType, Error, Kind, ReduceOp, Result, Scalar};

use crate::fabric::{Desc, Exchange, Load, Msg, Signature, LOAD_PART};
use crate::memory::HostAlloc;
use crate::reduce::reduce;
use crate::windows::Windows;
use crate::Fault;

pub(crate) mod batch;
pub(crate) mod signals;

/// What one rank's work needs to reach its peers.
pub(crate) struct RankCtx {
    pub rank: usize,
    pub world: usize,
    pub fabric: Arc<dyn Exchange>,
    pub timeout: Duration,
    pub faults: Vec<Fault>,
    /// The communicator's flight recorder (dumped at the first failure of its work).
    pub flight: Arc<unicomm_core::flight::FlightRecorder>,
    /// What the library and device the mock stands for permit.
    pub target: unicomm_nccl_api::Target,
}

impl RankCtx {
    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }
}

/// A byte range of one allocation, kept alive by the work that uses it.
#[derive(Clone)]
pub(crate) struct Span {
    pub alloc: Arc<HostAlloc>,
    pub offset: usize,
    pub write: bool,
}

impl Span {
    fn addr(&self) -> usize {
        self.alloc.addr() + self.offset
    }
}

/// A collective as the mock runs it: the contract's [`Kind`] with its count and type.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spec {
    pub kind: Kind,
    pub count: usize,
    pub dtype: DataType,
}

#[derive(Clone)]
pub(crate) enum Work {
    Coll {
        seq: u64,
        sig: Signature,
        spec: Spec,
        send: Option<Span>,
        recv: Option<Span>,
    },
    Send {
        span: Span,
        count: usize,
        dtype: DataType,
        peer: usize,
    },
    Recv {
        span: Span,
        count: usize,
        dtype: DataType,
        peer: usize,
    },
    /// A one-sided signal to `peer`, after a put's bytes where `put` is some: the source
    /// (read), its length, and the window's ordinal and byte offset.
    /// `graph`: recorded by a capture (its signals count only in graphs' waits).
    Signal {
        put: Option<(Span, usize, (u64, usize))>,
        peer: usize,
        graph: bool,
    },
    /// A wait for one-sided signals; the puts' bytes land in this rank's windows. `graph`:
    /// recorded by a capture (it counts only graphs' signals).
    Wait {
        waits: Vec<unicomm_core::SignalWait>,
        windows: Arc<Windows>,
        graph: bool,
    },
}

impl Work {
    /// The memory the work reads or writes.
    fn spans(&self) -> impl Iterator<Item = &Span> {
        let (a, b) = match self {
            Work::Coll { send, recv, .. } => (send.as_ref(), recv.as_ref()),
            Work::Send { span, .. } | Work::Recv { span, .. } => (Some(span), None),
            Work::Signal { put, .. } => (put.as_ref().map(|p| &p.0), None),
            Work::Wait { .. } => (None, None),
        };
        a.into_iter().chain(b)
    }
}

/// One operation as enqueued: the rank, its index among the rank's operations (for fault
/// injection), and the work.
pub(crate) struct Task {
    pub ctx: Arc<RankCtx>,
    pub index: u64,
    pub work: Work,
    /// The communicator's collective sequence and operation counters (a replay of a
    /// captured graph takes new numbers from them).
    pub counters: (Arc<AtomicU64>, Arc<AtomicU64>),
}

/// Element range `[lo, hi)` of chunk `k` when `count` elements are cut into `world` chunks.
fn chunk(count: usize, world: usize, k: usize) -> (usize, usize) {
    let at = |i: usize| ((count as u128 * i as u128) / world as u128) as usize;
    (at(k), at(k + 1))
}

/// Copies `bytes` from `src` to `dst` when they differ.
///
/// # Safety
/// Both point to `bytes` valid bytes that do not overlap unless equal; the caller has the
/// right to write `dst` and read `src` under the collective protocol.
unsafe fn copy(src: usize, dst: usize, bytes: usize) {
    if src != dst && bytes != 0 {
        // SAFETY: forwarded from this function's contract.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes) }
    }
}

/// A section that reads or writes peers' memory; ends on drop.
struct Access<'a> {
    fabric: &'a dyn Exchange,
    seq: u64,
}

impl<'a> Access<'a> {
    fn enter(fabric: &'a dyn Exchange, seq: u64) -> Result<Self> {
        fabric.enter(seq)?;
        Ok(Access { fabric, seq })
    }
}

impl Drop for Access<'_> {
    fn drop(&mut self) {
        self.fabric.exit(self.seq);
    }
}

/// Runs one collective, or, for `spec == None`-like ops (windows), only the agreement.
pub(crate) fn run_coll(
    ctx: &RankCtx,
    seq: u64,
    sig: &Signature,
    spec: Spec,
    send: Option<&Span>,
    recv: Option<&Span>,
) -> Result<()> {
    let desc = Desc {
        sig: sig.clone(),
        send: send.map_or(0, Span::addr),
        recv: recv.map_or(0, Span::addr),
        send_at: send.and_then(|s| s.alloc.remote(s.offset)),
        recv_at: recv.and_then(|s| s.alloc.remote(s.offset)),
    };
    let fabric = &*ctx.fabric;
    let r = (|| {
        let all = fabric.gather(seq, ctx.rank, desc, ctx.deadline())?;
        if all.len() != ctx.world {
            // A world joined under another size (its hello refused it; here in case a
            // fabric is ever formed so): never indexed past what the ranks described.
            return Err(Error::Mismatch {
                what: "world size",
                detail: format!(
                    "this rank's world has {} ranks and the exchange described {}",
                    ctx.world,
                    all.len()
                ),
            });
        }
        crate::agree::agree(&all)?;
        // SAFETY: every rank agreed on the operation, counts and types; each rank's buffers
        // were checked against its allocation at enqueue time and stay locked and alive until
        // it leaves the slot, which it does only after the last phase (or, on failure, after
        // every access in progress ended). Within a phase, each rank writes only its own
        // receive range, in parts no peer reads in that phase.
        unsafe { execute(ctx, seq, spec, &all) }
    })();
    fabric.leave(seq, r.is_err(), ctx.deadline());
    r
}

/// One collective's data movement on this rank, then the barrier that ends it.
///
/// # Safety
/// As at the call: every rank agreed on `spec`, each `Desc` holds ranges checked against
/// live, locked allocations, and within the phase each rank writes only its own receive
/// range, in parts no peer reads in that phase.
unsafe fn execute(ctx: &RankCtx, seq: u64, spec: Spec, all: &[Desc]) -> Result<()> {
    let (r, f) = (ctx.rank, &*ctx.fabric);
    match spec.kind {
        Kind::Barrier => return Ok(()),
        // Point-to-point operations are not collectives; `Work::Send`/`Work::Recv` run them.
        Kind::Send { .. } | Kind::Recv { .. } => return Ok(()),
        // Lowered to send/recv, broadcasts and reduces before they reach a stream.
        Kind::AllToAllV | Kind::AllGatherV | Kind::ReduceScatterV { .. } => {
            return Err(Error::invalid(
                "op",
                "a variable-size collective reached the mock's kernels unlowered",
            ))
        }
        _ => {}
    }
    // A reduce or a gather moves data on its root only.
    let moves = match spec.kind {
        Kind::Reduce { root, .. } | Kind::Gather { root } => r == root,
        _ => true,
    };
    if moves {
        let _a = Access::enter(f, seq)?;
        if spec.kind.reduction().is_some() {
            // SAFETY: the caller's contract.
            unsafe { reduction(ctx, spec, all) };
        } else {
            // SAFETY: the caller's contract.
            unsafe { copies(ctx, spec, all) };
        }
    }
    f.phase(seq, r, 1, ctx.deadline())
}

/// The reductions' data movement on this rank (all-reduce, reduce at its root,
/// reduce-scatter).
///
/// # Safety
/// As [`execute`].
unsafe fn reduction(ctx: &RankCtx, spec: Spec, all: &[Desc]) {
    let (w, r) = (ctx.world, ctx.rank);
    let me = &all[r];
    let Spec { kind, count, dtype } = spec;
    let es = dtype.size();
    // (into, first element, elements, the sources, also written to), per collective.
    let (into, srcs, n, also): (usize, Vec<*const u8>, usize, Vec<*mut u8>) = match kind {
        Kind::AllReduce { .. } => {
            // Each rank reduces its chunk from every peer's send buffer and writes the
            // result straight into every rank's receive buffer (a reduce-scatter and an
            // all-gather in one pass, one block at a time while it is in cache): every byte
            // is read once and written once, and one barrier ends it. A peer's in-place
            // buffer is read (as source k+1) before the same block is written (as
            // `also[k]`).
            let (lo, hi) = chunk(count, w, r);
            let also = (0..w)
                .filter(|&k| k != r)
                .map(|k| (all[k].recv + lo * es) as *mut u8)
                .collect();
            (
                me.recv + lo * es,
                own_first(all, r, |d| d.send + lo * es),
                hi - lo,
                also,
            )
        }
        // Sends are only read in this phase; only the root writes, into its own range.
        Kind::Reduce { .. } => (me.recv, own_first(all, r, |d| d.send), count, Vec::new()),
        // Chunk r of every send is read only by this rank; in place the receive range is
        // its own chunk r, handled as the first source.
        _ => {
            let b = count * es;
            (
                me.recv,
                own_first(all, r, |d| d.send + r * b),
                count,
                Vec::new(),
            )
        }
    };
    let Some(op) = kind.reduction() else { return };
    // SAFETY: the ranges above, per the caller's contract; chunk `r` of every rank's
    // buffers is touched only by this rank in this phase.
    unsafe {
        reduce(
            dtype,
            op,
            w,
            into as *mut u8,
            &srcs,
            n,
            &also,
            &scales(all, r),
        )
    };
}

/// The copies of the moving collectives on this rank (broadcast, all-gather, gather at its
/// root, scatter, all-to-all): sources are only read, and this rank writes only its own
/// receive range (in place, its own chunk is its send: `copy` skips it).
///
/// # Safety
/// As [`execute`].
unsafe fn copies(ctx: &RankCtx, spec: Spec, all: &[Desc]) {
    let r = ctx.rank;
    let me = &all[r];
    let b = spec.count * spec.dtype.size();
    match spec.kind {
        // SAFETY: the root's send is only read; this rank writes its own receive range.
        Kind::Broadcast { root } => unsafe { copy(all[root].send, me.recv, b) },
        // SAFETY: as above, the root's chunk for this rank.
        Kind::Scatter { root } => unsafe { copy(all[root].send + r * b, me.recv, b) },
        Kind::AllGather | Kind::Gather { .. } => {
            for (k, d) in all.iter().enumerate() {
                // SAFETY: peers' sends are only read; this rank writes its own range.
                unsafe { copy(d.send, me.recv + k * b, b) };
            }
        }
        Kind::AllToAll => {
            for (p, d) in all.iter().enumerate() {
                // SAFETY: sends are only read; send and receive never overlap (checked at
                // enqueue); this rank writes its own receive range.
                unsafe { copy(d.send + r * b, me.recv + p * b, b) };
            }
        }
        _ => {}
    }
}

/// Every rank's scalar of a pre-multiplied sum, this rank's first (the order of
/// [`own_first`]'s sources); empty for the other reductions.
fn scales(all: &[Desc], r: usize) -> Vec<Scalar> {
    std::iter::once(r)
        .chain((0..all.len()).filter(|&k| k != r))
        .filter_map(|k| match all[k].sig.op {
            Some(ReduceOp::PreMulSum(x)) => Some(x),
            _ => None,
        })
        .collect()
}

/// Source pointers with this rank's first (so that in place, the output is source 0).
fn own_first(all: &[Desc], r: usize, at: impl Fn(&Desc) -> usize) -> Vec<*const u8> {
    std::iter::once(r)
        .chain((0..all.len()).filter(|&k| k != r))
        .map(|k| at(&all[k]) as *const u8)
        .collect()
}

fn run_recv(ctx: &RankCtx, span: &Span, count: usize, dtype: DataType, peer: usize) -> Result<()> {
    let msg = ctx
        .fabric
        .take(peer, ctx.rank, ctx.deadline(), ctx.timeout)?;
    if msg.count != count || msg.dtype != dtype {
        let e = Error::Mismatch {
            what: "send/recv",
            detail: format!(
                "rank {peer} sent {} x {}, rank {} receives {count} x {dtype}",
                msg.count, msg.dtype, ctx.rank
            ),
        };
        // NCCL's grouped calls with mismatched counts corrupt or hang the whole
        // communicator; here every rank learns of it at once, by the pair and both counts
        // (a variable-size collective lowered to these calls included).
        ctx.fabric.complete(msg.id, Some(e.clone()));
        ctx.fabric.poison(e.clone());
        return Err(e);
    }
    // SAFETY: the sender waits (holding its buffer) until `complete`; our span was checked to
    // hold `count` elements and is locked for writing by this batch.
    unsafe { copy(msg.addr, span.addr(), count * dtype.size()) };
    ctx.fabric.complete(msg.id, None);
    Ok(())
}

// One-sided operations: a signal posts its message (after a put's bytes, carried in it) and
// does not wait; a wait takes the peers' messages until each entry's signals arrived,
// writing the puts' bytes into this rank's windows.

fn post(ctx: &RankCtx, peer: usize, load: Load) -> Result<()> {
    let msg = Msg {
        id: (ctx.rank as u64) << 44 | batch::NEXT_MSG.fetch_add(1, Ordering::Relaxed),
        addr: 0,
        count: load.bytes.len(),
        dtype: DataType::U8,
        at: None,
        load: Some(load),
    };
    ctx.fabric.post(ctx.rank, peer, msg)
}

/// A signal to `peer`, after `put`'s bytes (source, length, window ordinal and offset):
/// the bytes are copied out now (the batch holds the source's read lock), in parts of at
/// most [`LOAD_PART`], the last counting the signal.
pub(crate) fn signal(
    ctx: &RankCtx,
    put: Option<&(Span, usize, (u64, usize))>,
    peer: usize,
    graph: bool,
) -> Result<()> {
    let Some((span, bytes, (ord, offset))) = put else {
        let load = Load {
            window: None,
            bytes: Arc::from(&[][..]),
            signal: true,
            graph,
        };
        return post(ctx, peer, load);
    };
    let mut done = 0;
    loop {
        let n = (bytes - done).min(LOAD_PART);
        let mut part = vec![0u8; n];
        // SAFETY: the source span holds `bytes` bytes (checked at enqueue) and is read-locked
        // by this batch; `part` is a fresh vector of `n` bytes.
        unsafe { copy(span.addr() + done, part.as_mut_ptr() as usize, n) };
        let load = Load {
            window: Some((*ord, offset + done)),
            bytes: part.into(),
            signal: done + n == *bytes,
            graph,
        };
        post(ctx, peer, load)?;
        done += n;
        if done == *bytes {
            return Ok(());
        }
    }
}

/// Writes a put's `bytes` at `offset` of this rank's part of window `ord`.
pub(super) fn land(
    ctx: &RankCtx,
    peer: usize,
    windows: &Windows,
    ord: u64,
    offset: usize,
    bytes: &[u8],
) -> Result<()> {
    let Some((span, size)) = windows.part(ord) else {
        return Err(Error::invalid(
            "window",
            format!(
                "rank {peer} put into window #{ord}, which rank {} has deregistered or never registered",
                ctx.rank
            ),
        ));
    };
    if offset.checked_add(bytes.len()).is_none_or(|end| end > size) {
        return Err(Error::Mismatch {
            what: "window",
            detail: format!(
                "rank {peer} put {} bytes at byte {offset} of window #{ord}, whose part on rank {} holds {size} (every rank's part must be the same size)",
                bytes.len(),
                ctx.rank
            ),
        });
    }
    let _g = span.alloc.write_lock(ctx.timeout)?;
    // SAFETY: `offset + len <= size`, the window's part on this rank, which its table entry
    // keeps allocated; the allocation is write-locked; `bytes` is a separate vector.
    unsafe { copy(bytes.as_ptr() as usize, span.addr() + offset, bytes.len()) };
    Ok(())
}
