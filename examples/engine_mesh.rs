//! An inference engine's layout of four ranks: a 2x2 mesh (`dp` x `tp`, tensor-parallel
//! groups {0,1} and {2,3}, data-parallel groups {0,2} and {1,3}) with the three exchanges
//! of a MoE transformer layer, every output checked exactly:
//! - the tensor-parallel all-reduce of a row-parallel projection (bf16, on the TP group);
//! - the data-parallel all-reduce of gradients, scaled by 1/dp on each rank (a
//!   pre-multiplied sum, f32, on the DP group);
//! - the MoE dispatch and combine: each token is routed to `TOP_K` experts (one expert per
//!   rank of the world), the dispatch an all-to-all-v with per-peer token counts from the
//!   routing (skewed, zero for some pairs), the experts' outputs sent back by the inverse
//!   all-to-all-v; hidden size 7168 as in DeepSeek-V3.
//!
//! `cargo xtask run --example engine_mesh --vendor mock` (four ranks as threads), or one
//! rank per process: `cargo xtask run --procs 4 --example engine_mesh --vendor {mock,cuda}`.

use anyhow::{bail, ensure, Context};
use unicomm::{bf16, packed_displs, Counts, DeviceMesh, ReduceOp};

mod common;

/// DeepSeek-V3's hidden size.
const HIDDEN: usize = 7168;
/// Tokens per rank in this step.
const TOKENS: usize = 24;
/// Experts each token is routed to.
const TOP_K: usize = 2;

fn main() {
    common::main_with(run)
}

/// The experts (= ranks) token `t` of rank `r` goes to: a skewed, deterministic routing
/// (expert 0 is popular, some pairs get no tokens).
fn route(r: usize, t: usize, w: usize) -> [usize; TOP_K] {
    let first = if (r + t).is_multiple_of(3) {
        0
    } else {
        (r + t) % w
    };
    let second = (first + 1 + (t % 2) * (w - 2).max(1)) % w;
    let second = if second == first {
        (first + 1) % w
    } else {
        second
    };
    // The last rank never routes to expert 1: an empty pair in the exchange.
    if r == w - 1 && w > 2 {
        let avoid = |e: usize, other: usize| {
            if e != 1 {
                e
            } else if other != 0 {
                0
            } else {
                2
            }
        };
        return [avoid(first, second), avoid(second, first)];
    }
    [first, second]
}

/// The value of hidden element `h` of token `t` of rank `r`: exact in bf16.
fn token(r: usize, t: usize, h: usize) -> bf16 {
    bf16::from_f32(((r * 31 + t * 7 + h) % 64) as f32 - 32.0)
}

