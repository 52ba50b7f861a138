//! An expert-parallel mixture-of-experts layer on unicomm-candle: 16 experts spread over 4
//! ranks (4 each), a router choosing the top 3 a token, each rank a batch of tokens of its
//! own; every rank checks its layer's output against the unsharded layer's on the same
//! tokens (`moe_reference`), over several steps.
//!
//! - threads of one process: `cargo xtask run --vendor mock --example moe_ep`;
//! - one rank per process: `cargo xtask run --procs 4 --vendor mock --example moe_ep`.
//!
//! Candle's CPU tensors over the mock; a GPU backend answers `Unsupported` (unicomm's
//! expert kernels are not built for GPUs yet). Tolerance: 1e-5 (f32; an expert's product of
//! one token alone and of a batch may round differently).

use anyhow::{bail, Context as _};
use candle_core::{Device, Tensor};
use unicomm::Vendor;
use unicomm_candle::{moe_reference, Communicator};

const RANKS: usize = 4;
const EXPERTS: usize = 16;
const HIDDEN: usize = 32;
const TOP_K: usize = 3;
const MAX_TOKENS: usize = 24;
const STEPS: usize = 4;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let mut vendor = Vendor::Mock;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--vendor" => vendor = it.next().context("--vendor needs a value")?.parse()?,
            other => bail!("unknown argument {other} (--vendor V)"),
        }
    }
    if std::env::var_os("WORLD_SIZE").is_some() {
        let diff = rank(unicomm::from_env(vendor)?)?;
        println!("moe_ep: rank {} process on {vendor}: equals the unsharded layer (max |diff| {diff:.2e})", std::env::var("RANK")?);
        return Ok(());
    }
    let comms = unicomm::local_comms_n(vendor, Some(RANKS))?;
    let diffs = unicomm::each_rank(comms, rank)?;
    let worst = diffs.iter().copied().fold(0.0, f32::max);
    println!(
        "moe_ep: {EXPERTS} experts over {RANKS} ranks as threads on {vendor}, top-{TOP_K}: every rank equals the unsharded layer (max |diff| {worst:.2e} <= 1e-5)"
    );
    Ok(())
}

/// A `[rows, cols]` tensor from a seed, the same on every rank.
fn seeded(rows: usize, cols: usize, seed: f64) -> candle_core::Result<Tensor> {
    Tensor::arange(0f32, (rows * cols) as f32, &Device::Cpu)?
        .affine(0.37, seed)?
        .sin()?
        .affine(1.0 / (cols as f64).sqrt(), 0.0)?
        .reshape((rows, cols))
}

fn rank(c: unicomm::Comm) -> anyhow::Result<f32> {
    let c = Communicator::new(c);
    let router = seeded(EXPERTS, HIDDEN, 0.5)?;
    let experts = (0..EXPERTS)
        .map(|e| seeded(HIDDEN, HIDDEN, 3.0 + e as f64))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let moe = c.expert_parallel_moe(&router, &experts, TOP_K, MAX_TOKENS)?;
    let mut worst = 0f32;
    for step in 0..STEPS {
        let n = 8 + (c.rank() * 5 + step * 3) % 16;
        let x = seeded(n, HIDDEN, 100.0 + (c.rank() * STEPS + step) as f64)?;
        let got = moe.forward(&x)?;
        let want = moe_reference(&x, &router, &experts, TOP_K)?;
        let diff = (got - want)?
            .abs()?
            .flatten_all()?
            .max(0)?
            .to_scalar::<f32>()?;
        if diff > 1e-5 {
            bail!(
                "rank {} step {step}: the layer differs from the unsharded one by {diff}",
                c.rank()
            );
        }
        worst = worst.max(diff);
    }
    Ok(worst)
}
