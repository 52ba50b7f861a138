//! The query, key and value projections of grouped-query attention as one column-parallel
//! layer: one matrix product per call instead of three, each rank holding its query heads
//! and the key/value heads they attend with (Megatron-LM's and vLLM's `QKVParallelLinear`).

use candle_core::{Module, Result, Tensor};

use crate::comm::Communicator;
use crate::layers::linear;

/// `[q | k | v] = x [Wq_r; Wk_r; Wv_r]^T (+ b)` for this rank's heads: query heads
/// `rank * q / world ..` (the query heads must divide evenly over the ranks), and the key
/// and value heads those attend with: `kv / world` of them each where the key/value heads
/// divide evenly, else one, replicated on `world / kv` ranks (the ranks must then be a
/// multiple of them). No communication: the attention that follows is per head, and a
/// row-parallel output projection sums the ranks' parts.
#[derive(Clone, Debug)]
pub struct QkvColumnLinear {
    weight: Tensor,
    bias: Option<Tensor>,
    /// This rank's query heads and key/value heads.
    heads: (usize, usize),
    head_dim: usize,
}

/// The query, key and value projections (or their biases), whole.
#[derive(Clone, Copy, Debug)]
pub struct Qkv<'t> {
    /// `[q_heads * head_dim, in]` (a bias: `[q_heads * head_dim]`).
    pub q: &'t Tensor,
    /// `[kv_heads * head_dim, in]`.
    pub k: &'t Tensor,
    /// `[kv_heads * head_dim, in]`.
    pub v: &'t Tensor,
}

impl QkvColumnLinear {
    /// From the full projections (and their biases): this rank's rows of each, fused into
    /// one weight.
    pub fn from_full(
        weights: Qkv<'_>,
        bias: Option<Qkv<'_>>,
        head_dim: usize,
        comm: &Communicator,
    ) -> Result<Self> {
        let (rank, world) = (comm.rank(), comm.world_size());
        let heads_of = |w: &Tensor, what: &str| -> Result<usize> {
            let rows = w.dim(0)?;
            if head_dim == 0 || rows % head_dim != 0 {
                candle_core::bail!(
                    "unicomm-candle QkvColumnLinear: {what} has {rows} rows, not a multiple of the head dimension {head_dim}"
                );
            }
            Ok(rows / head_dim)
        };
        let Qkv {
            q: wq,
            k: wk,
            v: wv,
        } = weights;
        let (q, kv) = (heads_of(wq, "wq")?, heads_of(wk, "wk")?);
        if heads_of(wv, "wv")? != kv {
            candle_core::bail!(
                "unicomm-candle QkvColumnLinear: wk and wv hold different numbers of heads"
            );
        }
        if q % world != 0 || kv == 0 || q % kv != 0 {
            candle_core::bail!(
                "unicomm-candle QkvColumnLinear: {q} query heads over {world} ranks and {kv} key/value heads (the query heads must divide evenly over the ranks and over the key/value heads)"
            );
        }
        let (q_local, (kv_first, kv_local)) = (q / world, kv_part(kv, rank, world)?);
        let rows = |t: &Tensor, first: usize, n: usize| t.narrow(0, first * head_dim, n * head_dim);
        let part = |t: Qkv<'_>| -> Result<Tensor> {
            Tensor::cat(
                &[
                    rows(t.q, rank * q_local, q_local)?,
                    rows(t.k, kv_first, kv_local)?,
                    rows(t.v, kv_first, kv_local)?,
                ],
                0,
            )?
            .contiguous()
        };
        Ok(QkvColumnLinear {
            weight: part(weights)?,
            bias: bias.map(part).transpose()?,
            heads: (q_local, kv_local),
            head_dim,
        })
    }

    /// This rank's query heads and key/value heads.
    pub fn heads(&self) -> (usize, usize) {
        self.heads
    }

    /// This rank's `(q, k, v)` for `x` `[.., in]`: `[.., q_heads * head_dim]` and `[..,
    /// kv_heads * head_dim]` twice, from one matrix product.
    pub fn forward_qkv(&self, x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let y = self.forward(x)?;
        let last = y.rank() - 1;
        let (q, kv) = (self.heads.0 * self.head_dim, self.heads.1 * self.head_dim);
        Ok((
            y.narrow(last, 0, q)?,
            y.narrow(last, q, kv)?,
            y.narrow(last, q + kv, kv)?,
        ))
    }
}

/// The key/value heads rank `rank` of `world` holds: `(first, count)`.
fn kv_part(kv: usize, rank: usize, world: usize) -> Result<(usize, usize)> {
    if kv >= world {
        if !kv.is_multiple_of(world) {
            candle_core::bail!(
                "unicomm-candle QkvColumnLinear: {kv} key/value heads do not divide over {world} ranks"
            );
        }
        return Ok((rank * (kv / world), kv / world));
    }
    if !world.is_multiple_of(kv) {
        candle_core::bail!(
            "unicomm-candle QkvColumnLinear: {world} ranks are not a multiple of the {kv} key/value heads they replicate"
        );
    }
    Ok((rank / (world / kv), 1))
}

impl Module for QkvColumnLinear {
    /// `[q | k | v]` concatenated along the last dimension.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        linear(x, &self.weight, self.bias.as_ref())
    }
}
