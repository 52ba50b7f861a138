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

    /// The output's shape for an input of `shape` over `world` ranks; refusals name the
    /// caller's shape and dimension `dim` (the op runs along dimension 0 of the input
    /// transposed so).
    pub(crate) fn out_shape(self, shape: &Shape, world: usize, dim: usize) -> Result<Shape> {
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
                        "unicomm-candle {}: dimension {dim} of {:?} is not divisible by the {world} ranks",
                        self.name(),
                        callers_dims(shape, dim)
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

/// The caller's dimensions of an op's input that is the caller's tensor with dimensions 0
/// and `dim` swapped.
pub(crate) fn callers_dims(shape: &Shape, dim: usize) -> Vec<usize> {
    let mut d = shape.dims().to_vec();
    if dim < d.len() {
        d.swap(0, dim);
    }
    d
}

/// Every rank's input agrees with rank 0's in type and shape (NCCL sees only a count of
/// elements: ranks of equal counts and other shapes would reinterpret each other's bytes):
/// one all-gather of each rank's type and dimensions; `Mismatch` naming the ranks, in the
/// caller's dimensions, otherwise. The CPU path compares on every call; the CUDA path where
/// collectives are checked (`UNICOMM_CHECK_COLLECTIVES=1`).
pub(crate) fn agree(
    comm: &unicomm::Comm,
    stream: &unicomm::Stream,
    coll: Coll,
    (shape, dim): (&Shape, usize),
    dtype: candle_core::DType,
) -> unicomm::Result<()> {
    let w = comm.world_size();
    if w == 1 {
        return Ok(());
    }
    let dims = callers_dims(shape, dim);
    let mine = describe(&dims, dtype);
    let send = comm.upload(&mine, stream)?;
    let mut all = comm.alloc::<i64>(w * DESC)?;
    comm.all_gather(&send, &mut all, stream)?;
    let all = all.copy_to_host(stream)?;
    let first = &all[..DESC];
    let Some(r) = (1..w).find(|&r| &all[r * DESC..][..DESC] != first) else {
        return Ok(());
    };
    let theirs = &all[r * DESC..][..DESC];
    let what = if theirs[0] != first[0] {
        "dtype"
    } else {
        "shape"
    };
    let show = |d: &[i64]| format!("{} {}", dtype_name(d[0]), shown_dims(d));
    Err(unicomm::Error::Mismatch {
        what,
        detail: format!(
            "{}: rank 0's input is {}, rank {r}'s is {} (every rank passes the same type and shape)",
            coll.name(),
            show(first),
            show(theirs)
        ),
    })
}

/// A rank's description: its type, its number of dimensions and the first seven, and a
/// digest of any further ones.
const DESC: usize = 10;

fn describe(dims: &[usize], dtype: candle_core::DType) -> [i64; DESC] {
    let mut d = [0i64; DESC];
    d[0] = DTYPES
        .iter()
        .position(|&t| t == dtype)
        .map_or(-1, |i| i as i64);
    d[1] = dims.len() as i64;
    for (slot, &n) in d[2..9].iter_mut().zip(dims) {
        *slot = n as i64;
    }
    d[9] = dims.iter().skip(7).fold(0xcbf2_9ce4_8422_2325u64, |h, &n| {
        (h ^ n as u64).wrapping_mul(0x100_0000_01b3)
    }) as i64;
    d
}

const DTYPES: [candle_core::DType; 7] = {
    use candle_core::DType::*;
    [U8, U32, I64, BF16, F16, F32, F64]
};

fn dtype_name(code: i64) -> String {
    usize::try_from(code)
        .ok()
        .and_then(|i| DTYPES.get(i))
        .map_or_else(|| "another type".into(), |t| format!("{t:?}"))
}

fn shown_dims(d: &[i64]) -> String {
    let n = d[1].max(0) as usize;
    let listed: Vec<String> = d[2..2 + n.min(7)].iter().map(|x| x.to_string()).collect();
    let more = if n > 7 { ", ..." } else { "" };
    format!("[{}{more}]", listed.join(", "))
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
            /// The caller's dimension the op runs along (its input is the caller's tensor
            /// with it swapped into dimension 0): what refusals name.
            dim: usize,
        }

        impl $ty {
            /// The op on `comm`.
            pub fn new(comm: Arc<Communicator>, $($field: $fty),*) -> Self {
                $ty { comm, $($field,)* dim: 0 }
            }
            /// The op for the caller's dimension `dim`, swapped into dimension 0.
            #[allow(dead_code, reason = "an all-reduce runs along no dimension")]
            pub(crate) fn for_dim(mut self, dim: usize) -> Self {
                self.dim = dim;
                self
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
                cpu::forward(&self.comm, (self.coll(), self.dim), s, l)
            }
            #[cfg(feature = "cuda")]
            fn cuda_fwd(
                &self,
                s: &candle_core::CudaStorage,
                l: &Layout,
            ) -> Result<(candle_core::CudaStorage, Shape)> {
                cuda::forward(&self.comm, (self.coll(), self.dim), s, l)
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
