//! A decode step's end on symmetric memory: each rank's partial product of a
//! tensor-parallel layer (bf16, 4 tokens x hidden 2048) in its part of a symmetric
//! allocation, all-reduced by each of unicomm's kernels (one shot, two shots, Lamport) and
//! checked exactly; then the fused all-reduce + residual add + RMSNorm against the same
//! step unfused; then 200 decode steps as replays of one captured graph (Lamport, new data
//! before each). Prints what an engine's own kernel would be handed (`kernel_args`).
//!
//! `cargo xtask run --vendor mock --example symmetric_decode [-- --ranks N]`; on NCCL one
//! rank per process (`cargo xtask launch --procs 2 -- symmetric_decode --vendor cuda`) or a
//! world of one; on RCCL the same kernels where the HIP runtime loads their PTX (HIP on an
//! NVIDIA GPU); an AMD GPU has no build of them yet: the run says so (`Unsupported`).

use anyhow::bail;
use unicomm::{bf16, ReduceOp, RmsNormOptions, SymmetricAlgorithm, SymmetricOptions};

mod common;

const TOKENS: usize = 4;
const HIDDEN: usize = 2048;
const N: usize = TOKENS * HIDDEN;

fn main() {
    common::main_with(run)
}

/// Rank `r`'s partial product at step `k`: small integers, so every sum is exact in bf16.
fn partial(r: usize, k: usize) -> Vec<bf16> {
    (0..N)
        .map(|i| bf16::from_f32(((r * 3 + i * 7 + k) % 11) as f32 - 5.0))
        .collect()
}

fn summed(w: usize, k: usize) -> Vec<f32> {
    let parts: Vec<Vec<bf16>> = (0..w).map(|r| partial(r, k)).collect();
    (0..N)
        .map(|i| parts.iter().map(|p| p[i].to_f32()).sum())
        .collect()
}

fn run() -> anyhow::Result<()> {
    let common::Args { vendor, ranks } = common::args()?;
    let resolved = common::choose(vendor)?;
    let comms = common::comms(resolved, ranks)?;
    let results = common::per_rank(&comms, |comm| {
        let (r, w) = (comm.rank(), comm.world_size());
        let st = comm.create_stream()?;
        let x = comm.alloc_symmetric_lamport::<bf16>(N)?;
        let args = x.kernel_args();
        let mut out = comm.alloc::<bf16>(N)?;
        for (k, algorithm) in [
            SymmetricAlgorithm::OneShot,
            SymmetricAlgorithm::TwoShot,
            SymmetricAlgorithm::Lamport,
        ]
        .into_iter()
        .enumerate()
        {
            x.write_from_host(&partial(r, k), &st)?;
            comm.all_reduce_symmetric(
                &x,
                N,
                &mut out,
                SymmetricOptions::new(ReduceOp::Sum, algorithm),
                &st,
            )?;
            let got: Vec<f32> = out.copy_to_host(&st)?.iter().map(|v| v.to_f32()).collect();
            if got != summed(w, k) {
                bail!("rank {r}: the {} all-reduce is not exact", algorithm.name());
            }
        }
        let worst = fused_against_unfused(comm, &x, &st)?;
        let graph = unicomm::Graph::capture(&st, |g| {
            g.all_reduce_symmetric(
                comm,
                &x,
                N,
                &out,
                SymmetricOptions::new(ReduceOp::Sum, SymmetricAlgorithm::Lamport),
            )
        })?;
        for step in 0..200 {
            x.write_from_host(&partial(r, 10 + step), &st)?;
            graph.launch(&st)?;
            let got: Vec<f32> = out.copy_to_host(&st)?.iter().map(|v| v.to_f32()).collect();
            if got != summed(w, 10 + step) {
                bail!("rank {r}: decode step {step} (a graph replay) is not exact");
            }
        }
        Ok(format!(
            "rank {r}: one-shot, two-shot and Lamport exact; fused norm within {worst:.1e} of the unfused step; 200 replayed steps exact; kernel args: {} ranks, {} bytes each, peers {:x?}",
            args.world,
            args.bytes,
            &args.peers[..w]
        ))
    });
    common::verdict(
        "symmetric_decode",
        results,
        comms,
        &format!("on {resolved}"),
    )
}

/// The fused all-reduce + residual add + RMSNorm against the unfused step on the host (the
/// all-reduce's exact sum, the add, the norm in f32): the largest difference of the output.
fn fused_against_unfused(
    comm: &unicomm::Comm,
    x: &unicomm::Symmetric<'_, bf16>,
    st: &unicomm::Stream,
) -> anyhow::Result<f32> {
    let (r, w) = (comm.rank(), comm.world_size());
    let res0: Vec<bf16> = (0..N).map(|i| bf16::from_f32((i % 5) as f32)).collect();
    let weight: Vec<bf16> = (0..HIDDEN)
        .map(|i| bf16::from_f32(1.0 + (i % 3) as f32 / 4.0))
        .collect();
    let mut residual = comm.upload(&res0, st)?;
    let wb = comm.upload(&weight, st)?;
    let mut out = comm.alloc::<bf16>(N)?;
    x.write_from_host(&partial(r, 3), st)?;
    let how = RmsNormOptions::new(1e-5, SymmetricAlgorithm::OneShot);
    comm.all_reduce_rms_norm(x, N, &mut residual, &wb, &mut out, how, st)?;
    let got = out.copy_to_host(st)?;
    let added: Vec<f32> = summed(w, 3)
        .iter()
        .zip(&res0)
        .map(|(s, r)| s + r.to_f32())
        .collect();
    let ws: Vec<f32> = weight.iter().map(|w| w.to_f32()).collect();
    let want = unicomm_conformance::rms_norm_reference(&added, &ws, 1e-5);
    let worst = got
        .iter()
        .zip(&want)
        .map(|(g, w)| (g.to_f32() - bf16::from_f32(*w).to_f32()).abs())
        .fold(0f32, f32::max);
    if worst > 0.0 {
        bail!("rank {r}: the fused norm differs from the unfused step by {worst}");
    }
    Ok(worst)
}
