//! One rank of a mock world ([`MockComm`]): its state, its thread's group, its
//! registrations and teardown; its collectives are in `collective.rs`.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use unicomm_core::registry::{RegKind, Registry};
use unicomm_core::state::{AtomicLife, Life};
use unicomm_core::{DataType, Error, Extent, Kind, Op, Result, Slice};

use crate::exec::{self, RankCtx, Span, Spec, Task, Work};
use crate::fabric::Signature;
use crate::memory::MockMemory;
use crate::stream::{self};

pub(crate) static NEXT_WORLD: AtomicU64 = AtomicU64::new(1);

/// Numbers the ranks' "devices": one per rank of a world, shared by its children.
pub(crate) static NEXT_DEVICE: AtomicU64 = AtomicU64::new(1);

/// Registration handles are unique in the process, so another communicator's handle is
/// never mistaken for one of this one's (it is not in this registry: an error).
pub(crate) static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(1);

/// One rank of a mock world.
pub struct MockComm {
    pub(crate) ctx: Arc<RankCtx>,
    /// Ranks in different processes: allocations go to shared memory.
    pub(crate) shared: bool,
    pub(crate) world_id: u64,
    /// This rank's "device" (id, the rank of the world that created it): its streams and
    /// memory serve every communicator of the rank, parent and children.
    pub(crate) device: (u64, usize),
    pub(crate) registry: Registry,
    /// Collective sequence number: ranks that issue the same collectives in the same order
    /// (NCCL's rule) meet in the same fabric slot; a graph's replay takes new numbers.
    pub(crate) seq: Arc<AtomicU64>,
    /// Operations enqueued so far (the index faults refer to).
    /// (Shared with the graphs captured on it: a replay counts as new operations.)
    pub(crate) issued: Arc<AtomicU64>,
    pub(crate) state: AtomicLife,
    /// Where the survivors meet to re-form after a failure (`shrink`).
    pub(crate) rejoin: unicomm_bootstrap::Rejoin,
    /// Re-formings so far (each survivor counts the same).
    pub(crate) shrinks: AtomicU64,
    /// The windows by the ordinal every rank gives them (where one-sided puts land).
    pub(crate) windows: Arc<crate::windows::Windows>,
    /// The symmetric allocations by handle.
    pub(crate) symmetric: crate::symmetric::table::Table,
}

impl std::fmt::Debug for MockComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockComm")
            .field("world", &self.world_id)
            .field("rank", &self.ctx.rank)
            .field("world_size", &self.ctx.world)
            .finish()
    }
}

/// This thread's open group: its depth, and the operations held until the group ends.
pub(crate) struct Group {
    pub(crate) depth: usize,
    pub(crate) pending: Vec<(Arc<stream::Inner>, Task)>,
}

thread_local! {
    pub(crate) static GROUP: RefCell<Group> = const { RefCell::new(Group { depth: 0, pending: Vec::new() }) };
}

pub(crate) fn overlap(a: &Slice<'_, MockMemory>, b: &Slice<'_, MockMemory>) -> bool {
    Arc::ptr_eq(&a.mem.inner, &b.mem.inner)
        && a.bytes != 0
        && b.bytes != 0
        && a.offset < b.offset + b.bytes
        && b.offset < a.offset + a.bytes
}

/// Out of place, or in place exactly at `recv + at` (NCCL's layouts); nothing in between.
pub(crate) fn placement(
    send: &Slice<'_, MockMemory>,
    recv: &Slice<'_, MockMemory>,
    at: Option<usize>,
) -> Result<()> {
    if !overlap(send, recv) {
        return Ok(());
    }
    match at {
        Some(at) if send.offset == recv.offset + at => Ok(()),
        _ => Err(Error::invalid(
            "recv",
            "overlaps send without being NCCL's in-place layout",
        )),
    }
}

/// Out of place, or in place exactly as NCCL lays `kind` out, where `own` is this rank's
/// chunk's byte offset in the larger buffer (all-gather, gather: the output's; reduce-scatter,
/// scatter: the input's); the other kinds in place at the same address.
fn check_placement(
    kind: Kind,
    own: usize,
    s: &Slice<'_, MockMemory>,
    r: &Slice<'_, MockMemory>,
) -> Result<()> {
    match kind {
        Kind::AllGather | Kind::Gather { .. } => placement(s, r, Some(own)),
        Kind::ReduceScatter { .. } | Kind::Scatter { .. } => placement(r, s, Some(own)),
        Kind::AllToAll => placement(s, r, None),
        _ => placement(s, r, Some(0)),
    }
}

