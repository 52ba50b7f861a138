//! The collectives as candle [`CustomOp1`]s, along dimension 0 of a contiguous tensor.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape};

use crate::comm::Communicator;
pub(crate) use agree::agree;
pub(crate) use coll::Coll;
pub use coll::Reduce;

mod agree;
mod coll;
mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;

/// The input's elements, which must be contiguous: `(start, end)` in its storage (none for
/// a receive, whose input is only its output's shape and type).
pub(crate) fn contiguous(l: &Layout, coll: Coll) -> Result<(usize, usize)> {
    if let Coll::Recv { .. } = coll {
        return Ok((0, 0));
    }
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
        "unicomm-candle {}: {dtype:?} tensors are not supported (f32, f64, f16, bf16, u8, u32, i32, i64 are)",
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
            fn out_shape(&self, l: &Layout) -> Result<Shape> {
                let c = &self.comm;
                self.coll().out_shape(l.shape(), (c.rank(), c.world_size()), self.dim)
            }
        }

        impl CustomOp1 for $ty {
            fn name(&self) -> &'static str {
                $name
            }
            fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
                let out = self.out_shape(l)?;
                cpu::forward(&self.comm, (self.coll(), self.dim), s, l, out)
            }
            #[cfg(feature = "cuda")]
            fn cuda_fwd(
                &self,
                s: &candle_core::CudaStorage,
                l: &Layout,
            ) -> Result<(candle_core::CudaStorage, Shape)> {
                let out = self.out_shape(l)?;
                cuda::forward(&self.comm, (self.coll(), self.dim), s, l, out)
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
custom_op!(
    /// The root's tensor on every rank (every rank passes one of the same shape and type;
    /// only the root's is read).
    Broadcast, "unicomm-broadcast", |s| Coll::Broadcast { root: s.root }, root: usize
);
custom_op!(
    /// Every rank's tensor concatenated along dimension 0 on the root, in rank order; an
    /// empty tensor (dimension 0 of size 0) elsewhere.
    Gather, "unicomm-gather", |s| Coll::Gather { root: s.root }, root: usize
);
custom_op!(
    /// The root's tensor cut into one part per rank along dimension 0, part `i` to rank `i`
    /// (every rank passes one of the same shape and type; only the root's is read).
    Scatter, "unicomm-scatter", |s| Coll::Scatter { root: s.root }, root: usize
);
custom_op!(
    /// The tensor to rank `peer`, which receives it ([`Recv`]) with its shape and type; the
    /// output is empty. A pipeline stage's hand-off.
    Send, "unicomm-send", |s| Coll::Send { peer: s.peer }, peer: usize
);
custom_op!(
    /// A tensor from rank `peer` ([`Send`]), of the input's shape and type (the input's
    /// values are not read: a broadcast one-element tensor will do).
    Recv, "unicomm-recv", |s| Coll::Recv { peer: s.peer }, peer: usize
);
