//! An engine's own bootstrap, on every vendor: rank 0 makes a `unicomm::UniqueId` and writes
//! its bytes to a file (as candle's multi-process example shares NCCL's id); every rank
//! reads it and joins with `unicomm::init_rank` on GPU `LOCAL_RANK`, then one sum all-reduce,
//! checked. Ranks come from the launcher's variables (`cargo xtask run --procs 3 --vendor
//! mock --example by_id`; on one GPU `cargo xtask launch --procs 2 --share-gpu -- by_id`).
//! `UNICOMM_ID_FILE` names the file (default: in the temporary directory, by job).

#[expect(
    dead_code,
    reason = "one rank per process: the per-rank runner is not used here"
)]
mod common;

use std::time::{Duration, Instant};

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
    let id = if r == 0 {
        let id = UniqueId::new(vendor)?;
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, id.to_bytes())?;
        std::fs::rename(&tmp, &file)?;
        id
    } else {
        let start = Instant::now();
        loop {
            // Only a whole id (rank 0 renames it into place once written).
            if let Ok(b) = std::fs::read(&file) {
                break UniqueId::from_bytes(&b)?;
            }
            if start.elapsed() > Duration::from_secs(60) {
                bail!("rank {r}: no id at {} after 60 s", file.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
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
    if r == 0 {
        let _ = std::fs::remove_file(&file);
    }
    println!("by_id: rank {r} of {w} ({}) PASSED", id.vendor());
    Ok(())
}