fn run() -> anyhow::Result<()> {
    let common::Args { vendor, ranks } = common::args()?;
    let resolved = common::choose(vendor)?;
    // Four ranks as threads, unless a launcher started one rank per process.
    let launched = unicomm::bootstrap::LaunchEnv::detect().is_ok();
    let comms = common::comms(resolved, if launched { ranks } else { ranks.or(Some(4)) })?;
    ensure!(
        comms[0].world_size() == 4,
        "the 2x2 mesh needs 4 ranks, the world has {}",
        comms[0].world_size()
    );
    let results = common::per_rank(&comms, |world| {
        let (r, w) = (world.rank(), world.world_size());
        let mesh = DeviceMesh::new(world, &[("dp", 2), ("tp", 2)])?;
        let (dp, tp) = (mesh.dim("dp")?, mesh.dim("tp")?);
        let st = world.create_stream()?;

        // Tensor parallel: the partial sums of a row-parallel projection.
        let part: Vec<bf16> = (0..HIDDEN)
            .map(|h| bf16::from_f32(((r + h) % 5) as f32))
            .collect();
        let mut x = world.alloc::<bf16>(HIDDEN)?;
        x.copy_from_host(&part, &st)?;
        tp.all_reduce_in_place(&mut x, ReduceOp::Sum, &st)?;
        let peers: Vec<usize> = (0..w).filter(|&p| p / 2 == r / 2).collect();
        let want: Vec<bf16> = (0..HIDDEN)
            .map(|h| bf16::from_f32(peers.iter().map(|p| ((p + h) % 5) as f32).sum()))
            .collect();
        ensure!(x.copy_to_host(&st)? == want, "rank {r}: TP all-reduce");

        // Data parallel: gradients averaged as each rank's 1/dp times its own (a
        // pre-multiplied sum, as a loss-scaled average is).
        let grads: Vec<f32> = (0..1024).map(|i| ((r * 3 + i) % 8) as f32).collect();
        let mut g = world.alloc::<f32>(grads.len())?;
        g.copy_from_host(&grads, &st)?;
        let scale = 1.0 / dp.world_size() as f32;
        dp.all_reduce_in_place(&mut g, ReduceOp::pre_mul_sum(scale), &st)?;
        let peers: Vec<usize> = (0..w).filter(|&p| p % 2 == r % 2).collect();
        let want: Vec<f32> = (0..grads.len())
            .map(|i| peers.iter().map(|p| ((p * 3 + i) % 8) as f32 * scale).sum())
            .collect();
        ensure!(
            g.copy_to_host(&st)? == want,
            "rank {r}: DP scaled all-reduce"
        );

        // MoE dispatch: token copies grouped by destination expert (rank).
        let mut by_dest: Vec<Vec<(usize, usize)>> = vec![Vec::new(); w];
        for t in 0..TOKENS {
            for e in route(r, t, w) {
                by_dest[e].push((r, t));
            }
        }
        let send_tokens: Vec<usize> = by_dest.iter().map(Vec::len).collect();
        let recv_tokens: Vec<usize> = (0..w)
            .map(|p| {
                (0..TOKENS)
                    .flat_map(|t| route(p, t, w))
                    .filter(|&e| e == r)
                    .count()
            })
            .collect();
        let sc: Vec<usize> = send_tokens.iter().map(|n| n * HIDDEN).collect();
        let rc: Vec<usize> = recv_tokens.iter().map(|n| n * HIDDEN).collect();
        let (sd, rd) = (packed_displs(&sc)?, packed_displs(&rc)?);
        let host: Vec<bf16> = by_dest
            .iter()
            .flatten()
            .flat_map(|&(p, t)| (0..HIDDEN).map(move |h| token(p, t, h)))
            .collect();
        let mut send = world.alloc::<bf16>(host.len())?;
        send.copy_from_host(&host, &st)?;
        let mut recv = world.alloc::<bf16>(rc.iter().sum())?;
        let (s, v) = (
            Counts {
                counts: &sc,
                displs: &sd,
            },
            Counts {
                counts: &rc,
                displs: &rd,
            },
        );
        world.all_to_all_v(&send, s, &mut recv, v, &st)?;
        // What this expert received: every source rank's tokens routed here, in order.
        let want: Vec<bf16> = (0..w)
            .flat_map(|p| {
                (0..TOKENS)
                    .filter(move |&t| route(p, t, w).contains(&r))
                    .flat_map(move |t| (0..HIDDEN).map(move |h| token(p, t, h)))
            })
            .collect();
        let got = recv.copy_to_host(&st)?;
        ensure!(got == want, "rank {r}: MoE dispatch");

        // The expert's output (here: the input doubled, exact in bf16), sent back by the
        // inverse exchange: the combine.
        let out: Vec<bf16> = got
            .iter()
            .map(|x| bf16::from_f32(x.to_f32() * 2.0))
            .collect();
        let mut expert = world.alloc::<bf16>(out.len())?;
        expert.copy_from_host(&out, &st)?;
        let mut back = world.alloc::<bf16>(host.len())?;
        world.all_to_all_v(&expert, v, &mut back, s, &st)?;
        let want: Vec<bf16> = host
            .iter()
            .map(|x| bf16::from_f32(x.to_f32() * 2.0))
            .collect();
        ensure!(back.copy_to_host(&st)? == want, "rank {r}: MoE combine");

        let line = format!(
            "rank {r}: dp {} tp {}: TP all-reduce, DP scaled all-reduce, MoE dispatch of {} tokens to {:?} and combine exact",
            mesh.coord("dp")?,
            mesh.coord("tp")?,
            send_tokens.iter().sum::<usize>(),
            send_tokens
        );
        drop((x, g, send, recv, expert, back));
        mesh.finalize().context("finalizing the mesh")?;
        Ok(line)
    });
    if results.is_empty() {
        bail!("no ranks");
    }
    common::verdict("engine_mesh", results, comms, "(2x2 mesh, exact)")
}
