//! One operation of the contract, as backends receive it: what to do ([`Kind`]) apart from
//! where ([`Slice`]s) and how much (count, type). Every consumer (bounds checks, the
//! facade's memory mapping, the mock's lowering, the NCCL-API enqueue) reads the shape from
//! here instead of repeating a per-collective match: [`Kind::extents`] says how many
//! elements each side holds, [`Op::map_mem`] maps memory, and the backends match only on
//! what differs (the reduction, the root, which library call).

pub use crate::counts::{Counts, Layout};
use crate::device::DeviceMemory;
pub use crate::kind::{Extent, Kind};
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

impl<'a, M> Slice<'a, M> {
    /// The same range over another memory type: `f` maps the memory, or returns `None`
    /// when it belongs to another backend (an `InvalidArgument` error naming `arg`). What
    /// dispatching layers such as the `unicomm` facade map every operation's slices with.
    pub fn map_mem<N>(
        self,
        f: impl Fn(&'a M) -> Option<&'a N>,
        arg: &'static str,
    ) -> Result<Slice<'a, N>> {
        Ok(Slice {
            mem: f(self.mem).ok_or_else(|| {
                Error::invalid(arg, "memory of another backend than the communicator's")
            })?,
            offset: self.offset,
            bytes: self.bytes,
        })
    }
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
    /// The call's options ([`crate::Comm::with_options`]); `None` for the communicator's.
    pub options: Option<&'a crate::call_options::CallOptions>,
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
            options: None,
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
            options: None,
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
            options: None,
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
            options: None,
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
            options: None,
        }
    }

    /// The same operation over another memory type: `f` maps each slice's memory, or
    /// returns `None` when it belongs to another backend (an `InvalidArgument` error naming
    /// the side). Used by dispatching layers such as the `unicomm` facade.
    pub fn map_mem<N>(self, f: impl Fn(&'a M) -> Option<&'a N>) -> Result<Op<'a, N>> {
        let m = |s: Option<Slice<'a, M>>, arg: &'static str| -> Result<Option<Slice<'a, N>>> {
            s.map(|s| s.map_mem(&f, arg)).transpose()
        };
        Ok(Op {
            kind: self.kind,
            send: m(self.send, "send")?,
            recv: m(self.recv, "recv")?,
            count: self.count,
            dtype: self.dtype,
            layout: self.layout,
            options: self.options,
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
    /// calls this before touching memory itself or planning from the sizes; the NCCL-API
    /// backend's library calls check the ranges they hand the library in their own layer,
    /// so its common route (`route::decide`) leaves this out where that layer refuses the same.
    #[inline]
    pub fn check(&self, rank: usize, world: usize) -> Result<()> {
        // Every call passes here: the common shapes are accepted by a short test whose code
        // stays in a few cache lines; anything else (and every refusal) is decided, and
        // explained, by the full check out of line.
        if self.plainly_valid(world) {
            return Ok(());
        }
        self.check_in_full(rank, world)
    }

    /// A conservative test: `true` only for operations [`Op::check_in_full`] accepts
    /// (fixed-size kinds without a root-only side, no pre-multiplied sum, every side
    /// present exactly where the kind has one, aligned, inside its allocation and holding
    /// what the kind reads or writes). `false` says nothing: the full check decides.
    #[inline]
    fn plainly_valid(&self, world: usize) -> bool {
        if self.kind.rank_arg().is_some_and(|(r, _)| r >= world)
            || matches!(self.kind.reduction(), Some(ReduceOp::PreMulSum(_)))
        {
            return false;
        }
        let size = self.dtype.size();
        let (se, re) = self.kind.extents();
        let fits = |slice: &Option<Slice<'_, M>>, e: Extent| match (slice, e) {
            (None, Extent::None) => true,
            (Some(s), Extent::One | Extent::PerRank) => {
                // Sizes are powers of two: a mask, not a division.
                let aligned = s.bytes == 0 || s.address() & (size - 1) == 0;
                let need = e.elems(self.count, world).and_then(|n| n.checked_mul(size));
                aligned && s.in_bounds() && need.is_some_and(|n| s.bytes >= n)
            }
            _ => false,
        };
        fits(&self.send, se) && fits(&self.recv, re)
    }

    /// The full check, with the error naming what is wrong (out of line: refusals and the
    /// rarer shapes only).
    #[cold]
    #[inline(never)]
    fn check_in_full(&self, rank: usize, world: usize) -> Result<()> {
        self.check_arguments(world)?;
        let at_root = self.kind.rank_arg().is_none_or(|(r, _)| r == rank);
        let (se, re) = self.kind.extents();
        self.check_side(
            Side {
                slice: self.send.as_ref(),
                extent: se,
                arg: "send",
                counts: self.layout.send,
                written: false,
            },
            world,
            at_root,
        )?;
        self.check_side(
            Side {
                slice: self.recv.as_ref(),
                extent: re,
                arg: "recv",
                counts: self.layout.recv,
                written: true,
            },
            world,
            at_root,
        )?;
        self.check_own_count(rank)
    }

    /// The root (or peer) inside the world, a pre-multiplied sum's scalar of the elements'
    /// type.
    fn check_arguments(&self, world: usize) -> Result<()> {
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
        Ok(())
    }

    /// One side: present exactly where the kind takes it on this rank, aligned to the
    /// element, holding what the kind (or its per-rank counts) needs.
    fn check_side(&self, side: Side<'_, '_, M>, world: usize, at_root: bool) -> Result<()> {
        let Side {
            slice,
            extent,
            arg,
            counts,
            written,
        } = side;
        let extent = match extent {
            Extent::RootPerRank if !at_root => Extent::None,
            e => e,
        };
        let s = match (slice, extent) {
            (None, Extent::None) => return Ok(()),
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
            (Some(s), _) => s,
        };
        // Kernels read elements through typed pointers (the mock's as Rust slices): a range
        // must start on an element boundary. (An empty range reads nothing; empty
        // allocations may have any address.)
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
        let elems = match (extent, counts) {
            (Extent::Var, Some(c)) => {
                c.check(world, s.bytes / self.dtype.size(), arg)?;
                if written {
                    // What is received is written once; what is sent may be read twice.
                    c.check_disjoint(arg)?;
                }
                c.extent().unwrap_or(0)
            }
            (Extent::Var, None) => {
                return Err(Error::invalid(
                    arg,
                    format!("{} needs per-rank {arg} counts", self.kind.name()),
                ))
            }
            (e, _) => e
                .elems(self.count, world)
                .ok_or_else(|| Error::invalid("count", "count x world size overflows"))?,
        };
        s.holds(elems, self.dtype, arg)
    }

    /// A variable-size kind's own count is its rank's entry of the layout.
    fn check_own_count(&self, rank: usize) -> Result<()> {
        let own = match self.kind {
            Kind::AllGatherV => self.layout.recv.map(|c| c.counts[rank]),
            Kind::ReduceScatterV { .. } => self.layout.send.map(|c| c.counts[rank]),
            _ => None,
        };
        match own {
            Some(n) if n != self.count => Err(Error::invalid(
                "count",
                format!(
                    "{} elements on rank {rank}, whose entry of the counts is {n}",
                    self.count
                ),
            )),
            _ => Ok(()),
        }
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

/// One side of an operation as [`Op::check_in_full`] checks it.
struct Side<'s, 'a, M> {
    slice: Option<&'s Slice<'a, M>>,
    extent: Extent,
    arg: &'static str,
    counts: Option<crate::counts::Counts<'a>>,
    /// Written by the operation (its counts must not overlap).
    written: bool,
}
