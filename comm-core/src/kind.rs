//! What an operation does ([`Kind`]) and how many elements each side holds ([`Extent`]):
//! the one table of the collectives' shapes, names and codes.

use crate::ReduceOp;

/// What an operation does, without its buffers. Counts are NCCL's: per rank for
/// all-gather, reduce-scatter and all-to-all (per peer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `ncclAllReduce`: `recv[i] = op(send_r[i] for every rank r)`.
    AllReduce {
        /// Reduction.
        op: ReduceOp,
    },
    /// `ncclBroadcast`: root's `send` to every rank's `recv`.
    Broadcast {
        /// The sending rank.
        root: usize,
    },
    /// `ncclReduce`: the reduction of every rank's `send` into root's `recv`.
    Reduce {
        /// Reduction.
        op: ReduceOp,
        /// The receiving rank.
        root: usize,
    },
    /// `ncclAllGather`: `recv[r*count..][..count] = send_r`.
    AllGather,
    /// `ncclReduceScatter`: `recv = op(send_r[rank*count..][..count] for every rank r)`.
    ReduceScatter {
        /// Reduction.
        op: ReduceOp,
    },
    /// `ncclAlltoAll`: `recv[p*count..][..count] = send_p[rank*count..][..count]`.
    AllToAll,
    /// `ncclSend` of `send` to `peer`.
    Send {
        /// Receiving rank.
        peer: usize,
    },
    /// `ncclRecv` into `recv` from `peer`.
    Recv {
        /// Sending rank.
        peer: usize,
    },
    /// Every rank waits for every other (stream-ordered; NCCL has no barrier, the GPU
    /// backends all-reduce one element).
    Barrier,
    /// `ncclGather` (NCCL >= 2.28.3): `recv[r*count..][..count] = send_r` on the root only.
    Gather {
        /// The receiving rank.
        root: usize,
    },
    /// `ncclScatter` (NCCL >= 2.28.3): `recv = send_root[rank*count..][..count]`.
    Scatter {
        /// The sending rank.
        root: usize,
    },
    /// All-to-all with per-peer counts and displacements in elements ([`Layout`](crate::Layout) both
    /// sides; RCCL's `ncclAllToAllv`): `recv[rdispl[p]..][..rcount[p]] =
    /// send_p[sdispl_p[rank]..][..scount_p[rank]]`.
    AllToAllV,
    /// All-gather with per-rank counts ([`Layout::recv`](crate::Layout::recv)): `recv[displ[r]..][..count[r]] =
    /// send_r`, where rank `r` sends `count[r]` elements.
    AllGatherV,
    /// Reduce-scatter with per-rank counts ([`Layout::send`](crate::Layout::send)): `recv =
    /// op(send_p[displ[rank]..][..count[rank]] for every rank p)`.
    ReduceScatterV {
        /// Reduction.
        op: ReduceOp,
    },
}

/// How many `count`s of elements a side of an operation holds: none (the side is absent),
/// one, or one per rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extent {
    /// The operation has no such buffer.
    None,
    /// `count` elements.
    One,
    /// `count * world_size` elements.
    PerRank,
    /// `count * world_size` elements on the root; no buffer elsewhere (NCCL reads or writes
    /// it on the root only).
    RootPerRank,
    /// Per-rank counts and displacements ([`Layout`](crate::Layout)).
    Var,
}

impl Extent {
    /// Elements for `count` and `world` ranks (`None` on overflow, or for [`Extent::Var`],
    /// whose size is its layout's).
    pub fn elems(self, count: usize, world: usize) -> Option<usize> {
        match self {
            Extent::None => Some(0),
            Extent::One => Some(count),
            Extent::PerRank | Extent::RootPerRank => count.checked_mul(world),
            Extent::Var => None,
        }
    }
}

impl Kind {
    /// Every operation once (reductions as sums, roots and peers 0), in the order of
    /// [`Kind::code`]: the one list of the collectives that the automatic policy, the ranks'
    /// agreement, the benchmark and the conformance suite name them by.
    pub const ALL: [Kind; 14] = [
        Kind::AllReduce { op: ReduceOp::Sum },
        Kind::Broadcast { root: 0 },
        Kind::Reduce {
            op: ReduceOp::Sum,
            root: 0,
        },
        Kind::AllGather,
        Kind::ReduceScatter { op: ReduceOp::Sum },
        Kind::AllToAll,
        Kind::Barrier,
        Kind::Send { peer: 0 },
        Kind::Recv { peer: 0 },
        Kind::Gather { root: 0 },
        Kind::Scatter { root: 0 },
        Kind::AllToAllV,
        Kind::AllGatherV,
        Kind::ReduceScatterV { op: ReduceOp::Sum },
    ];

