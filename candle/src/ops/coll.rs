//! Which collective an op runs, how its output's shape follows from its input's, and its
//! call on unicomm's communicator.

use candle_core::{Result, Shape, WithDType};
use unicomm::{AnyComm, DeviceSlice, DeviceSliceMut, Element, ReduceOp};

/// A reduction, as candle code names it. [`Reduce::Scaled`] is NCCL's pre-multiplied sum:
/// every rank's input times the scalar, summed (the scalar is converted to the tensor's
/// element type at each call).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reduce {
    /// The sum.
    Sum,
    /// The product.
    Prod,
    /// The largest.
    Max,
    /// The smallest.
    Min,
    /// The mean over the ranks (NCCL >= 2.10).
    Avg,
    /// The sum of every rank's input times this scalar (NCCL >= 2.11).
    Scaled(f64),
}

impl Reduce {
    pub(crate) fn op<T: Element + WithDType>(self) -> ReduceOp {
        match self {
            Reduce::Sum => ReduceOp::Sum,
            Reduce::Prod => ReduceOp::Prod,
            Reduce::Max => ReduceOp::Max,
            Reduce::Min => ReduceOp::Min,
            Reduce::Avg => ReduceOp::Avg,
            Reduce::Scaled(s) => ReduceOp::pre_mul_sum(T::from_f64(s)),
        }
    }
}

/// The caller's dimensions of an op's input that is the caller's tensor with dimensions 0
/// and `dim` swapped.
pub(crate) fn callers_dims(shape: &Shape, dim: usize) -> Vec<usize> {
    let mut d = shape.dims().to_vec();
    if dim < d.len() {
        d.swap(0, dim);
    }
    d
}

/// Which collective an op runs.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Coll {
    AllReduce(Reduce),
    AllGather,
    ReduceScatter(Reduce),
    AllToAll,
    Broadcast { root: usize },
    Gather { root: usize },
    Scatter { root: usize },
    Send { peer: usize },
    Recv { peer: usize },
}

impl Coll {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Coll::AllReduce(_) => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter(_) => "reduce_scatter",
            Coll::AllToAll => "all_to_all",
            Coll::Broadcast { .. } => "broadcast",
            Coll::Gather { .. } => "gather",
            Coll::Scatter { .. } => "scatter",
            Coll::Send { .. } => "send",
            Coll::Recv { .. } => "recv",
        }
    }

    /// Whether every rank calls it with the same input (what [`super::agree`] compares):
    /// not a send or receive, which pair two ranks only.
    pub(crate) fn every_rank(self) -> bool {
        !matches!(self, Coll::Send { .. } | Coll::Recv { .. })
    }

    /// The output's shape for an input of `shape` on `rank` of `world`; refusals name the
    /// caller's shape and dimension `dim` (the op runs along dimension 0 of the input
    /// transposed so). A receive's output is its template's shape.
    pub(crate) fn out_shape(
        self,
        shape: &Shape,
        (rank, world): (usize, usize),
        dim: usize,
    ) -> Result<Shape> {
        let mut dims = shape.dims().to_vec();
        let per_element = matches!(
            self,
            Coll::AllReduce(_) | Coll::Broadcast { .. } | Coll::Recv { .. }
        );
        if per_element {
            return Ok(shape.clone());
        }
        if let Coll::Send { .. } = self {
            return Ok(Shape::from(0usize));
        }
        let Some(d0) = dims.first_mut() else {
            candle_core::bail!(
                "unicomm-candle {}: a scalar has no dimension 0",
                self.name()
            );
        };
        let refuse = |why: &str| {
            candle_core::Error::Msg(format!(
                "unicomm-candle {}: dimension {dim} of {:?} {why}",
                self.name(),
                callers_dims(shape, dim)
            ))
            .bt()
        };
        match self {
            Coll::AllGather | Coll::Gather { .. } => {
                let all = d0
                    .checked_mul(world)
                    .ok_or_else(|| refuse(&format!("times the {world} ranks overflows")))?;
                *d0 = match self {
                    Coll::Gather { root } if root != rank => 0,
                    _ => all,
                };
            }
            _ => {
                if *d0 % world != 0 {
                    return Err(refuse(&format!("is not divisible by the {world} ranks")));
                }
                if !matches!(self, Coll::AllToAll) {
                    *d0 /= world;
                }
            }
        }
        Ok(Shape::from(dims))
    }

    /// Enqueues the collective from `send` into `recv` on `stream`.
    #[cfg(feature = "cuda")]
    pub(crate) fn enqueue<T: Element + WithDType>(
        self,
        comm: &unicomm::Comm,
        send: &impl DeviceSlice<T, AnyComm>,
        recv: &mut impl DeviceSliceMut<T, AnyComm>,
        stream: &unicomm::Stream,
    ) -> Result<()> {
        self.enqueue_unwrapped(comm, send, recv, stream)
            .map_err(|e| crate::comm::wrap(self.name(), e))
    }

    /// [`Coll::enqueue`] with unicomm's own error.
    pub(crate) fn enqueue_unwrapped<T: Element + WithDType>(
        self,
        comm: &unicomm::Comm,
        send: &impl DeviceSlice<T, AnyComm>,
        recv: &mut impl DeviceSliceMut<T, AnyComm>,
        stream: &unicomm::Stream,
    ) -> unicomm::Result<()> {
        match self {
            Coll::AllReduce(op) => comm.all_reduce(send, recv, op.op::<T>(), stream),
            Coll::AllGather => comm.all_gather(send, recv, stream),
            Coll::ReduceScatter(op) => comm.reduce_scatter(send, recv, op.op::<T>(), stream),
            Coll::AllToAll => comm.all_to_all(send, recv, stream),
            Coll::Broadcast { root } => comm.broadcast(send, recv, root, stream),
            Coll::Gather { root } => comm.gather(send, recv, root, stream),
            Coll::Scatter { root } => comm.scatter(send, recv, root, stream),
            Coll::Send { peer } => comm.send(send, peer, stream),
            Coll::Recv { peer } => comm.recv(recv, peer, stream),
        }
    }
}
