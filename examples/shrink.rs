//! Going on without a lost rank: a job of N ranks (one per process) runs a stream of
//! all-reduces; the victim rank SIGKILLs its own process in the middle of it; the survivors
//! get the failure (the mock at once, NCCL at its deadline `UNICOMM_TIMEOUT_MS` or, with
//! `--revoke-after-ms`, when a watchdog revokes the stuck communicator), agree on who is
//! left, shrink the communicator and go on, every result checked exactly.
//!
//! `--fault hang` keeps the victim alive but silent (the survivors' collective hangs until
//! the deadline or the watchdog's revoke), `--fault leave` is a planned departure (the
//! survivors shrink a live communicator: NCCL's `ncclCommShrink`).
//!
//! `cargo xtask run --procs 4 --example shrink --vendor mock -- --victim 3`; the launcher is
//! told the victim's death is expected (`--expect-lost 3`, which the xtask passes from
//! `--victim` itself). Options: `--mode default|abort|reform` (the `ShrinkMode`),
//! `--revoke-after-ms MS` (NCCL >= 2.28.7: a watchdog revokes the communicator once a
//! collective takes longer, so `ncclCommShrink` can run on it instead of re-forming).
//!
//! Who is left is agreed as a small engine would without a coordinator: each survivor
//! leaves a heartbeat file in a directory every rank sees (`--state-dir`, default under
//! the system's temporary directory, named by the job's rendezvous port) and, after a
//! settling time, takes the ranks whose files are there. A cluster's engine would ask its
//! launcher or an elastic agent instead; the shrink is the same.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use unicomm::{Comm, ReduceOp, ShrinkMode, Vendor};

#[expect(dead_code, reason = "its own arguments: the shared parser is not used")]
mod common;

/// How the victim is lost.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// SIGKILL in the middle of the stream (the survivors see an error).
    Kill,
    /// Alive, but it stops calling collectives (the survivors' next one hangs: the
    /// deadline, or a watchdog's revoke, ends it).
    Hang,
    /// A planned departure: every rank knows; the survivors shrink a live communicator.
    Leave,
}

struct Args {
    vendor: Vendor,
    victim: Option<usize>,
    fault: Fault,
    mode: ShrinkMode,
    revoke_after: Option<Duration>,
    state_dir: Option<std::path::PathBuf>,
    settle: Duration,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        vendor: Vendor::Auto,
        victim: None,
        fault: Fault::Kill,
        mode: ShrinkMode::Default,
        revoke_after: None,
        state_dir: None,
        settle: Duration::from_secs(2),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--vendor" => a.vendor = val()?.parse()?,
            "--victim" => a.victim = Some(val()?.parse()?),
            "--fault" => {
                a.fault = match val()?.as_str() {
                    "kill" => Fault::Kill,
                    "hang" => Fault::Hang,
                    "leave" => Fault::Leave,
                    f => bail!("--fault {f}: expected kill, hang or leave"),
                }
            }
            "--mode" => {
                a.mode = match val()?.as_str() {
                    "default" => ShrinkMode::Default,
                    "abort" => ShrinkMode::Abort,
                    "reform" => ShrinkMode::Reform,
                    m => bail!("--mode {m}: expected default, abort or reform"),
                }
            }
            "--revoke-after-ms" => {
                a.revoke_after = Some(Duration::from_millis(val()?.parse()?))
            }
            "--state-dir" => a.state_dir = Some(val()?.into()),
            "--settle-ms" => a.settle = Duration::from_millis(val()?.parse()?),
            other => bail!(
                "unknown argument {other} (expected --vendor V, --victim R, --fault kill|hang|leave, --mode M, --revoke-after-ms MS, --state-dir D, --settle-ms MS)"
            ),
        }
    }
    Ok(a)
}

fn main() {
    common::main_with(run)
}

