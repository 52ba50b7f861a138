//! A tensor-parallel Llama block on unicomm-candle: two decoder blocks (RMSNorm, attention
//! with grouped-query heads and rotary embeddings, a SwiGLU MLP; weights from a seed)
//! sharded over the ranks, checked against the unsharded forward of the same weights on
//! every rank, and the ranks' outputs compared bit for bit.
//!
//! - threads of one process: `cargo xtask run --vendor mock --example llama_tp` (worlds 1,
//!   2 and 4; `-- --ranks 2 --dtype bf16` for one);
//! - one rank per process: `cargo xtask run --procs 4 --vendor mock --example llama_tp`;
//!   on one GPU, `cargo xtask launch --procs 2 --share-gpu -- llama_tp --vendor cuda`
//!   (built with the `cuda` feature: candle's CUDA tensors);
//! - `--victim R`: rank R's process kills itself (SIGKILL) between the two blocks; every
//!   other rank must end its forward with unicomm's error inside candle's, never hang.
//!
//! Tolerances against the unsharded forward (the row-parallel layers sum partial products
//! in another order, each rounded to the element type): f32 within 1e-4, bf16 within
//! 6e-2 (the largest output is about 4).

mod block;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use block::{forward, Model};
use candle_core::{DType, Device};
use unicomm::Vendor;
use unicomm_candle::{unicomm_error, Communicator};

struct Args {
    vendor: Vendor,
    ranks: Vec<usize>,
    dtype: DType,
    victim: Option<usize>,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        vendor: Vendor::Auto,
        ranks: vec![1, 2, 4],
        dtype: DType::F32,
        victim: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--vendor" => a.vendor = val()?.parse()?,
            "--ranks" => {
                a.ranks = val()?
                    .split(',')
                    .map(|s| s.parse().context("--ranks: a list of rank counts"))
                    .collect::<anyhow::Result<_>>()?
            }
            "--dtype" => {
                a.dtype = match val()?.as_str() {
                    "f32" => DType::F32,
                    "bf16" => DType::BF16,
                    d => bail!("--dtype {d}: f32 or bf16"),
                }
            }
            "--victim" => a.victim = Some(val()?.parse()?),
            other => bail!("unknown argument {other} (--vendor V, --ranks 1,2,4, --dtype f32|bf16, --victim R)"),
        }
    }
    Ok(a)
}

