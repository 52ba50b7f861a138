//! Pipeline parallelism over tensor parallelism on unicomm-candle: a world of 4 ranks as 2
//! pipeline stages of 2 tensor-parallel ranks (PyTorch's `[("pp", 2), ("tp", 2)]` mesh: tp
//! groups {0, 1} and {2, 3}, pp pairs {0, 2} and {1, 3}). Each stage is a residual MLP block
//! (a column-parallel layer, SiLU, a row-parallel layer summing over the stage's tp group);
//! stage 0 hands its activations to stage 1 with `send`/`recv` over the pp communicator,
//! micro-batch by micro-batch, and stage 1 hands the results back, so every rank checks the
//! pipeline's output against the unsharded forward of the same weights.
//!
//! - threads of one process: `cargo xtask run --vendor mock --example pipeline_tp`;
//! - one rank per process: `cargo xtask run --procs 4 --vendor mock --example pipeline_tp`;
//!   on one GPU in NCCL's multi-rank mode, `cargo xtask launch --procs 4 --share-gpu --
//!   pipeline_tp --vendor cuda` (built with the `cuda` feature).
//!
//! Tolerance against the unsharded forward: 1e-4 (f32; the row-parallel sum adds the
//! ranks' partial products in another order).

use std::sync::Arc;

use anyhow::{bail, Context as _};
use candle_core::{DType, Device, Module, Tensor};
use unicomm::Vendor;
use unicomm_candle::{
    layers::linear, Communicator, TensorParallelColumnLinear, TensorParallelRowLinear,
};

const STAGES: usize = 2;
const TP: usize = 2;
const HIDDEN: usize = 16;
const FFN: usize = 32;
const MICRO_BATCHES: usize = 3;
const ROWS: usize = 4;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let mut vendor = Vendor::Auto;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--vendor" => vendor = it.next().context("--vendor needs a value")?.parse()?,
            other => bail!("unknown argument {other} (--vendor V)"),
        }
    }
    let vendor = match unicomm::resolve(vendor) {
        Ok((v, _)) => v,
        Err(unicomm::Error::NoDevice { .. }) if vendor == Vendor::Auto => Vendor::Mock,
        Err(e) => return Err(e.into()),
    };
    if std::env::var_os("WORLD_SIZE").is_some() {
        let local: usize = std::env::var("LOCAL_RANK").map_or(Ok(0), |v| v.parse())?;
        let diff = rank(unicomm::from_env(vendor)?, &device(vendor, local)?)?;
        println!("pipeline_tp: rank {} process on {vendor}: equals the unsharded forward (max |diff| {diff:.2e})", std::env::var("RANK")?);
        return Ok(());
    }
    let comms = unicomm::local_comms_n(vendor, Some(STAGES * TP))?;
    let diffs = unicomm::each_rank(comms, |c| rank(c, &device(vendor, 0)?))?;
    let worst = diffs.iter().copied().fold(0.0, f32::max);
    println!(
        "pipeline_tp: {STAGES} stages x {TP} tensor-parallel ranks as threads on {vendor}: every rank equals the unsharded forward (max |diff| {worst:.2e} <= 1e-4)"
    );
    Ok(())
}

fn device(vendor: Vendor, local: usize) -> anyhow::Result<Device> {
    match vendor {
        Vendor::Mock => Ok(Device::Cpu),
        #[cfg(feature = "cuda")]
        Vendor::Cuda => Ok(Device::new_cuda(local)?),
        v => {
            let _ = local;
            bail!("{v}: this build runs candle's CPU tensors only (build with --features cuda for NCCL)")
        }
    }
}

