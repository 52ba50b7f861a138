//! A Llama-style decoder block (RMSNorm, attention with grouped-query heads and rotary
//! embeddings, a SwiGLU MLP), written once for the unsharded forward and the
//! tensor-parallel one: only the linear layers and the local head counts differ.
//! Weights are drawn from a seed (nothing downloaded).

use std::sync::Arc;

use candle_core::{DType, Device, Module, Result, Tensor, D};
use unicomm_candle::{
    Communicator, FusedNorm, TensorParallelColumnLinear, TensorParallelRowLinear,
};

/// The block's sizes: small, but with every feature of the real one (grouped-query heads,
/// a head dimension split in halves by the rotary embedding, an MLP wider than the model).
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub intermediate: usize,
    pub eps: f64,
    pub rope_theta: f64,
}

impl Config {
    /// 8 query heads over 4 key/value heads: shardable over 1, 2 and 4 ranks.
    pub fn small() -> Self {
        Config {
            hidden: 64,
            heads: 8,
            kv_heads: 4,
            intermediate: 176,
            eps: 1e-5,
            rope_theta: 10_000.0,
        }
    }
    fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}

/// The full weights, as a checkpoint holds them (`[out, in]` for the linear layers).
pub struct Weights {
    pub attn_norm: Tensor,
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub o: Tensor,
    pub mlp_norm: Tensor,
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
}

/// splitmix64: the same numbers on every machine and rank.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0 // in [-1, 1)
    }
    /// `rows x cols` uniform in `[-scale, scale)`.
    fn tensor(&mut self, dims: &[usize], scale: f32, dtype: DType, dev: &Device) -> Result<Tensor> {
        let n = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|_| self.next() * scale).collect();
        Tensor::from_vec(v, dims, dev)?.to_dtype(dtype)
    }
}

impl Weights {
    /// Drawn from `seed`: linear weights uniform in `±1/sqrt(fan_in)`, norms near one.
    pub fn seeded(cfg: &Config, seed: u64, dtype: DType, dev: &Device) -> Result<Self> {
        let mut r = Rng(seed);
        let (h, kvd, i) = (cfg.hidden, cfg.kv_heads * cfg.head_dim(), cfg.intermediate);
        let fan = |n: usize| 1.0 / (n as f32).sqrt();
        let norm = |r: &mut Rng| -> Result<Tensor> {
            (r.tensor(&[h], 0.1, DType::F32, dev)? + 1.0)?.to_dtype(dtype)
        };
        Ok(Weights {
            attn_norm: norm(&mut r)?,
            q: r.tensor(&[h, h], fan(h), dtype, dev)?,
            k: r.tensor(&[kvd, h], fan(h), dtype, dev)?,
            v: r.tensor(&[kvd, h], fan(h), dtype, dev)?,
            o: r.tensor(&[h, h], fan(h), dtype, dev)?,
            mlp_norm: norm(&mut r)?,
            gate: r.tensor(&[i, h], fan(h), dtype, dev)?,
            up: r.tensor(&[i, h], fan(h), dtype, dev)?,
            down: r.tensor(&[h, i], fan(i), dtype, dev)?,
        })
    }

    /// The input: `seq` positions of the hidden size, from `seed`.
    pub fn input(
        cfg: &Config,
        seq: usize,
        seed: u64,
        dtype: DType,
        dev: &Device,
    ) -> Result<Tensor> {
        Rng(seed).tensor(&[seq, cfg.hidden], 1.0, dtype, dev)
    }
}

/// The model the example and its tests run, on every rank alike: `LAYERS` blocks of seeded
/// weights, unsharded and this rank's part of them, and an input of `SEQ` positions. The
/// fused blocks' workspaces borrow the communicator (`'c`).
pub struct Model<'c> {
    pub full: Vec<Block<'c>>,
    pub sharded: Vec<Block<'c>>,
    /// The sharded blocks with their fused all-reduce + residual add + norm, or why the
    /// backend has none here (its `Unsupported`).
    pub fused: std::result::Result<Vec<Block<'c>>, unicomm::Error>,
    pub input: Tensor,
}

pub const LAYERS: usize = 2;
pub const SEQ: usize = 7;

