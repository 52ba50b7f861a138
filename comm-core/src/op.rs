//! One operation of the contract, as backends receive it: what to do ([`Kind`]) apart from
//! where ([`Slice`]s) and how much (count, type). Every consumer (bounds checks, the
//! facade's memory mapping, the mock's lowering, the NCCL-API enqueue) reads the shape from
//! here instead of repeating a per-collective match: [`Kind::extents`] says how many
//! elements each side holds, [`Op::map_mem`] maps memory, and the backends match only on
//! what differs (the reduction, the root, which library call).

use crate::backend::DeviceMemory;
pub use crate::layout::{Counts, Layout};
use crate::{DataType, Error, ReduceOp, Result};

/// A byte range of one allocation, as a collective sees it.
#[derive(Debug)]
pub struct Slice<'a, M> {
    /// The allocation.
    pub mem: &'a M,
    /// Offset of the first byte.
    pub offset: usize,
    /// Length in bytes.
    pub bytes: usize,
}

impl<M> Clone for Slice<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for Slice<'_, M> {}

impl<M: DeviceMemory> Slice<'_, M> {
    /// The device address of the first byte.
    pub fn address(&self) -> usize {
        self.mem.address().wrapping_add(self.offset)
    }

    /// Whether the range lies inside its allocation.
    pub fn in_bounds(&self) -> bool {
        self.offset
            .checked_add(self.bytes)
            .is_some_and(|end| end <= self.mem.byte_len())
    }

    /// Checks that the range lies inside its allocation and holds `elems` elements of
    /// `dtype`; the error names `arg`. Every backend checks this before touching memory.
    pub fn holds(&self, elems: usize, dtype: DataType, arg: &'static str) -> Result<()> {
        let need = elems
            .checked_mul(dtype.size())
            .ok_or_else(|| Error::invalid(arg, "count x element size overflows"))?;
        if !self.in_bounds() || self.bytes < need {
            return Err(Error::invalid(
                arg,
                format!(
                    "{} bytes at offset {} of a {}-byte allocation cannot hold {elems} x {dtype}",
                    self.bytes,
                    self.offset,
                    self.mem.byte_len()
                ),
            ));
        }
        Ok(())
    }
}

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
    /// All-to-all with per-peer counts and displacements in elements ([`Layout`] both
    /// sides; RCCL's `ncclAllToAllv`): `recv[rdispl[p]..][..rcount[p]] =
    /// send_p[sdispl_p[rank]..][..scount_p[rank]]`.
    AllToAllV,
    /// All-gather with per-rank counts ([`Layout::recv`]): `recv[displ[r]..][..count[r]] =
    /// send_r`, where rank `r` sends `count[r]` elements.
    AllGatherV,
    /// Reduce-scatter with per-rank counts ([`Layout::send`]): `recv =
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
    /// Per-rank counts and displacements ([`Layout`]).
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

    /// Whether the kind has per-rank counts ([`Layout`]).
    pub fn is_var(self) -> bool {
        matches!(
            self,
            Kind::AllToAllV | Kind::AllGatherV | Kind::ReduceScatterV { .. }
        )
    }
}

/// One operation: what ([`Kind`]), where (`send`, `recv`), how much (`count` elements of
/// `dtype`, per NCCL's definitions).
///
/// In-place operations pass the same range as `send` and `recv` (all-gather and
/// reduce-scatter use NCCL's in-place layout: the rank's chunk of the larger buffer).
#[derive(Debug)]
pub struct Op<'a, M> {
    /// What the operation does.
    pub kind: Kind,
    /// The input, where the kind has one.
    pub send: Option<Slice<'a, M>>,
    /// The output, where the kind has one.
    pub recv: Option<Slice<'a, M>>,
    /// Elements (per rank or per peer where NCCL counts so).
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Per-rank counts of the variable-size kinds ([`Kind::is_var`]); empty otherwise.
    pub layout: Layout<'a>,
}

impl<M> Clone for Op<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for Op<'_, M> {}

impl<'a, M> Op<'a, M> {
    /// An operation with both buffers.
    pub fn new(
        kind: Kind,
        send: Slice<'a, M>,
        recv: Slice<'a, M>,
        count: usize,
        dtype: DataType,
    ) -> Self {
        Op {
            kind,
            send: Some(send),
            recv: Some(recv),
            count,
            dtype,
            layout: Layout::default(),
        }
    }

    /// An operation whose sides may be absent (a gather's output off the root) or whose
    /// counts are per rank (`layout`).
    pub fn with(
        kind: Kind,
        send: Option<Slice<'a, M>>,
        recv: Option<Slice<'a, M>>,
        count: usize,
        dtype: DataType,
        layout: Layout<'a>,
    ) -> Self {
        Op {
            kind,
            send,
            recv,
            count,
            dtype,
            layout,
        }
    }

    /// `ncclSend` of `count` elements of `buf` to `peer`.
    pub fn send(buf: Slice<'a, M>, count: usize, dtype: DataType, peer: usize) -> Self {
        Op {
            kind: Kind::Send { peer },
            send: Some(buf),
            recv: None,
            count,
            dtype,
            layout: Layout::default(),
        }
    }

    /// `ncclRecv` of `count` elements into `buf` from `peer`.
    pub fn recv(buf: Slice<'a, M>, count: usize, dtype: DataType, peer: usize) -> Self {
        Op {
            kind: Kind::Recv { peer },
            send: None,
            recv: Some(buf),
            count,
            dtype,
            layout: Layout::default(),
        }
    }