/// A stage's weights, the same on every rank (from a seed): `(w1 [FFN, HIDDEN], w2 [HIDDEN,
/// FFN])`.
fn weights(stage: usize, dev: &Device) -> candle_core::Result<(Tensor, Tensor)> {
    let w = |rows: usize, cols: usize, seed: f64| {
        Tensor::arange(0f32, (rows * cols) as f32, dev)?
            .affine(0.37, seed)?
            .sin()?
            .affine(1.0 / (cols as f64).sqrt(), 0.0)?
            .reshape((rows, cols))
    };
    Ok((
        w(FFN, HIDDEN, stage as f64)?,
        w(HIDDEN, FFN, 10.0 + stage as f64)?,
    ))
}

/// The micro-batches of the input, the same on every rank.
fn input(dev: &Device) -> candle_core::Result<Vec<Tensor>> {
    (0..MICRO_BATCHES)
        .map(|m| {
            Tensor::arange(0f32, (ROWS * HIDDEN) as f32, dev)?
                .affine(0.05, m as f64)?
                .cos()?
                .reshape((ROWS, HIDDEN))
        })
        .collect()
}

/// `x + W2 silu(W1 x)`, unsharded.
fn block(x: &Tensor, (w1, w2): &(Tensor, Tensor)) -> candle_core::Result<Tensor> {
    x + linear(&silu(&linear(x, w1, None)?)?, w2, None)?
}

fn silu(x: &Tensor) -> candle_core::Result<Tensor> {
    x / (x.neg()?.exp()? + 1.0)?
}

/// This rank's part of the pipeline: its stage's block over its tp group, the hand-offs
/// over its pp pair; the largest difference of the pipeline's output from the unsharded
/// forward.
fn rank(world: unicomm::Comm, dev: &Device) -> anyhow::Result<f32> {
    if world.world_size() != STAGES * TP {
        bail!(
            "pipeline_tp runs on {} ranks, not {}",
            STAGES * TP,
            world.world_size()
        );
    }
    let r = world.rank();
    let (stage, t) = (r / TP, r % TP);
    let tp = world
        .split(Some(stage as u32), t as i32)?
        .context("a tp group")?;
    let pp = world
        .split(Some(t as u32), stage as i32)?
        .context("a pp pair")?;
    let (tp, pp) = (Communicator::new(tp), Communicator::new(pp));
    let full: Vec<(Tensor, Tensor)> = (0..STAGES)
        .map(|s| weights(s, dev))
        .collect::<candle_core::Result<_>>()?;
    let (w1, w2) = &full[stage];
    let up = TensorParallelColumnLinear::from_full(w1, None, &tp)?;
    let down = TensorParallelRowLinear::from_full(w2, None, &tp)?;
    let mine =
        |x: &Tensor| -> candle_core::Result<Tensor> { x + down.forward(&silu(&up.forward(x)?)?)? };
    let mut worst = 0f32;
    for (m, x) in input(dev)?.iter().enumerate() {
        let want = full.iter().try_fold(x.clone(), |h, w| block(&h, w))?;
        let got = pipeline(&pp, stage, x, &mine, dev)?;
        let diff = (got - &want)?
            .abs()?
            .flatten_all()?
            .max(0)?
            .to_scalar::<f32>()?;
        if diff.is_nan() || diff > 1e-4 {
            bail!("rank {r} (stage {stage}), micro-batch {m}: differs from the unsharded forward by {diff:e}");
        }
        worst = worst.max(diff);
    }
    Ok(worst)
}

/// One micro-batch through the two stages: stage 0's output to stage 1 (its pp peer, rank
/// 1 of the pair), stage 1's back to stage 0, so both hold the pipeline's output.
fn pipeline(
    pp: &Arc<Communicator>,
    stage: usize,
    x: &Tensor,
    block: &dyn Fn(&Tensor) -> candle_core::Result<Tensor>,
    dev: &Device,
) -> candle_core::Result<Tensor> {
    let shape = x.dims().to_vec();
    if stage == 0 {
        pp.send(&block(x)?, 1)?;
        pp.recv(shape, DType::F32, dev, 1)
    } else {
        let h = pp.recv(shape, DType::F32, dev, 0)?;
        let y = block(&h)?;
        pp.send(&y, 0)?;
        Ok(y)
    }
}