impl<'c> Model<'c> {
    pub fn new(comm: &'c Arc<Communicator>, dtype: DType, dev: &Device) -> Result<Self> {
        let cfg = Config::small();
        let (mut full, mut sharded, mut fused) = (Vec::new(), Vec::new(), Ok(Vec::new()));
        for l in 0..LAYERS {
            let w = Weights::seeded(&cfg, 1000 + l as u64, dtype, dev)?;
            full.push(Block::full(cfg, &w));
            sharded.push(Block::sharded(cfg, &w, comm)?);
            if fused.is_ok() {
                let b = match Block::sharded_fused(cfg, &w, comm, SEQ * cfg.hidden) {
                    Ok(b) => Ok(b),
                    Err(e) => match unicomm_candle::unicomm_error(&e) {
                        Some(u @ unicomm::Error::Unsupported { .. }) => Err(u.clone()),
                        _ => return Err(e),
                    },
                };
                fused = fused.and_then(|mut v: Vec<Block<'c>>| {
                    b.map(|b| {
                        v.push(b);
                        v
                    })
                });
            }
        }
        let input = Weights::input(&cfg, SEQ, 7, dtype, dev)?;
        Ok(Model {
            full,
            sharded,
            fused,
            input,
        })
    }
}

/// `x` through `blocks` in order.
pub fn forward(blocks: &[Block<'_>], x: &Tensor) -> Result<Tensor> {
    blocks.iter().try_fold(x.clone(), |x, b| b.forward(&x))
}

/// `x W^T`: the unsharded layers.
struct Plain(Tensor);

impl Module for Plain {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        unicomm_candle::layers::linear(x, &self.0, None)
    }
}

/// The block, with its linear layers and the heads this rank computes.
pub struct Block<'c> {
    cfg: Config,
    heads: usize,
    kv_heads: usize,
    attn_norm: Tensor,
    mlp_norm: Tensor,
    q: Box<dyn Module>,
    k: Box<dyn Module>,
    v: Box<dyn Module>,
    o: Box<dyn Module>,
    gate: Box<dyn Module>,
    up: Box<dyn Module>,
    down: Box<dyn Module>,
    /// The output projection's shard and the workspace of its communicator, where the
    /// block fuses its sum all-reduce with the residual add and the MLP's norm
    /// (`Block::sharded_fused`).
    fused: Option<(TensorParallelRowLinear, FusedNorm<'c>)>,
}

impl<'c> Block<'c> {
    /// The unsharded block: every head, plain matrix products.
    pub fn full(cfg: Config, w: &Weights) -> Self {
        let m = |t: &Tensor| -> Box<dyn Module> { Box::new(Plain(t.clone())) };
        Block {
            cfg,
            heads: cfg.heads,
            kv_heads: cfg.kv_heads,
            attn_norm: w.attn_norm.clone(),
            mlp_norm: w.mlp_norm.clone(),
            q: m(&w.q),
            k: m(&w.k),
            v: m(&w.v),
            o: m(&w.o),
            gate: m(&w.gate),
            up: m(&w.up),
            down: m(&w.down),
            fused: None,
        }
    }

    /// This rank's part of the block (Megatron's layout): the query, key, value, gate and up
    /// projections by output rows (whole heads per rank), the output and down projections
    /// by input columns, each followed by a sum all-reduce.
    pub fn sharded(cfg: Config, w: &Weights, comm: &Arc<Communicator>) -> Result<Self> {
        let world = comm.world_size();
        if !cfg.kv_heads.is_multiple_of(world) || !cfg.intermediate.is_multiple_of(world) {
            candle_core::bail!("{world} ranks do not divide the heads and the MLP evenly");
        }
        let col = |t: &Tensor| -> Result<Box<dyn Module>> {
            Ok(Box::new(TensorParallelColumnLinear::from_full(
                t, None, comm,
            )?))
        };
        let row = |t: &Tensor| -> Result<Box<dyn Module>> {
            Ok(Box::new(TensorParallelRowLinear::from_full(t, None, comm)?))
        };
        Ok(Block {
            cfg,
            heads: cfg.heads / world,
            kv_heads: cfg.kv_heads / world,
            attn_norm: w.attn_norm.clone(),
            mlp_norm: w.mlp_norm.clone(),
            q: col(&w.q)?,
            k: col(&w.k)?,
            v: col(&w.v)?,
            o: row(&w.o)?,
            gate: col(&w.gate)?,
            up: col(&w.up)?,
            down: row(&w.down)?,
            fused: None,
        })
    }

    /// [`Block::sharded`], its output projection's all-reduce fused with the residual add
    /// and the MLP's RMSNorm in one of unicomm's symmetric kernels, on a workspace of
    /// `capacity` elements made here once (collectively) for every forward.
    pub fn sharded_fused(
        cfg: Config,
        w: &Weights,
        comm: &'c Arc<Communicator>,
        capacity: usize,
    ) -> Result<Self> {
        let mut b = Self::sharded(cfg, w, comm)?;
        let norm = comm.fused_norm(w.mlp_norm.dtype(), capacity)?;
        b.fused = Some((TensorParallelRowLinear::from_full(&w.o, None, comm)?, norm));
        Ok(b)
    }