    /// A barrier.
    pub fn barrier() -> Self {
        Op {
            kind: Kind::Barrier,
            send: None,
            recv: None,
            count: 0,
            dtype: DataType::U8,
            layout: Layout::default(),
        }
    }

    /// The same operation over another memory type: `f` maps each slice's memory, or
    /// returns `None` when it belongs to another backend (an `InvalidArgument` error naming
    /// the side). Used by dispatching layers such as the `unicomm` facade.
    pub fn map_mem<N>(self, f: impl Fn(&'a M) -> Option<&'a N>) -> Result<Op<'a, N>> {
        let m = |s: Option<Slice<'a, M>>, arg: &'static str| -> Result<Option<Slice<'a, N>>> {
            s.map(|s| {
                Ok(Slice {
                    mem: f(s.mem).ok_or_else(|| {
                        Error::invalid(arg, "memory of another backend than the communicator's")
                    })?,
                    offset: s.offset,
                    bytes: s.bytes,
                })
            })
            .transpose()
        };
        Ok(Op {
            kind: self.kind,
            send: m(self.send, "send")?,
            recv: m(self.recv, "recv")?,
            count: self.count,
            dtype: self.dtype,
            layout: self.layout,
        })
    }

    /// The operation's name, as NCCL spells it without the prefix.
    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// Both buffers of a two-buffer operation (`InvalidArgument` when one is missing).
    pub fn pair(&self) -> Result<(Slice<'a, M>, Slice<'a, M>)> {
        Ok((side(self.send, "send")?, side(self.recv, "recv")?))
    }
}

fn side<'a, M>(s: Option<Slice<'a, M>>, arg: &'static str) -> Result<Slice<'a, M>> {
    s.ok_or_else(|| Error::invalid(arg, "missing for this operation"))
}

impl<M: DeviceMemory> Op<'_, M> {
    /// Checks the operation of rank `rank` against its shape for `world` ranks: each buffer
    /// present exactly where the kind has one (a gather's output and a scatter's input on
    /// the root only), inside its allocation, holding what the kind reads or writes, per-rank
    /// counts in bounds and without overflow, and roots and peers are ranks. Every backend
    /// calls this before touching memory.
    pub fn check(&self, rank: usize, world: usize) -> Result<()> {
        if let Some((r, arg)) = self.kind.rank_arg() {
            if r >= world {
                return Err(Error::invalid(
                    arg,
                    format!("rank {r} is outside 0..{world}"),
                ));
            }
        }
        if let Some(ReduceOp::PreMulSum(x)) = self.kind.reduction() {
            if x.dtype() != self.dtype {
                return Err(Error::invalid(
                    "op",
                    format!("a {} scalar for {} elements", x.dtype(), self.dtype),
                ));
            }
        }
        let at_root = self.kind.rank_arg().is_none_or(|(r, _)| r == rank);
        let (se, re) = self.kind.extents();
        let sides = [
            (&self.send, se, "send", self.layout.send),
            (&self.recv, re, "recv", self.layout.recv),
        ];
        for (slice, extent, arg, counts) in sides {
            let extent = match extent {
                Extent::RootPerRank if !at_root => Extent::None,
                e => e,
            };
            match (slice, extent) {
                (None, Extent::None) => {}
                (Some(_), Extent::None) => {
                    return Err(Error::invalid(
                        arg,
                        format!("{} takes no {arg} buffer on this rank", self.kind.name()),
                    ))
                }
                (None, _) => {
                    return Err(Error::invalid(
                        arg,
                        format!("{} needs a {arg} buffer", self.kind.name()),
                    ))
                }
                (Some(s), e) => {
                    // Kernels read elements through typed pointers (the mock's as Rust
                    // slices): a range must start on an element boundary.
                    // (An empty range reads nothing; empty allocations may have any address.)
                    if s.bytes > 0 && s.address() % self.dtype.size() != 0 {
                        return Err(Error::invalid(
                            arg,
                            format!(
                                "address {:#x} is not aligned to the {}-byte {}",
                                s.address(),
                                self.dtype.size(),
                                self.dtype
                            ),
                        ));
                    }
                    let elems = match (e, counts) {
                        (Extent::Var, Some(c)) => {
                            c.check(world, s.bytes / self.dtype.size(), arg)?;
                            c.extent().unwrap_or(0)
                        }
                        (Extent::Var, None) => {
                            return Err(Error::invalid(
                                arg,
                                format!("{} needs per-rank {arg} counts", self.kind.name()),
                            ))
                        }
                        (e, _) => e.elems(self.count, world).ok_or_else(|| {
                            Error::invalid("count", "count x world size overflows")
                        })?,
                    };
                    s.holds(elems, self.dtype, arg)?;
                }
            }
        }
        // A variable-size kind's own count is its rank's entry of the layout.
        let own = match self.kind {
            Kind::AllGatherV => self.layout.recv.map(|c| c.counts[rank]),
            Kind::ReduceScatterV { .. } => self.layout.send.map(|c| c.counts[rank]),
            _ => None,
        };
        if let Some(n) = own {
            if n != self.count {
                return Err(Error::invalid(
                    "count",
                    format!(
                        "{} elements on rank {rank}, whose entry of the counts is {n}",
                        self.count
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The device address of the input, or 0 (NULL) when the kind has none.
    pub fn send_address(&self) -> usize {
        self.send.map_or(0, |s| s.address())
    }

    /// The device address of the output, or 0 (NULL) when the kind has none.
    pub fn recv_address(&self) -> usize {
        self.recv.map_or(0, |s| s.address())
    }
}
