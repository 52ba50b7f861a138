//! Gather, scatter and the variable-size collectives, typed: checked here (counts in
//! bounds, no overflow, this rank's memory) before anything is enqueued.

use crate::backend::Collective;
use crate::buffer::Buffer;
use crate::buffer::{DeviceSlice, DeviceSliceMut};
use crate::counts::{Counts, Layout};
use crate::element::Element;
use crate::op::{Kind, Op};
use crate::{Comm, Error, ReduceOp, Result};

/// The displacements of counts packed one after the other (an exclusive prefix sum), the
/// usual layout of [`Comm::all_to_all_v`] and friends; `InvalidArgument` on overflow.
pub fn packed_displs(counts: &[usize]) -> Result<Vec<usize>> {
    let mut at = 0usize;
    counts
        .iter()
        .enumerate()
        .map(|(r, &c)| {
            let d = at;
            at = at.checked_add(c).ok_or_else(|| {
                Error::invalid(
                    "counts",
                    format!("rank {r}: the sum of the counts overflows"),
                )
            })?;
            Ok(d)
        })
        .collect()
}

impl<C: Collective> Comm<C> {
    /// Gather: root's `recv[r*n..(r+1)*n]` receives rank `r`'s `send` (`n = send.len()`, the
    /// same on every rank). `recv` is written on the root only and must hold `n*world_size`
    /// there; elsewhere it is not touched (pass any buffer). `ncclGather` where the library
    /// has it (NCCL >= 2.28.3, RCCL), grouped send/recv otherwise.
    pub fn gather<T: Element>(
        &self,
        send: &impl DeviceSlice<T, C>,
        recv: &mut impl DeviceSliceMut<T, C>,
        root: usize,
        stream: &C::Stream,
    ) -> Result<()> {
        self.rank_arg(root, "root")?;
        let s = send.view();
        self.check(&s)?;
        let out = if self.rank() == root {
            let r = recv.view_mut().into_view();
            self.check(&r)?;
            let n = self.times_world(s.len, "send")?;
            if r.len < n {
                return Err(Error::invalid(
                    "recv",
                    format!("holds {} elements, the root needs {n}", r.len),
                ));
            }
            Some(r.slice(..n)?.raw())
        } else {
            None
        };
        let kind = Kind::Gather { root };
        let op = Op::with(kind, Some(s.raw()), out, s.len, T::DTYPE, Layout::default());
        self.sole()?.enqueue(op, stream)
    }

    /// Scatter: rank `r`'s `recv` (`n = recv.len()`, the same on every rank) receives root's
    /// `send[r*n..(r+1)*n]`. `send` is read on the root only and must hold `n*world_size`
    /// there; elsewhere it is not touched.
    pub fn scatter<T: Element>(
        &self,
        send: &impl DeviceSlice<T, C>,
        recv: &mut impl DeviceSliceMut<T, C>,
        root: usize,
        stream: &C::Stream,
    ) -> Result<()> {
        self.rank_arg(root, "root")?;
        let r = recv.view_mut().into_view();
        self.check(&r)?;
        let input = if self.rank() == root {
            let s = send.view();
            self.check(&s)?;
            let n = self.times_world(r.len, "recv")?;
            if s.len < n {
                return Err(Error::invalid(
                    "send",
                    format!("holds {} elements, the root needs {n}", s.len),
                ));
            }
            Some(s.slice(..n)?.raw())
        } else {
            None
        };
        let kind = Kind::Scatter { root };
        let op = Op::with(
            kind,
            input,
            Some(r.raw()),
            r.len,
            T::DTYPE,
            Layout::default(),
        );
        self.sole()?.enqueue(op, stream)
    }

    /// All-to-all with per-peer counts and displacements (elements): `send_counts.counts[p]`
    /// elements at `send_counts.displs[p]` go to peer `p`, which receives them at its
    /// `recv_counts.displs[rank]`; its `recv_counts.counts[rank]` must equal what this rank
    /// sends it (a disagreement is `Mismatch` on the mock and under
    /// `UNICOMM_CHECK_COLLECTIVES=1`). Zero counts are allowed. RCCL's `ncclAllToAllv`
    /// where present, grouped send/recv elsewhere (NCCL has no all-to-all-v).
    ///
    /// With the copy-engine path on ([`Comm::set_copy_engine`]) and the output in a shared
    /// window on every rank, the data moves by copy engine (no SMs: an MoE dispatch beside
    /// compute): the ranks first exchange their layouts, one host round trip, then each
    /// copies straight into its peers' windows at their own displacements. A disagreement in
    /// counts or element type is then `Mismatch` on every rank; if any rank's output is not
    /// in such a window, every rank takes the library's path.
    pub fn all_to_all_v<T: Element>(
        &self,
        send: &impl DeviceSlice<T, C>,
        send_counts: Counts<'_>,
        recv: &mut impl DeviceSliceMut<T, C>,
        recv_counts: Counts<'_>,
        stream: &C::Stream,
    ) -> Result<()> {
        let (s, r) = (send.view(), recv.view_mut().into_view());
        self.check(&s)?;
        self.check(&r)?;
        let w = self.world_size();
        send_counts.check(w, s.len, "send_counts")?;
        recv_counts.check(w, r.len, "recv_counts")?;
        recv_counts.check_disjoint("recv_counts")?;
        let layout = Layout {
            send: Some(send_counts),
            recv: Some(recv_counts),
        };
        let op = Op::with(
            Kind::AllToAllV,
            Some(s.raw()),
            Some(r.raw()),
            0,
            T::DTYPE,
            layout,
        );
        self.sole()?.enqueue(op, stream)
    }

