//! What aborting one of a parent and its `split` child does to the other, with and without
//! `split_share` (NCCL's `splitShare`: the child shares the parent's internal resources).
//! For each of the four cases (share or not; the parent aborted, or the child) every rank
//! splits one child of the whole world, aborts one of the two, then runs an all-reduce on
//! the other with a 10 s deadline and reports whether it was exact, failed, or timed out.
//! An observation, not a test: docs/reliability.md records what it showed on each backend.
//!
//! `cargo xtask run --procs 2 --example split_abort --vendor {mock,cuda}` (with one GPU:
//! `--share-gpu`), or in one process: `cargo xtask run --example split_abort`.

use std::time::{Duration, Instant};

use unicomm::{Comm, CommConfig, ReduceOp};

#[expect(
    dead_code,
    reason = "each_rank reports per rank here: the shared runner is not used"
)]
mod common;

fn main() {
    common::main_with(run)
}

/// An all-reduce of ones on `c`, waited for: "exact", or what went wrong.
fn probe(c: &Comm) -> String {
    let t = Instant::now();
    let r = (|| -> unicomm::Result<Vec<f32>> {
        c.set_timeout(Duration::from_secs(10)).ok();
        let st = c.create_stream()?;
        let mut b = c.alloc::<f32>(8)?;
        b.copy_from_host(&[1.0; 8], &st)?;
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)?;
        b.copy_to_host(&st)
    })();
    let w = c.world_size() as f32;
    match r {
        Ok(v) if v.iter().all(|&x| x == w) => format!("exact ({:.1?})", t.elapsed()),
        Ok(v) => format!("wrong data {:?} ({:.1?})", &v[..2], t.elapsed()),
        Err(e) => format!("{} ({:.1?})", short(&e.to_string()), t.elapsed()),
    }
}

fn short(s: &str) -> String {
    s.chars().take(140).collect()
}

fn run() -> anyhow::Result<()> {
    let a = common::args()?;
    let vendor = common::choose(a.vendor)?;
    for share in [false, true] {
        for abort_parent in [true, false] {
            let comms = common::comms(vendor, a.ranks)?;
            let config = CommConfig {
                split_share: Some(share),
                ..CommConfig::default()
            };
            let out = unicomm::each_rank(comms, |parent| -> unicomm::Result<String> {
                let child = parent
                    .split_with(Some(0), parent.rank() as i32, &config)?
                    .ok_or_else(|| unicomm::Error::invalid("split", "no child"))?;
                let (aborted, other) = if abort_parent {
                    (&parent, &child)
                } else {
                    (&child, &parent)
                };
                aborted.abort()?;
                Ok(probe(other))
            });
            let what = if abort_parent {
                "parent aborted, the child"
            } else {
                "child aborted, the parent"
            };
            match out {
                Ok(v) => println!("split_share={share}: {what}: {}", v.join("; ")),
                Err(e) => println!("split_share={share}: {what}: {}", short(&e.to_string())),
            }
        }
    }
    println!("split_abort: done (an observation: see docs/reliability.md)");
    Ok(())
}
