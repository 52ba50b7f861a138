//! The [`Communicator`]'s collectives on tensors: any dimension, any layout (made
//! contiguous first), through the ops of [`crate::ops`].

use std::sync::Arc;

use candle_core::{DType, Device, Result, Shape, Tensor};

use crate::comm::Communicator;
use crate::ops::{
    AllGather, AllReduce, AllToAll, Broadcast, Gather, Recv, Reduce, ReduceScatter, Scatter, Send,
};

impl Communicator {
    /// `op` over every rank's `x` (any shape; every rank passes the same shape).
    pub fn all_reduce(self: &Arc<Self>, x: &Tensor, op: Reduce) -> Result<Tensor> {
        x.contiguous()?
            .apply_op1_no_bwd(&AllReduce::new(self.clone(), op))
    }

    /// Every rank's `x` concatenated along `dim`, in rank order.
    pub fn all_gather(self: &Arc<Self>, x: &Tensor, dim: usize) -> Result<Tensor> {
        along(x, dim, |t| {
            t.apply_op1_no_bwd(&AllGather::new(self.clone()).for_dim(dim))
        })
    }

    /// `op` over every rank's `x`, of which this rank keeps its part along `dim` (the
    /// dimension's size divided by the ranks, in rank order).
    pub fn reduce_scatter(self: &Arc<Self>, x: &Tensor, dim: usize, op: Reduce) -> Result<Tensor> {
        along(x, dim, |t| {
            t.apply_op1_no_bwd(&ReduceScatter::new(self.clone(), op).for_dim(dim))
        })
    }

    /// `x` cut into as many parts along `dim` as there are ranks: part `i` goes to rank
    /// `i`, and the result holds every rank's part for this rank, in rank order (the
    /// head/sequence exchange of Ulysses, MoE dispatch of equal parts).
    pub fn all_to_all(self: &Arc<Self>, x: &Tensor, dim: usize) -> Result<Tensor> {
        along(x, dim, |t| {
            t.apply_op1_no_bwd(&AllToAll::new(self.clone()).for_dim(dim))
        })
    }
}

impl Communicator {
    /// `root`'s `x` on every rank (every rank passes a tensor of the same shape and type;
    /// only the root's values are read).
    pub fn broadcast(self: &Arc<Self>, x: &Tensor, root: usize) -> Result<Tensor> {
        x.contiguous()?
            .apply_op1_no_bwd(&Broadcast::new(self.clone(), root))
    }

    /// Every rank's `x` concatenated along `dim` on `root`, in rank order; elsewhere an
    /// empty tensor (`dim` of size 0).
    pub fn gather(self: &Arc<Self>, x: &Tensor, dim: usize, root: usize) -> Result<Tensor> {
        along(x, dim, |t| {
            t.apply_op1_no_bwd(&Gather::new(self.clone(), root).for_dim(dim))
        })
    }

    /// `root`'s `x` cut into as many parts along `dim` as there are ranks, part `i` to rank
    /// `i` (every rank passes a tensor of the same shape and type; only the root's values
    /// are read).
    pub fn scatter(self: &Arc<Self>, x: &Tensor, dim: usize, root: usize) -> Result<Tensor> {
        along(x, dim, |t| {
            t.apply_op1_no_bwd(&Scatter::new(self.clone(), root).for_dim(dim))
        })
    }

    /// Sends `x` to rank `peer`, which calls [`Communicator::recv`] with its shape and type
    /// (a pipeline stage's hand-off). On CUDA it is enqueued on candle's stream: the call
    /// returns before the bytes have left, and `x` stays alive in candle's storage until the
    /// stream reaches it.
    pub fn send(self: &Arc<Self>, x: &Tensor, peer: usize) -> Result<()> {
        x.contiguous()?
            .apply_op1_no_bwd(&Send::new(self.clone(), peer))
            .map(drop)
    }

    /// A tensor of `shape` and `dtype` on `device` from rank `peer`'s [`Communicator::send`].
    pub fn recv(
        self: &Arc<Self>,
        shape: impl Into<Shape>,
        dtype: DType,
        device: &Device,
        peer: usize,
    ) -> Result<Tensor> {
        let shape = shape.into();
        // A shape whose bytes overflow is refused before candle counts its elements (its
        // product overflows and panics there).
        let bytes = shape
            .dims()
            .iter()
            .try_fold(dtype.size_in_bytes(), |a, &d| a.checked_mul(d));
        if bytes.is_none_or(|b| b > isize::MAX as usize) {
            candle_core::bail!(
                "unicomm-candle recv: a tensor of shape {:?} and {dtype:?} has more bytes than memory can hold",
                shape.dims()
            );
        }
        // Only its shape and type are read: one element, broadcast.
        let like = Tensor::zeros((), dtype, device)?.broadcast_as(shape)?;
        like.apply_op1_no_bwd(&Recv::new(self.clone(), peer))
    }
}

/// `f` (an op along dimension 0) applied along `dim`.
fn along(x: &Tensor, dim: usize, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    if dim >= x.rank() {
        candle_core::bail!(
            "unicomm-candle: dimension {dim} of a tensor of {} dimensions",
            x.rank()
        );
    }
    if dim == 0 {
        return f(&x.contiguous()?);
    }
    f(&x.transpose(0, dim)?.contiguous()?)?
        .transpose(0, dim)?
        .contiguous()
}