fn tolerance(dtype: DType) -> f32 {
    if dtype == DType::BF16 {
        6e-2
    } else {
        1e-4
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let a = args()?;
    let vendor = match unicomm::resolve(a.vendor) {
        Ok((v, _)) => v,
        Err(unicomm::Error::NoDevice { .. }) if a.vendor == Vendor::Auto => Vendor::Mock,
        Err(e) => return Err(e.into()),
    };
    if std::env::var_os("WORLD_SIZE").is_some() {
        return one_process(vendor, &a);
    }
    if a.victim.is_some() {
        bail!("--victim needs one rank per process (cargo xtask run --procs N)");
    }
    for &w in &a.ranks {
        let comms = unicomm::local_comms_n(vendor, Some(w))?;
        let outs = unicomm::each_rank(comms, |comm| -> anyhow::Result<f32> {
            let comm = Communicator::new(comm);
            check_rank(&comm, a.dtype, &device(vendor, 0)?)
        })?;
        let worst = outs.iter().copied().fold(0.0, f32::max);
        println!(
            "llama_tp: {w} rank(s) as threads on {vendor}, {:?}: every rank equals the unsharded forward (max |diff| {worst:.2e} <= {:.0e}) and the ranks agree bit for bit",
            a.dtype,
            tolerance(a.dtype)
        );
    }
    Ok(())
}

/// One rank per process (the launcher's variables).
fn one_process(vendor: Vendor, a: &Args) -> anyhow::Result<()> {
    let local: usize = std::env::var("LOCAL_RANK").map_or(Ok(0), |v| v.parse())?;
    let comm = Communicator::new(unicomm::from_env(vendor)?);
    let (r, w) = (comm.rank(), comm.world_size());
    let dev = device(vendor, local)?;
    match a.victim {
        None => {
            let diff = check_rank(&comm, a.dtype, &dev)?;
            println!(
                "llama_tp: rank {r} of {w} processes on {vendor}, {:?}: equals the unsharded forward (max |diff| {diff:.2e} <= {:.0e}), the ranks agree bit for bit",
                a.dtype,
                tolerance(a.dtype)
            );
            Ok(())
        }
        Some(v) => survive(&comm, v, a.dtype, &dev),
    }
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

/// This rank's sharded forward against the unsharded one, and against every other rank's
/// (gathered): the largest difference from the unsharded forward.
fn check_rank(comm: &Arc<Communicator>, dtype: DType, dev: &Device) -> anyhow::Result<f32> {
    let m = Model::new(comm, dtype, dev)?;
    let want = forward(&m.full, &m.input)?;
    let got = forward(&m.sharded, &m.input)?;
    let diff = (got.to_dtype(DType::F32)? - want.to_dtype(DType::F32)?)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()?;
    let r = comm.rank();
    if diff.is_nan() || diff > tolerance(dtype) {
        bail!(
            "rank {r}: differs from the unsharded forward by {diff:e} (> {:e})",
            tolerance(dtype)
        );
    }
    // The fused all-reduce + residual add + norm (unicomm's symmetric kernel, on the mock
    // and on NCCL where the ranks have symmetric memory) against the same unsharded forward.
    match &m.fused {
        Err(why) => println!("rank {r}: the fused block: not run here: {why}"),
        Ok(blocks) => {
            let fused = forward(blocks, &m.input)?;
            let fdiff = (fused.to_dtype(DType::F32)? - want.to_dtype(DType::F32)?)?
                .abs()?
                .flatten_all()?
                .max(0)?
                .to_scalar::<f32>()?;
            if fdiff.is_nan() || fdiff > tolerance(dtype) {
                bail!("rank {r}: the fused block differs from the unsharded forward by {fdiff:e}");
            }
            println!("rank {r}: the fused block differs from the unsharded forward by {fdiff:e}");
        }
    }
    let all = comm.all_gather(&got.unsqueeze(0)?, 0)?;
    let mine = got.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    for p in 0..comm.world_size() {
        let theirs = all
            .get(p)?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        if theirs
            .iter()
            .zip(&mine)
            .any(|(a, b)| a.to_bits() != b.to_bits())
        {
            bail!("rank {r}: rank {p}'s output differs from this rank's");
        }
    }
    Ok(diff)
}

/// The forward with rank `victim` killed between the blocks: this rank must end with
/// unicomm's error inside candle's.
fn survive(
    comm: &Arc<Communicator>,
    victim: usize,
    dtype: DType,
    dev: &Device,
) -> anyhow::Result<()> {
    let r = comm.rank();
    let m = Model::new(comm, dtype, dev)?;
    if r == victim {
        m.sharded[0].forward(&m.input)?;
        println!("rank {r}: killing this process between the blocks (SIGKILL)");
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &std::process::id().to_string()])
            .status();
        std::thread::sleep(Duration::from_secs(60));
        bail!("rank {r}: still alive after SIGKILL");
    }
    // The whole forward: a survivor may still be finishing the first block's last
    // collective when the victim's process goes (rank 0's process also serves the mock's
    // world), so the error may come from either block, never a finished forward.
    match forward(&m.sharded, &m.input).and_then(|y| y.to_vec2::<f32>()) {
        Ok(_) => bail!("rank {r}: the forward finished without rank {victim}"),
        Err(e) => match unicomm_error(&e) {
            Some(u) => {
                println!("rank {r}: the forward without rank {victim} ended with unicomm's error inside candle's: {u}");
                let _ = comm.comm().abort();
                Ok(())
            }
            None => bail!("rank {r}: the forward failed with an error that is not unicomm's: {e}"),
        },
    }
}
