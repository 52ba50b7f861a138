//! # unicomm-candle
//!
//! unicomm's collectives as candle ops, so that an engine's tensor-parallel code runs on
//! candle's CPU tensors over unicomm's mock (in CI, without a GPU) and on candle's CUDA
//! tensors over NCCL with the same code.
//!
//! ```
//! use std::sync::Arc;
//! use candle_core::{Device, Tensor};
//! use unicomm_candle::{Communicator, Reduce};
//!
//! # std::env::set_var("UNICOMM_MOCK_RANKS", "2");
//! let comms = unicomm::local_comms(unicomm::Vendor::Mock)?;
//! let sums = unicomm::each_rank(comms, |comm| -> candle_core::Result<Vec<f32>> {
//!     let comm = Communicator::new(comm);
//!     let x = Tensor::new(&[1f32, 2.0, 3.0], &Device::Cpu)?;
//!     comm.all_reduce(&x, Reduce::Sum)?.to_vec1::<f32>()
//! })?;
//! assert_eq!(sums, vec![vec![2.0, 4.0, 6.0]; 2]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - [`Communicator`] is one rank's communicator as candle sees it: `Send + Sync`, its calls
//!   serialised (two threads of one rank never interleave the halves of two collectives).
//! - [`AllReduce`], [`AllGather`], [`ReduceScatter`], [`AllToAll`], [`Broadcast`],
//!   [`Gather`], [`Scatter`], [`Send`] and [`Recv`] are candle
//!   [`CustomOp1`](candle_core::CustomOp1)s along dimension 0 of a contiguous tensor (f32,
//!   f64, f16, bf16, u8, u32, i32, i64); the [`Communicator`]'s methods take any dimension and
//!   make the input contiguous. Every rank's input to a collective has the same type and
//!   shape (compared on the CPU path, and on CUDA with `UNICOMM_CHECK_COLLECTIVES=1`).
//! - [`layers`]: [`TensorParallelColumnLinear`], [`TensorParallelRowLinear`] and
//!   [`ShardedEmbedding`], built from a full weight and a [`Shard`] as candle-nn's
//!   `ShardedVarBuilder` loads them; [`QkvColumnLinear`], grouped-query attention's
//!   query/key/value projections fused into one column-parallel product.
//! - [`ExpertParallelMoe`]: a mixture-of-experts layer with its experts spread over the
//!   ranks, over unicomm's dispatch and combine; [`moe_reference`] is the same layer
//!   unsharded.
//!
//! On the CPU the op lends candle's storage and the output's vector to the mock for the
//! call (`unicomm::host_scope`): no copy where the ranks are threads of one process, a copy
//! in and out where they are processes (shared memory). On CUDA (feature `cuda`) the op lends candle's
//! slices to NCCL and runs on candle's stream: no copy, no host synchronisation.
//!
//! Errors: unicomm's [`Error`](unicomm::Error) travels inside candle's
//! ([`candle_core::Error::Wrapped`]); [`unicomm_error`] finds it again.

#![deny(unsafe_code)]

mod comm;
mod fused;
pub mod layers;
mod methods;
mod moe;
mod ops;
mod qkv;
mod workspace;

pub use comm::{unicomm_error, Communicator};
pub use fused::FusedNorm;
pub use layers::{Shard, ShardedEmbedding, TensorParallelColumnLinear, TensorParallelRowLinear};
pub use moe::{moe_reference, moe_reference_masked, ExpertParallelMoe};
pub use ops::{
    AllGather, AllReduce, AllToAll, Broadcast, Gather, Recv, Reduce, ReduceScatter, Scatter, Send,
};
pub use qkv::{Qkv, QkvColumnLinear};
