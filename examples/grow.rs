//! Growing a launched job's world (an engine adding replicas; `ncclCommGrow`, NCCL >=
//! 2.29.2, or the mock as that NCCL): rank 0 starts alone, a world of one, reduces, makes a
//! grow id and shares it over the job's rendezvous; the other processes join the grown world
//! as new ranks while rank 0 grows into it; one sum all-reduce over the grown world, exact,
//! and rank 0's world of one still reduces. `cargo xtask run --procs 3 --vendor mock
//! --example grow`; on one GPU, 2 processes in NCCL's multi-rank mode: `cargo xtask launch
//! --procs 2 --share-gpu -- grow` with a NCCL >= 2.30.3.

#[expect(
    dead_code,
    reason = "one rank per process: the per-rank runner is not used here"
)]
mod common;

use std::time::Duration;

use anyhow::{bail, Context as _};
use unicomm::{ReduceOp, UniqueId};

fn main() {
    common::main_with(run)
}

/// The sum of `rank + 1` over `comm`'s world, checked on every element.
fn reduce(comm: &unicomm::Comm) -> anyhow::Result<f32> {
    let (r, w) = (comm.rank(), comm.world_size());
    let stream = comm.create_stream()?;
    let n = 1 << 16;
    let mut buf = comm.upload(&vec![r as f32 + 1.0; n], &stream)?;
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)?;
    let host = buf.copy_to_host(&stream)?;
    let want = (w * (w + 1) / 2) as f32;
    if let Some(i) = host.iter().position(|&x| x != want) {
        bail!("rank {r} of {w}: element {i} is {}, want {want}", host[i]);
    }
    Ok(want)
}

fn run() -> anyhow::Result<()> {
    let vendor = common::args()?.vendor;
    let env = unicomm::bootstrap::LaunchEnv::detect()?;
    let (r, w, dev) = (env.rank, env.world_size, env.local_rank);
    let timeout = Duration::from_secs(120);
    let cfg = Default::default();
    let grown = if r == 0 {
        let alone = unicomm::init_rank(&UniqueId::new(vendor)?, 0, 1, dev, &cfg)
            .context("rank 0's world of one")?;
        reduce(&alone)?;
        let id = UniqueId::for_grow(&alone).context("the grow id")?;
        UniqueId::share(&env, Some(&id), vendor, timeout)?;
        let grown = alone
            .grow(w, Some(id.bytes()))
            .with_context(|| format!("growing to {w}"))?;
        // The world of one is independent of the grown one and still reduces.
        reduce(&alone).context("the world of one after the grow")?;
        alone.finalize()?;
        grown
    } else {
        let id = UniqueId::share(&env, None, vendor, timeout)?;
        unicomm::init_grown(&id, r, w, dev, &cfg)
            .with_context(|| format!("rank {r} joining the grown world"))?
    };
    if (grown.rank(), grown.world_size()) != (r, w) {
        bail!(
            "rank {r}: grown as rank {} of {}",
            grown.rank(),
            grown.world_size()
        );
    }
    let sum = reduce(&grown)?;
    grown.finalize()?;
    println!("grow: rank {r} of {w} (grown from a world of one, sum {sum}) PASSED");
    Ok(())
}
