//! Tensor-parallel layers (Megatron-LM's layout, as candle's multi-GPU Llama example lays
//! it out): a column-parallel linear layer keeps its part of the outputs, a row-parallel
//! one sums its partial products over the ranks, and a vocabulary-parallel embedding looks
//! up the rows it holds and sums.

use std::sync::Arc;

use candle_core::{DType, Module, Result, Tensor};

use crate::comm::Communicator;
use crate::ops::Reduce;

/// Which part of a full tensor a rank holds: the `rank`-th of `world_size` equal parts
/// along `dim`, as candle-nn's `ShardedVarBuilder` loads a weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// The dimension that is cut.
    pub dim: usize,
    /// Which part.
    pub rank: usize,
    /// How many parts.
    pub world_size: usize,
}

impl Shard {
    /// The part `comm`'s rank holds along `dim`.
    pub fn of_rank(dim: usize, comm: &Communicator) -> Self {
        Shard {
            dim,
            rank: comm.rank(),
            world_size: comm.world_size(),
        }
    }

    /// This part of `full` (contiguous); the dimension must divide evenly.
    pub fn narrow(&self, full: &Tensor) -> Result<Tensor> {
        let size = full.dim(self.dim)?;
        if self.world_size == 0 || self.rank >= self.world_size || size % self.world_size != 0 {
            candle_core::bail!(
                "unicomm-candle: part {} of {} of dimension {} of {:?} (size {size} must divide evenly)",
                self.rank,
                self.world_size,
                self.dim,
                full.shape()
            );
        }
        let part = size / self.world_size;
        full.narrow(self.dim, self.rank * part, part)?.contiguous()
    }
}

/// `y = x W^T (+ b)` for this rank's rows of `W` (`[out / world, in]`): the output's last
/// dimension is this rank's part of the features. No communication: the next layer is
/// row-parallel, or `Communicator::all_gather` along the last dimension joins the parts.
#[derive(Clone, Debug)]
pub struct TensorParallelColumnLinear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl TensorParallelColumnLinear {
    /// From this rank's shards (`weight` `[out / world, in]`, `bias` `[out / world]`).
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        TensorParallelColumnLinear { weight, bias }
    }

    /// From the full weight `[out, in]` (and bias `[out]`): this rank's rows.
    pub fn from_full(weight: &Tensor, bias: Option<&Tensor>, comm: &Communicator) -> Result<Self> {
        let shard = Shard::of_rank(0, comm);
        Ok(Self::new(
            shard.narrow(weight)?,
            bias.map(|b| shard.narrow(b)).transpose()?,
        ))
    }
}

impl Module for TensorParallelColumnLinear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        linear(x, &self.weight, self.bias.as_ref())
    }
}

/// `y = sum over ranks of x_r W_r^T (+ b)` for this rank's columns of `W` (`[out, in /
/// world]`) and its part of the input's features `x_r`: one sum all-reduce per call, then
/// the bias (held whole, added once).
#[derive(Clone, Debug)]
pub struct TensorParallelRowLinear {
    weight: Tensor,
    bias: Option<Tensor>,
    comm: Arc<Communicator>,
}

impl TensorParallelRowLinear {
    /// From this rank's shard (`weight` `[out, in / world]`) and the whole bias `[out]`.
    pub fn new(weight: Tensor, bias: Option<Tensor>, comm: Arc<Communicator>) -> Self {
        TensorParallelRowLinear { weight, bias, comm }
    }

    /// From the full weight `[out, in]`: this rank's columns.
    pub fn from_full(
        weight: &Tensor,
        bias: Option<&Tensor>,
        comm: &Arc<Communicator>,
    ) -> Result<Self> {
        let w = Shard::of_rank(1, comm).narrow(weight)?;
        Ok(Self::new(w, bias.cloned(), comm.clone()))
    }
}

impl TensorParallelRowLinear {
    /// This rank's partial product `x W_r^T`, before the sum over the ranks (and without
    /// the bias): what a fused all-reduce + norm
    /// ([`Communicator::all_reduce_rms_norm`]) takes.
    pub fn forward_partial(&self, x: &Tensor) -> Result<Tensor> {
        linear(x, &self.weight, None)
    }

    /// The bias, added once after the sum.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }
}

impl Module for TensorParallelRowLinear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let partial = linear(x, &self.weight, None)?;
        let y = self.comm.all_reduce(&partial, Reduce::Sum)?;
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

/// An embedding whose vocabulary is cut over the ranks (`[vocab / world, hidden]` each):
/// each rank looks up the ids it holds (zeros for the others), and a sum all-reduce joins
/// them, so every rank gets every row.
#[derive(Clone, Debug)]
pub struct ShardedEmbedding {
    table: Tensor,
    first: usize,
    comm: Arc<Communicator>,
}

impl ShardedEmbedding {
    /// From this rank's rows of the table, which start at vocabulary id `first`.
    pub fn new(table: Tensor, first: usize, comm: Arc<Communicator>) -> Self {
        ShardedEmbedding { table, first, comm }
    }

    /// From the full table `[vocab, hidden]`: this rank's rows.
    pub fn from_full(table: &Tensor, comm: &Arc<Communicator>) -> Result<Self> {
        let shard = Shard::of_rank(0, comm);
        let rows = table.dim(0)? / comm.world_size();
        Ok(Self::new(
            shard.narrow(table)?,
            shard.rank * rows,
            comm.clone(),
        ))
    }
}

impl Module for ShardedEmbedding {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let (rows, hidden) = self.table.dims2()?;
        let flat = ids.flatten_all()?.to_dtype(DType::I64)?;
        let local = flat.broadcast_sub(&Tensor::new(self.first as i64, ids.device())?)?;
        let inside = local.ge(0i64)?.mul(&local.lt(rows as i64)?)?;
        let picked = self
            .table
            .index_select(&local.clamp(0i64, rows as i64 - 1)?, 0)?
            .broadcast_mul(&inside.to_dtype(self.table.dtype())?.unsqueeze(1)?)?;
        let all = self.comm.all_reduce(&picked, Reduce::Sum)?;
        let mut dims = ids.dims().to_vec();
        dims.push(hidden);
        all.reshape(dims)
    }
}

/// `x W^T (+ b)` over any leading dimensions of `x`, what every layer here computes.
/// candle's CPU backend has no bf16 matrix product, so there a bf16 product is computed in
/// f32 and rounded back to bf16 (the result as a bf16 accumulation would give, or closer);
/// on CUDA it is cuBLAS's bf16 product.
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let y = if x.dtype() == DType::BF16 && x.device().is_cpu() {
        x.to_dtype(DType::F32)?
            .broadcast_matmul(&w.to_dtype(DType::F32)?.t()?)?
            .to_dtype(DType::BF16)?
    } else {
        x.broadcast_matmul(&w.t()?)?
    };
    match b {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}