impl MockComm {
    pub(crate) fn owner(&self) -> (u64, usize) {
        self.device
    }

    /// Marks the communicator aborted and tells its peers (those blocked in a collective with
    /// this rank learn of it now, not at their deadline).
    pub(crate) fn abort_comm(&self) {
        self.state.store(Life::Aborted);
        let rank = self.ctx.rank;
        let e = Error::lost(vec![rank], format!("rank {rank} aborted the communicator"));
        self.ctx.flight.dump_on(&e);
        self.ctx.fabric.poison(e);
    }

    /// A communicator derived from this one (a split child, a shrunk world): rank `rank` of
    /// `world` on `fabric`, of the same device; `step` names it for the flight recorder
    /// ("split3.c1", "shrink0") and, with `ranks` (the members, in this world's ranks), for
    /// where its survivors meet.
    pub(crate) fn derived(
        &self,
        rank: usize,
        world: usize,
        fabric: Arc<dyn crate::fabric::Exchange>,
        world_id: u64,
        step: &str,
        ranks: &[usize],
    ) -> MockComm {
        MockComm {
            ctx: Arc::new(exec::RankCtx {
                rank,
                world,
                fabric,
                timeout: self.ctx.timeout,
                faults: Vec::new(),
                flight: self.ctx.flight.derived(step, rank, world),
                target: self.ctx.target.clone(),
            }),
            shared: self.shared,
            world_id,
            device: self.device,
            registry: Registry::new(),
            seq: Arc::new(AtomicU64::new(0)),
            issued: Arc::new(AtomicU64::new(0)),
            state: AtomicLife::new(Life::Live),
            rejoin: self.rejoin.derived(step.as_bytes(), ranks),
            shrinks: AtomicU64::new(0),
            windows: crate::windows::windows(),
            symmetric: crate::symmetric::table::Table::default(),
        }
    }

    pub(crate) fn live(&self) -> Result<()> {
        match self.state.load() {
            Life::Live => match self.ctx.fabric.poisoned() {
                Some(e) => Err(e),
                None => Ok(()),
            },
            Life::Finalized => Err(Error::invalid("comm", "the communicator was finalized")),
            Life::Suspended => Err(unicomm_core::state::suspended_error()),
            _ => Err(Error::aborted("the communicator was aborted")),
        }
    }

    /// A stream of this rank's device.
    pub(crate) fn check_stream(&self, stream: &crate::stream::MockStream) -> Result<()> {
        if stream.owner == self.owner() {
            return Ok(());
        }
        Err(Error::invalid(
            "stream",
            format!(
                "a stream of device {} (rank {}) used on device {} (rank {})",
                stream.owner.0, stream.owner.1, self.device.0, self.ctx.rank
            ),
        ))
    }

    fn span(&self, s: &Slice<'_, MockMemory>, write: bool) -> Span {
        Span {
            alloc: s.mem.inner.clone(),
            offset: s.offset,
            write,
        }
    }

    fn reg(&self, s: &Slice<'_, MockMemory>, bytes: usize) -> Result<Option<RegKind>> {
        self.registry.covering(s.address(), bytes)
    }

