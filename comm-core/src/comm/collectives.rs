//! The collectives every NCCL has, typed: counts come from the views.

use crate::backend::Collective;
use crate::buffer::{DeviceSlice, DeviceSliceMut};
use crate::element::Element;
use crate::op::{Kind, Op};
use crate::{Comm, Error, ReduceOp, Result};

impl<C: Collective> Comm<C> {
    /// The reduction for elements of `T`: a pre-multiplied sum's scalar must be a `T`.
    pub(crate) fn op_for<T: Element>(&self, op: ReduceOp) -> Result<ReduceOp> {
        if let ReduceOp::PreMulSum(s) = op {
            if s.dtype() != T::DTYPE {
                return Err(Error::invalid(
                    "op",
                    format!(
                        "a pre-multiplied sum's scalar is a {}, the elements are {}",
                        s.dtype(),
                        T::DTYPE
                    ),
                ));
            }
        }
        Ok(op)
    }

    /// `recv = op(send of every rank)`, `send.len()` elements; `recv` must hold as many.
    pub fn all_reduce<T: Element>(
        &self,
        send: &impl DeviceSlice<T, C>,
        recv: &mut impl DeviceSliceMut<T, C>,
        op: ReduceOp,
        stream: &C::Stream,
    ) -> Result<()> {
        let op = self.op_for::<T>(op)?;
        let (s, r) = self.views(send, recv, Ok)?;
        self.sole()?.enqueue(
            Op::new(Kind::AllReduce { op }, s.raw(), r.raw(), s.len, T::DTYPE),
            stream,
        )
    }

    /// `recv = sum over ranks of (scale x send)`, NCCL's pre-multiplied sum with the scalar
    /// typed as the elements at compile time (`ReduceOp::pre_mul_sum` takes any element
    /// type and refuses a mismatch at run time): the scaled gradient all-reduce of data
    /// parallelism, or an average with a weight of one's own.
    pub fn all_reduce_scaled<T: Element>(
        &self,
        send: &impl DeviceSlice<T, C>,
        recv: &mut impl DeviceSliceMut<T, C>,
        scale: T,
        stream: &C::Stream,
    ) -> Result<()> {
        self.all_reduce(send, recv, ReduceOp::pre_mul_sum(scale), stream)
    }

    /// In-place all-reduce of every element of `buf`.
    pub fn all_reduce_in_place<T: Element>(
        &self,
        buf: &mut impl DeviceSliceMut<T, C>,
        op: ReduceOp,
        stream: &C::Stream,
    ) -> Result<()> {
        let op = self.op_for::<T>(op)?;
        let b = self.view_mut_of(buf)?.into_view();
        self.sole()?.enqueue(
            Op::new(Kind::AllReduce { op }, b.raw(), b.raw(), b.len, T::DTYPE),
            stream,
        )
    }

    /// Root's `send` (`send.len()` elements) to every rank's `recv`. `send` is read on the
    /// root only, but every rank passes one of the same length.
    pub fn broadcast<T: Element>(
        &self,
        send: &impl DeviceSlice<T, C>,
        recv: &mut impl DeviceSliceMut<T, C>,
        root: usize,
        stream: &C::Stream,
    ) -> Result<()> {
        self.rank_arg(root, "root")?;
        let (s, r) = self.views(send, recv, Ok)?;
        self.sole()?.enqueue(
            Op::new(Kind::Broadcast { root }, s.raw(), r.raw(), s.len, T::DTYPE),
            stream,
        )
    }

    /// In-place broadcast: root's `buf` overwrites every other rank's.
    pub fn broadcast_in_place<T: Element>(
        &self,
        buf: &mut impl DeviceSliceMut<T, C>,
        root: usize,
        stream: &C::Stream,
    ) -> Result<()> {
        self.rank_arg(root, "root")?;
        let b = self.view_mut_of(buf)?.into_view();
        self.sole()?.enqueue(
            Op::new(Kind::Broadcast { root }, b.raw(), b.raw(), b.len, T::DTYPE),
            stream,
        )
    }

    /// The reduction of every rank's `send` into root's `recv` (written on the root only;
    /// every rank passes one at least as long as `send`).
    pub fn reduce<T: Element>(
        &self,
        send: &impl DeviceSlice<T, C>,
        recv: &mut impl DeviceSliceMut<T, C>,
        op: ReduceOp,
        root: usize,
        stream: &C::Stream,
    ) -> Result<()> {
        let op = self.op_for::<T>(op)?;
        self.rank_arg(root, "root")?;
        let (s, r) = self.views(send, recv, Ok)?;
        self.sole()?.enqueue(
            Op::new(Kind::Reduce { op, root }, s.raw(), r.raw(), s.len, T::DTYPE),
            stream,
        )
    }