/// An all-reduce of `x` on `c`, waited for; with `revoke_after`, a watchdog revokes the
/// communicator when the wait takes longer (the collective then ends with an error).
fn all_reduce(c: &Comm, x: f32, revoke_after: Option<Duration>) -> unicomm::Result<f32> {
    let st = c.create_stream()?;
    let mut b = c.alloc::<f32>(256)?;
    b.copy_from_host(&[x; 256], &st)?;
    c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)?;
    let done = std::sync::atomic::AtomicBool::new(false);
    let (r, revoked) = std::thread::scope(|s| {
        let dog = revoke_after.map(|after| {
            let done = &done;
            s.spawn(move || {
                let t = Instant::now();
                while t.elapsed() < after {
                    if done.load(std::sync::atomic::Ordering::Acquire) {
                        return None;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Some(c.revoke())
            })
        });
        let r = b.copy_to_host(&st);
        done.store(true, std::sync::atomic::Ordering::Release);
        (r, dog.and_then(|d| d.join().ok().flatten()))
    });
    if let Some(rv) = revoked {
        rv?;
        return Err(unicomm::Error::aborted(
            "revoked by the watchdog: a collective took too long",
        ));
    }
    let h = r?;
    Ok(h[0])
}

fn run() -> anyhow::Result<()> {
    let a = args()?;
    let vendor = common::choose(a.vendor)?;
    let env = unicomm::bootstrap::LaunchEnv::detect()
        .context("run this example under a launcher (cargo xtask run --procs N)")?;
    let comm = unicomm::from_env(vendor)?;
    let (r, w) = (comm.rank(), comm.world_size());
    ensure!(w >= 2, "needs two ranks or more");
    let victim = a.victim.unwrap_or(w - 1);
    ensure!(victim < w, "--victim {victim} is outside 0..{w}");
    let dir = a
        .state_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("unicomm-shrink-{}", env.master.1)));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let full = (w * (w + 1) / 2) as f32;
    let mut failure = None;
    for i in 0..1000 {
        if r == victim && i == 10 {
            match a.fault {
                Fault::Kill => {
                    println!("rank {r}: killing this process mid-stream (SIGKILL)");
                    let _ = std::process::Command::new("kill")
                        .args(["-KILL", &std::process::id().to_string()])
                        .status();
                    std::thread::sleep(Duration::from_secs(60));
                    bail!("rank {r}: still alive after SIGKILL");
                }
                Fault::Hang | Fault::Leave => {
                    // Stays away until the survivors are done, then ends its communicator
                    // (aborted: its peers left it) and exits.
                    println!(
                        "rank {r}: no more collectives from this rank ({})",
                        if a.fault == Fault::Hang {
                            "a hang"
                        } else {
                            "leaving"
                        }
                    );
                    std::thread::sleep(a.settle * 3 + Duration::from_secs(10));
                    comm.abort()?;
                    println!("rank {r}: left; PASSED");
                    return Ok(());
                }
            }
        }
        if a.fault == Fault::Leave && i == 10 {
            failure = Some((
                i,
                unicomm::Error::aborted(format!("rank {victim} left, as planned")),
            ));
            break;
        }
        match all_reduce(&comm, (r + 1) as f32, a.revoke_after) {
            Ok(s) => ensure!(s == full, "rank {r}: all-reduce {i} gave {s}, want {full}"),
            Err(e) => {
                failure = Some((i, e));
                break;
            }
        }
    }
    let (i, e) = failure.context("the lost rank was never noticed")?;
    println!("rank {r}: collective {i} failed: {e}");
    // Who is left: a heartbeat file each, then the files there after the settling time.
    std::fs::write(dir.join(format!("alive.{r}")), b"")?;
    std::thread::sleep(a.settle);
    let left: Vec<usize> = (0..w)
        .filter(|q| dir.join(format!("alive.{q}")).exists())
        .collect();
    let lost: Vec<usize> = (0..w).filter(|q| !left.contains(q)).collect();
    // Where the backend knows who was lost (the mock: the process that exited), the error
    // says so as data, whichever rank it was; NCCL does not name the failed peer.
    if !e.lost_ranks().is_empty() && a.fault == Fault::Kill {
        ensure!(
            e.lost_ranks() == lost.as_slice(),
            "rank {r}: the error names lost ranks {:?}, the heartbeats {lost:?}",
            e.lost_ranks()
        );
        println!(
            "rank {r}: the error names the lost ranks: {:?}",
            e.lost_ranks()
        );
    }
    println!(
        "rank {r}: ranks left {left:?}, lost {lost:?}; shrinking ({:?})",
        a.mode
    );
    let t = Instant::now();
    let small = comm.shrink(&lost, a.mode)?;
    // On NCCL a re-form aborts the old communicator, the default mode of ncclCommShrink
    // leaves it usable: which one ran shows here.
    let old = match comm.poll_async_error() {
        Ok(()) => "the old communicator usable",
        Err(_) => "the old communicator aborted",
    };
    println!(
        "rank {r}: now rank {} of {} after {:.1?} ({old})",
        small.rank(),
        small.world_size(),
        t.elapsed()
    );
    let want: f32 = left.iter().map(|&q| (q + 1) as f32).sum();
    for k in 0..20 {
        let s = all_reduce(&small, (r + 1) as f32, None)?;
        ensure!(
            s == want,
            "rank {r}: after the shrink, all-reduce {k} gave {s}, want {want}"
        );
    }
    // The old communicator has a dead rank: aborted, not finalized (a finalize would wait
    // for it until the deadline). After the abort or re-form modes it is aborted already.
    let _ = comm.abort();
    drop(comm);
    small.finalize()?;
    let _ = std::fs::remove_file(dir.join(format!("alive.{r}")));
    // The last survivor to leave removes the directory (the others find it not empty).
    let _ = std::fs::remove_dir(&dir);
    println!(
        "rank {r}: 20 all-reduces of the {} survivors exact; PASSED",
        left.len()
    );
    Ok(())
}