    /// `x` (`[seq, hidden]`) through the block: attention then MLP, each with its residual.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Some((o, norm)) = &self.fused {
            let attn = self.attention(&rms_norm(x, &self.attn_norm, self.cfg.eps)?)?;
            let partial = o.forward_partial(&attn)?;
            let eps = self.cfg.eps as f32;
            let (h, x) = norm.all_reduce_rms_norm(&partial, x, &self.mlp_norm, eps)?;
            let mlp = (self.gate.forward(&h)?.silu()? * self.up.forward(&h)?)?;
            return x + self.down.forward(&mlp)?;
        }
        let x = (x + self.o.forward(&self.attention(&rms_norm(
            x,
            &self.attn_norm,
            self.cfg.eps,
        )?)?)?)?;
        let h = rms_norm(&x, &self.mlp_norm, self.cfg.eps)?;
        let mlp = (self.gate.forward(&h)?.silu()? * self.up.forward(&h)?)?;
        x + self.down.forward(&mlp)?
    }

    /// Causal attention of this rank's heads over `h` (`[seq, hidden]`): `[seq, heads x
    /// head_dim]`.
    fn attention(&self, h: &Tensor) -> Result<Tensor> {
        let (seq, _) = h.dims2()?;
        let hd = self.cfg.head_dim();
        let heads = |t: Tensor, n: usize| -> Result<Tensor> {
            t.reshape((seq, n, hd))?.transpose(0, 1)?.contiguous()
        };
        let (cos, sin) = rope_tables(seq, hd, self.cfg.rope_theta, h)?;
        let q = rope(&heads(self.q.forward(h)?, self.heads)?, &cos, &sin)?;
        let k = rope(&heads(self.k.forward(h)?, self.kv_heads)?, &cos, &sin)?;
        let v = heads(self.v.forward(h)?, self.kv_heads)?;
        // Grouped-query attention: each key/value head serves `heads / kv_heads` queries.
        let rep = self.heads / self.kv_heads;
        let repeat = |t: &Tensor| -> Result<Tensor> {
            t.unsqueeze(1)?
                .expand((self.kv_heads, rep, seq, hd))?
                .reshape((self.heads, seq, hd))
        };
        // The scores and their softmax in f32, as Llama's reference code computes them.
        let f32 = |t: Tensor| t.to_dtype(DType::F32);
        let (q, k, v) = (f32(q)?, f32(repeat(&k)?)?, f32(repeat(&v)?)?);
        let scores = (q.matmul(&k.t()?)? / (hd as f64).sqrt())?;
        let mask: Vec<f32> = (0..seq)
            .flat_map(|i| (0..seq).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 }))
            .collect();
        let mask = Tensor::from_vec(mask, (seq, seq), h.device())?;
        let p = softmax_last(&scores.broadcast_add(&mask)?)?;
        p.matmul(&v)?
            .transpose(0, 1)?
            .reshape((seq, self.heads * hd))?
            .to_dtype(h.dtype())
    }
}

/// `x / rms(x) * w`, computed in f32.
fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let x32 = x.to_dtype(DType::F32)?;
    let rms = (x32.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?;
    x32.broadcast_div(&rms)?
        .to_dtype(x.dtype())?
        .broadcast_mul(w)
}

fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let e = x.broadcast_sub(&x.max_keepdim(D::Minus1)?)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// The rotary tables `[seq, head_dim]` (the halves layout of Hugging Face's Llama).
fn rope_tables(seq: usize, hd: usize, theta: f64, like: &Tensor) -> Result<(Tensor, Tensor)> {
    let half = hd / 2;
    let mut angles = Vec::with_capacity(seq * hd);
    for p in 0..seq {
        for i in 0..hd {
            let f = 1.0 / theta.powf((2 * (i % half)) as f64 / hd as f64);
            angles.push((p as f64 * f) as f32);
        }
    }
    let a = Tensor::from_vec(angles, (seq, hd), like.device())?;
    Ok((
        a.cos()?.to_dtype(like.dtype())?,
        a.sin()?.to_dtype(like.dtype())?,
    ))
}

/// `x * cos + rotate_half(x) * sin` for `x` `[heads, seq, head_dim]`.
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
}