    /// In-place reduce into root's `buf`.
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut impl DeviceSliceMut<T, C>,
        op: ReduceOp,
        root: usize,
        stream: &C::Stream,
    ) -> Result<()> {
        let op = self.op_for::<T>(op)?;
        self.rank_arg(root, "root")?;
        let b = self.view_mut_of(buf)?.into_view();
        self.sole()?.enqueue(
            Op::new(Kind::Reduce { op, root }, b.raw(), b.raw(), b.len, T::DTYPE),
            stream,
        )
    }

    /// `recv[r*n..(r+1)*n] = send of rank r`, `n = send.len()`; `recv` holds `n*world_size`.
    pub fn all_gather<T: Element>(
        &self,
        send: &impl DeviceSlice<T, C>,
        recv: &mut impl DeviceSliceMut<T, C>,
        stream: &C::Stream,
    ) -> Result<()> {
        let (s, r) = self.views(send, recv, |n| self.times_world(n, "send"))?;
        self.sole()?.enqueue(
            Op::new(Kind::AllGather, s.raw(), r.raw(), s.len, T::DTYPE),
            stream,
        )
    }

    /// In-place all-gather: `buf` holds `n*world_size` elements and this rank's input is
    /// already at `buf[rank*n..(rank+1)*n]` (NCCL's in-place layout).
    pub fn all_gather_in_place<T: Element>(
        &self,
        buf: &mut impl DeviceSliceMut<T, C>,
        stream: &C::Stream,
    ) -> Result<()> {
        let whole = self.view_mut_of(buf)?.into_view();
        let count = self.per_rank(whole.len, "buf")?;
        let mine = whole.slice(self.rank() * count..(self.rank() + 1) * count)?;
        self.sole()?.enqueue(
            Op::new(Kind::AllGather, mine.raw(), whole.raw(), count, T::DTYPE),
            stream,
        )
    }

    /// `recv = op(send_r[rank*n..(rank+1)*n] for every rank r)` with `n = send.len() /
    /// world_size` (which must divide); `recv` holds at least `n`.
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &impl DeviceSlice<T, C>,
        recv: &mut impl DeviceSliceMut<T, C>,
        op: ReduceOp,
        stream: &C::Stream,
    ) -> Result<()> {
        let op = self.op_for::<T>(op)?;
        let (s, r) = self.views(send, recv, |n| self.per_rank(n, "send"))?;
        self.sole()?.enqueue(
            Op::new(
                Kind::ReduceScatter { op },
                s.raw(),
                r.raw(),
                r.len,
                T::DTYPE,
            ),
            stream,
        )
    }

    /// In-place reduce-scatter: the result lands in `buf[rank*n..(rank+1)*n]`.
    pub fn reduce_scatter_in_place<T: Element>(
        &self,
        buf: &mut impl DeviceSliceMut<T, C>,
        op: ReduceOp,
        stream: &C::Stream,
    ) -> Result<()> {
        let op = self.op_for::<T>(op)?;
        let whole = self.view_mut_of(buf)?.into_view();
        let count = self.per_rank(whole.len, "buf")?;
        let mine = whole.slice(self.rank() * count..(self.rank() + 1) * count)?;
        self.sole()?.enqueue(
            Op::new(
                Kind::ReduceScatter { op },
                whole.raw(),
                mine.raw(),
                count,
                T::DTYPE,
            ),
            stream,
        )
    }

    /// All-to-all: with `n = send.len() / world_size` (which must divide), this rank's
    /// `recv[p*n..(p+1)*n]` receives `send_p[rank*n..(rank+1)*n]` from every rank `p`.
    /// `recv` holds at least `send.len()`.
    pub fn all_to_all<T: Element>(
        &self,
        send: &impl DeviceSlice<T, C>,
        recv: &mut impl DeviceSliceMut<T, C>,
        stream: &C::Stream,
    ) -> Result<()> {
        let (s, r) = self.views(send, recv, |n| self.per_rank(n, "send").map(|_| n))?;
        let count = s.len / self.world_size();
        self.sole()?.enqueue(
            Op::new(Kind::AllToAll, s.raw(), r.raw(), count, T::DTYPE),
            stream,
        )
    }

    /// Sends every element of `buf` to `peer`, which must post a matching `recv`. Inside a
    /// group, sends and receives between the same ranks do not deadlock.
    pub fn send<T: Element>(
        &self,
        buf: &impl DeviceSlice<T, C>,
        peer: usize,
        stream: &C::Stream,
    ) -> Result<()> {
        self.rank_arg(peer, "peer")?;
        let b = buf.view();
        self.check(&b)?;
        self.sole()?
            .enqueue(Op::send(b.raw(), b.len, T::DTYPE, peer), stream)
    }

    /// Receives `buf.len()` elements from `peer`.
    pub fn recv<T: Element>(
        &self,
        buf: &mut impl DeviceSliceMut<T, C>,
        peer: usize,
        stream: &C::Stream,
    ) -> Result<()> {
        self.rank_arg(peer, "peer")?;
        let b = self.view_mut_of(buf)?.into_view();
        self.sole()?
            .enqueue(Op::recv(b.raw(), b.len, T::DTYPE, peer), stream)
    }

    /// A stream-ordered barrier: work enqueued after it on `stream` starts once every rank
    /// has reached it. Call `stream.synchronize()` to wait on the host.
    pub fn barrier(&self, stream: &C::Stream) -> Result<()> {
        self.sole()?.enqueue(Op::barrier(), stream)
    }
}