    /// A stable number per operation, from 1 (what ranks exchange to compare their calls).
    pub fn code(self) -> u8 {
        match self {
            Kind::AllReduce { .. } => 1,
            Kind::Broadcast { .. } => 2,
            Kind::Reduce { .. } => 3,
            Kind::AllGather => 4,
            Kind::ReduceScatter { .. } => 5,
            Kind::AllToAll => 6,
            Kind::Barrier => 7,
            Kind::Send { .. } => 8,
            Kind::Recv { .. } => 9,
            Kind::Gather { .. } => 10,
            Kind::Scatter { .. } => 11,
            Kind::AllToAllV => 12,
            Kind::AllGatherV => 13,
            Kind::ReduceScatterV { .. } => 14,
        }
    }

    /// The operation's name in snake case, as tune files, the benchmark and its reports
    /// spell it (`all_reduce`, `all_to_all`, ...).
    pub fn snake_name(self) -> &'static str {
        match self {
            Kind::AllReduce { .. } => "all_reduce",
            Kind::Broadcast { .. } => "broadcast",
            Kind::Reduce { .. } => "reduce",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter { .. } => "reduce_scatter",
            Kind::AllToAll => "all_to_all",
            Kind::Barrier => "barrier",
            Kind::Send { .. } => "send",
            Kind::Recv { .. } => "recv",
            Kind::Gather { .. } => "gather",
            Kind::Scatter { .. } => "scatter",
            Kind::AllToAllV => "all_to_all_v",
            Kind::AllGatherV => "all_gather_v",
            Kind::ReduceScatterV { .. } => "reduce_scatter_v",
        }
    }

    /// The operation a snake-case name spells (of [`Kind::ALL`]).
    pub fn from_snake_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.snake_name() == name)
    }

    /// The operation's name, as NCCL spells it without the prefix.
    pub fn name(self) -> &'static str {
        match self {
            Kind::AllReduce { .. } => "AllReduce",
            Kind::Broadcast { .. } => "Broadcast",
            Kind::Reduce { .. } => "Reduce",
            Kind::AllGather => "AllGather",
            Kind::ReduceScatter { .. } => "ReduceScatter",
            Kind::AllToAll => "AlltoAll",
            Kind::Send { .. } => "Send",
            Kind::Recv { .. } => "Recv",
            Kind::Barrier => "Barrier",
            Kind::Gather { .. } => "Gather",
            Kind::Scatter { .. } => "Scatter",
            Kind::AllToAllV => "AllToAllv",
            Kind::AllGatherV => "AllGatherv",
            Kind::ReduceScatterV { .. } => "ReduceScatterv",
        }
    }

    /// What the `send` and `recv` sides hold, in `count`s (the one table of buffer shapes).
    pub fn extents(self) -> (Extent, Extent) {
        use Extent::*;
        match self {
            Kind::AllReduce { .. } | Kind::Broadcast { .. } | Kind::Reduce { .. } => (One, One),
            Kind::AllGather => (One, PerRank),
            Kind::ReduceScatter { .. } => (PerRank, One),
            Kind::AllToAll => (PerRank, PerRank),
            Kind::Send { .. } => (One, None),
            Kind::Recv { .. } => (None, One),
            Kind::Barrier => (None, None),
            Kind::Gather { .. } => (One, RootPerRank),
            Kind::Scatter { .. } => (RootPerRank, One),
            Kind::AllToAllV => (Var, Var),
            Kind::AllGatherV => (One, Var),
            Kind::ReduceScatterV { .. } => (Var, One),
        }
    }

    /// The reduction, for the reducing collectives.
    pub fn reduction(self) -> Option<ReduceOp> {
        match self {
            Kind::AllReduce { op }
            | Kind::Reduce { op, .. }
            | Kind::ReduceScatter { op }
            | Kind::ReduceScatterV { op } => Some(op),
            _ => None,
        }
    }

    /// The root (broadcast, reduce) or peer (send, recv) and its argument's name.
    pub fn rank_arg(self) -> Option<(usize, &'static str)> {
        match self {
            Kind::Broadcast { root }
            | Kind::Reduce { root, .. }
            | Kind::Gather { root }
            | Kind::Scatter { root } => Some((root, "root")),
            Kind::Send { peer } | Kind::Recv { peer } => Some((peer, "peer")),
            _ => None,
        }
    }

    /// Whether every rank takes part (everything but send/recv).
    pub fn is_collective(self) -> bool {
        !matches!(self, Kind::Send { .. } | Kind::Recv { .. })
    }

    /// Whether the kind has per-rank counts ([`Layout`](crate::Layout)).
    pub fn is_var(self) -> bool {
        matches!(
            self,
            Kind::AllToAllV | Kind::AllGatherV | Kind::ReduceScatterV { .. }
        )
    }
}