    /// An MoE dispatch (or its combine) in one call: `send` holds each peer's elements
    /// packed in rank order, `send_counts[p]` of them for peer `p`. The ranks first exchange
    /// their counts (an all-to-all of one count per peer, then a wait on `stream` to read
    /// them: one host round trip, which PyTorch's `all_to_all_single` with split sizes pays
    /// as well), then every peer's elements land packed in rank order in a new buffer.
    /// Returns it and the counts received from each peer (what the combine sends back).
    pub fn all_to_all_v_packed<T: Element>(
        &self,
        send: &impl DeviceSlice<T, C>,
        send_counts: &[usize],
        stream: &C::Stream,
    ) -> Result<(Buffer<T, C>, Vec<usize>)> {
        let w = self.world_size();
        if send_counts.len() != w {
            return Err(Error::invalid(
                "send_counts",
                format!("{} counts for a world of {w}", send_counts.len()),
            ));
        }
        let mine: Vec<u64> = send_counts.iter().map(|&c| c as u64).collect();
        let out = self.upload(&mine, stream)?;
        let mut theirs = self.alloc::<u64>(w)?;
        self.all_to_all(&out, &mut theirs, stream)?;
        let recv_counts = theirs
            .copy_to_host(stream)?
            .into_iter()
            .map(|c| {
                usize::try_from(c).map_err(|_| {
                    Error::invalid("send_counts", format!("a peer sends {c} elements"))
                })
            })
            .collect::<Result<Vec<usize>>>()?;
        let (sd, rd) = (packed_displs(send_counts)?, packed_displs(&recv_counts)?);
        let total = rd.last().zip(recv_counts.last()).map_or(0, |(d, c)| d + c);
        let mut recv = self.alloc::<T>(total)?;
        let s = Counts {
            counts: send_counts,
            displs: &sd,
        };
        let r = Counts {
            counts: &recv_counts,
            displs: &rd,
        };
        self.all_to_all_v(send, s, &mut recv, r, stream)?;
        Ok((recv, recv_counts))
    }

    /// All-gather with per-rank counts: rank `r`'s `send` (`recv_counts.counts[r]` elements,
    /// so this rank's `send.len()` is its own entry) lands at `recv_counts.displs[r]` of
    /// every rank's `recv`. A group of broadcasts, one per rank (neither NCCL nor RCCL has
    /// an all-gather-v).
    pub fn all_gather_v<T: Element>(
        &self,
        send: &impl DeviceSlice<T, C>,
        recv: &mut impl DeviceSliceMut<T, C>,
        recv_counts: Counts<'_>,
        stream: &C::Stream,
    ) -> Result<()> {
        let (s, r) = (send.view(), recv.view_mut().into_view());
        self.check(&s)?;
        self.check(&r)?;
        recv_counts.check(self.world_size(), r.len, "recv_counts")?;
        recv_counts.check_disjoint("recv_counts")?;
        self.own_count(recv_counts, s.len, "send")?;
        let layout = Layout {
            send: None,
            recv: Some(recv_counts),
        };
        let op = Op::with(
            Kind::AllGatherV,
            Some(s.raw()),
            Some(r.raw()),
            s.len,
            T::DTYPE,
            layout,
        );
        self.sole()?.enqueue(op, stream)
    }

    /// Reduce-scatter with per-rank counts: this rank's `recv` (its entry of `send_counts`,
    /// `recv.len()` elements) receives `op` over every rank's `send[displs[rank]..]`. A
    /// group of reduces, one per rank.
    pub fn reduce_scatter_v<T: Element>(
        &self,
        send: &impl DeviceSlice<T, C>,
        send_counts: Counts<'_>,
        recv: &mut impl DeviceSliceMut<T, C>,
        op: ReduceOp,
        stream: &C::Stream,
    ) -> Result<()> {
        let op = self.op_for::<T>(op)?;
        let (s, r) = (send.view(), recv.view_mut().into_view());
        self.check(&s)?;
        self.check(&r)?;
        send_counts.check(self.world_size(), s.len, "send_counts")?;
        let n = send_counts.counts[self.rank()];
        if r.len < n {
            return Err(Error::invalid(
                "recv",
                format!(
                    "holds {} elements, this rank's entry of the counts is {n}",
                    r.len
                ),
            ));
        }
        let r = r.slice(..n)?;
        let layout = Layout {
            send: Some(send_counts),
            recv: None,
        };
        let kind = Kind::ReduceScatterV { op };
        let op = Op::with(kind, Some(s.raw()), Some(r.raw()), r.len, T::DTYPE, layout);
        self.sole()?.enqueue(op, stream)
    }

    /// This rank's entry of `counts` must be `len`, the length of its own side.
    fn own_count(&self, counts: Counts<'_>, len: usize, arg: &'static str) -> Result<()> {
        let mine = counts.counts[self.rank()];
        if mine != len {
            return Err(Error::invalid(
                arg,
                format!(
                    "holds {len} elements, rank {}'s entry of the counts is {mine}",
                    self.rank()
                ),
            ));
        }
        Ok(())
    }
}
