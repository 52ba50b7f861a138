//! The collectives as candle [`CustomOp1`]s, along dimension 0 of a contiguous tensor.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, WithDType};
use unicomm::{AnyComm, DeviceSlice, DeviceSliceMut, Element, ReduceOp};

use crate::comm::Communicator;

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;

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
    fn op<T: Element + WithDType>(self) -> ReduceOp {
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

/// Which collective an op runs, and how its output's shape follows from its input's.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Coll {
    AllReduce(Reduce),
    AllGather,
    ReduceScatter(Reduce),
    AllToAll,
}

impl Coll {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Coll::AllReduce(_) => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter(_) => "reduce_scatter",
            Coll::AllToAll => "all_to_all",
        }
    }

    /// The output's shape for an input of `shape` over `world` ranks.
    pub(crate) fn out_shape(self, shape: &Shape, world: usize) -> Result<Shape> {
        let mut dims = shape.dims().to_vec();
        let Some(d0) = dims.first_mut() else {
            // A scalar: only the element-wise collective takes one.
            return match self {
                Coll::AllReduce(_) => Ok(shape.clone()),
                _ => candle_core::bail!(
                    "unicomm-candle {}: a scalar has no dimension 0",
                    self.name()
                ),
            };
        };
        match self {
            Coll::AllReduce(_) => {}
            Coll::AllGather => *d0 *= world,
            Coll::ReduceScatter(_) | Coll::AllToAll => {
                if *d0 % world != 0 {
                    candle_core::bail!(
                        "unicomm-candle {}: dimension 0 of {shape:?} is not divisible by the {world} ranks",
                        self.name()
                    );
                }
                if let Coll::ReduceScatter(_) = self {
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
        }
    }
}

/// The input's elements, which must be contiguous: `(start, end)` in its storage.
pub(crate) fn contiguous(l: &Layout, coll: Coll) -> Result<(usize, usize)> {
    l.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg(format!(
            "unicomm-candle {}: the input is not contiguous (shape {:?}, strides {:?}); \
             call .contiguous() first, or use the Communicator's method, which does",
            coll.name(),
            l.shape(),
            l.stride()
        ))
        .bt()
    })
}

/// The refusal of a dtype the collectives do not take, on every device.
pub(crate) fn unsupported_dtype(coll: Coll, dtype: candle_core::DType) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "unicomm-candle {}: {dtype:?} tensors are not supported (f32, f64, f16, bf16 are)",
        coll.name()
    ))
    .bt()
}

macro_rules! custom_op {
    ($(#[$doc:meta])* $ty:ident, $name:literal, $coll:expr, $($field:ident: $fty:ty),*) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $ty {
            comm: Arc<Communicator>,
            $($field: $fty,)*
        }

        impl $ty {
            /// The op on `comm`.
            pub fn new(comm: Arc<Communicator>, $($field: $fty),*) -> Self {
                $ty { comm, $($field),* }
            }
            fn coll(&self) -> Coll {
                let f: fn(&Self) -> Coll = $coll;
                f(self)
            }
        }

        impl CustomOp1 for $ty {
            fn name(&self) -> &'static str {
                $name
            }
            fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
                cpu::forward(&self.comm, self.coll(), s, l)
            }
            #[cfg(feature = "cuda")]
            fn cuda_fwd(
                &self,
                s: &candle_core::CudaStorage,
                l: &Layout,
            ) -> Result<(candle_core::CudaStorage, Shape)> {
                cuda::forward(&self.comm, self.coll(), s, l)
            }
        }
    };
}

custom_op!(
    /// `op` over every rank's tensor, same shape out.
    AllReduce, "unicomm-all-reduce", |s| Coll::AllReduce(s.op), op: Reduce
);
custom_op!(
    /// Every rank's tensor concatenated along dimension 0, in rank order.
    AllGather, "unicomm-all-gather", |_| Coll::AllGather,
);
custom_op!(
    /// `op` over every rank's tensor; this rank keeps its part of dimension 0.
    ReduceScatter, "unicomm-reduce-scatter", |s| Coll::ReduceScatter(s.op), op: Reduce
);
custom_op!(
    /// Dimension 0 cut into one part per rank, part `i` sent to rank `i`; the output holds
    /// every rank's part for this one, in rank order.
    AllToAll, "unicomm-all-to-all", |_| Coll::AllToAll,
);