/// The stream-ordered work that is not one of NCCL's collectives, by name: unicomm's
/// symmetric kernels, the one-sided calls and the device-API kernel. Their codes follow
/// [`Kind::code`]'s from 32, so that one byte of a flight record names any work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkName {
    /// unicomm's all-reduce over symmetric memory.
    SymmetricAllReduce,
    /// The same, fused with the residual add and RMSNorm.
    SymmetricAllReduceRmsNorm,
    /// A barrier over a symmetric allocation's signal pads.
    SymmetricBarrier,
    /// `ncclPutSignal`.
    PutSignal,
    /// `ncclSignal`.
    Signal,
    /// `ncclWaitSignal`.
    WaitSignal,
    /// unicomm's all-reduce written against NCCL's device API.
    DeviceAllReduce,
    /// unicomm's all-to-all with counts on the device, over symmetric memory.
    SymmetricAllToAllV,
    /// Expert parallelism's dispatch.
    ExpertDispatch,
    /// Expert parallelism's combine.
    ExpertCombine,
}

impl WorkName {
    /// Every name once, in the order of [`WorkName::code`].
    pub const ALL: [WorkName; 10] = [
        WorkName::SymmetricAllReduce,
        WorkName::SymmetricAllReduceRmsNorm,
        WorkName::SymmetricBarrier,
        WorkName::PutSignal,
        WorkName::Signal,
        WorkName::WaitSignal,
        WorkName::DeviceAllReduce,
        WorkName::SymmetricAllToAllV,
        WorkName::ExpertDispatch,
        WorkName::ExpertCombine,
    ];

    /// A stable number, from 32 (after every [`Kind::code`]).
    pub fn code(self) -> u8 {
        32 + self as u8
    }

    /// The name in snake case, as flight records and `cargo xtask trace` spell it.
    pub fn snake_name(self) -> &'static str {
        match self {
            WorkName::SymmetricAllReduce => "symmetric_all_reduce",
            WorkName::SymmetricAllReduceRmsNorm => "symmetric_all_reduce_rms_norm",
            WorkName::SymmetricBarrier => "symmetric_barrier",
            WorkName::PutSignal => "put_signal",
            WorkName::Signal => "signal",
            WorkName::WaitSignal => "wait_signal",
            WorkName::DeviceAllReduce => "device_all_reduce",
            WorkName::SymmetricAllToAllV => "symmetric_all_to_all_v",
            WorkName::ExpertDispatch => "expert_dispatch",
            WorkName::ExpertCombine => "expert_combine",
        }
    }
}

/// What the flight recorder keeps of one piece of work: a collective's kind, count and
/// element type, or the name, count, element type, reduction and rank argument of the
/// work that is not a collective.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum What {
    /// A collective ([`crate::Op`]'s fields).
    Collective(Kind, usize, crate::DataType),
    /// Any other work.
    Other {
        /// Which.
        name: WorkName,
        /// Elements (0 where it moves none).
        count: usize,
        /// Their type, where it has one.
        dtype: Option<crate::DataType>,
        /// The reduction, where it reduces.
        op: Option<ReduceOp>,
        /// The peer it names, where it names one.
        rank: Option<usize>,
    },
}

impl What {
    /// The name in snake case (a collective's [`Kind::snake_name`] or a [`WorkName`]'s).
    pub fn snake_name(self) -> &'static str {
        match self {
            What::Collective(k, ..) => k.snake_name(),
            What::Other { name, .. } => name.snake_name(),
        }
    }
}