    /// Lowers one operation to the mock's work: checked against its shape and this rank's
    /// memory, with NCCL's in-place layouts, registration looked up now (as NCCL does at
    /// the call), and the next sequence number for collectives.
    pub(crate) fn work(&self, op: Op<'_, MockMemory>) -> Result<Work> {
        let (w, rank) = (self.ctx.world, self.ctx.rank);
        op.check(rank, w)?;
        for s in op.send.iter().chain(op.recv.iter()) {
            if s.mem.inner.owner != self.owner() {
                return Err(foreign_memory(s.mem, self.owner()));
            }
        }
        let (count, dtype) = (op.count, op.dtype);
        match (op.kind, op.send, op.recv) {
            (Kind::Send { peer }, Some(buf), _) => {
                return Ok(Work::Send {
                    span: self.span(&buf, false),
                    count,
                    dtype,
                    peer,
                })
            }
            (Kind::Recv { peer }, _, Some(buf)) => {
                return Ok(Work::Recv {
                    span: self.span(&buf, true),
                    count,
                    dtype,
                    peer,
                })
            }
            _ => {}
        }
        if let (Some(s), Some(r)) = (&op.send, &op.recv) {
            check_placement(op.kind, rank * count * dtype.size(), s, r)?;
        }
        let (send_reg, recv_reg) = self.registrations(&op)?;
        let same = matches!((&op.send, &op.recv), (Some(s), Some(r)) if Arc::ptr_eq(&s.mem.inner, &r.mem.inner));
        let barrier = op.kind == Kind::Barrier;
        Ok(Work::Coll {
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            sig: Signature {
                kind: op.kind.name(),
                count,
                dtype: (!barrier).then_some(dtype),
                // Each rank of a pre-multiplied sum has its own scalar: the ranks agree on
                // the reduction's shape, and the kernel reads every rank's scalar.
                op: op.kind.reduction(),
                root: op.kind.rank_arg().map(|(r, _)| r),
                send_reg,
                recv_reg,
            },
            spec: Spec {
                kind: op.kind,
                count,
                dtype,
            },
            // An in-place op locks its one allocation once, for writing.
            send: op.send.map(|s| self.span(&s, same)),
            recv: op.recv.map(|r| self.span(&r, true)),
        })
    }

    /// The registrations the ranks compare for `op`'s sides (looked up now, as NCCL does
    /// at the call). A gather's output and a scatter's input exist on the root only (NCCL
    /// reads no other rank's): theirs is not compared across the ranks.
    fn registrations(&self, op: &Op<'_, MockMemory>) -> Result<(Option<RegKind>, Option<RegKind>)> {
        // `op.check` proved these products fit the ranges, so they do not overflow.
        let (se, re) = op.kind.extents();
        let bytes = |e: Extent| e.elems(op.count, self.ctx.world).unwrap_or(0) * op.dtype.size();
        let send_reg = match op.kind {
            Kind::Scatter { .. } => None,
            _ => op
                .send
                .map(|s| self.reg(&s, bytes(se)))
                .transpose()?
                .flatten(),
        };
        let recv_reg = match op.kind {
            Kind::Gather { .. } => None,
            _ => op
                .recv
                .map(|r| self.reg(&r, bytes(re)))
                .transpose()?
                .flatten(),
        };
        Ok((send_reg, recv_reg))
    }

    /// A collective the host waits for (window registration is one in NCCL).
    pub(crate) fn blocking_collective(&self, kind: &'static str, bytes: usize) -> Result<()> {
        self.live()?;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let sig = Signature {
            kind,
            count: bytes,
            dtype: None,
            op: None,
            root: None,
            send_reg: None,
            recv_reg: None,
        };
        exec::run_coll(
            &self.ctx,
            seq,
            &sig,
            Spec {
                kind: Kind::Barrier,
                count: 0,
                dtype: DataType::U8,
            },
            None,
            None,
        )
    }
}

pub(crate) fn foreign_memory(mem: &MockMemory, me: (u64, usize)) -> Error {
    let (device, rank) = mem.inner.owner;
    Error::invalid(
        "buffer",
        format!(
            "memory of mock device {device} (rank {rank} of its world), used on device {} (rank {})",
            me.0, me.1
        ),
    )
}

impl Drop for MockComm {
    fn drop(&mut self) {
        // NCCL's rule (ncclCommDestroy finalizes a communicator not finalized yet), the GPU
        // backends' too: a drop finalizes, bounded by the deadline, and peers are not
        // disturbed. A rank that drops it while panicking will not do its part: it aborts,
        // so that its peers learn of it at once instead of at their deadline.
        if !matches!(self.state.load(), Life::Live | Life::Suspended) {
            return;
        }
        if std::thread::panicking() {
            self.state.store(Life::Aborted);
            let rank = self.ctx.rank;
            self.ctx.fabric.poison(Error::lost(
                vec![rank],
                format!("rank {rank} dropped its communicator while panicking"),
            ));
        } else {
            self.state.store(Life::Finalized);
            let joined = self.seq.load(Ordering::Relaxed);
            let _ = self
                .ctx
                .fabric
                .depart(self.ctx.rank, joined, self.ctx.timeout);
        }
    }
}
