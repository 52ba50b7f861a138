//! An engine's own bootstrap, on every vendor: rank 0 makes a `unicomm::UniqueId`, and its
//! bytes reach every rank through a file (as candle's multi-process example shares NCCL's
//! id); every rank joins with `unicomm::init_rank` on GPU `LOCAL_RANK`, then one sum
//! all-reduce, checked. Ranks come from the launcher's variables (`cargo xtask run --procs 3
//! --vendor mock --example by_id`; on one GPU `cargo xtask launch --procs 2 --share-gpu --
//! by_id`). `UNICOMM_ID_FILE` names the file (default: in the temporary directory, by job).
//!
//! The file goes through the library's file rendezvous
//! (`unicomm::bootstrap::LaunchEnv::shared_file`), not `std::fs::read`: the id is sealed and
//! authenticated under the job's secret (`UNICOMM_RENDEZVOUS_TOKEN`, which the launcher
//! sets), so an id a stranger planted at the path is ignored, a FIFO or `/dev/zero` there
//! is neither waited on nor read without end, and nothing at `<file>.tmp` is written
//! through; one deadline bounds the wait.

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

fn var(k: &str) -> anyhow::Result<usize> {
    std::env::var(k)
        .with_context(|| format!("{k} (a launcher sets it)"))?
        .parse()
        .with_context(|| format!("{k} is not a number"))
}

fn run() -> anyhow::Result<()> {
    let vendor = common::args()?.vendor;
    let (r, w, local) = (var("RANK")?, var("WORLD_SIZE")?, var("LOCAL_RANK")?);
    let file = match std::env::var_os("UNICOMM_ID_FILE") {
        Some(f) => std::path::PathBuf::from(f),
        None => std::env::temp_dir().join(format!(
            "unicomm-by-id-{}",
            std::env::var("MASTER_PORT").unwrap_or_default()
        )),
    };
    let secret = std::env::var("UNICOMM_RENDEZVOUS_TOKEN")
        .context("UNICOMM_RENDEZVOUS_TOKEN: the job's secret, shared by its ranks only")?;
    let env = unicomm::bootstrap::LaunchEnv::shared_file(
        &file,
        unicomm::Place::new(r, w, local),
        secret.as_bytes(),
    )?;
    let id = UniqueId::exchange(&env, vendor, Duration::from_secs(60))
        .with_context(|| format!("rank {r}: the id through {}", file.display()))?;
    let comm = unicomm::init_rank(&id, r, w, local, &Default::default())
        .with_context(|| format!("rank {r} joining by id"))?;
    let stream = comm.create_stream()?;
    let n = 1 << 16;
    let mut buf = comm.alloc::<f32>(n)?;
    buf.copy_from_host(&vec![r as f32 + 1.0; n], &stream)?;
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)?;
    let host = buf.copy_to_host(&stream)?;
    let want = (w * (w + 1) / 2) as f32;
    if let Some(i) = host.iter().position(|&x| x != want) {
        bail!("rank {r}: element {i} is {}, want {want}", host[i]);
    }
    comm.finalize()?;
    println!("by_id: rank {r} of {w} ({}) PASSED", id.vendor());
    Ok(())
}
