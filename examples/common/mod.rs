//! What the examples share: their command line and the way they report.
#![allow(dead_code)] // each example uses part of it

use anyhow::{bail, Context};
use unicomm::Vendor;

/// `--vendor V` (default auto) and `--ranks N` (default: every device, or
/// `UNICOMM_MOCK_RANKS` on the mock).
pub struct Args {
    pub vendor: Vendor,
    pub ranks: Option<usize>,
}

pub fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        vendor: Vendor::Auto,
        ranks: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--vendor" => a.vendor = it.next().context("--vendor needs a value")?.parse()?,
            "--ranks" => a.ranks = Some(it.next().context("--ranks needs a value")?.parse()?),
            other => bail!("unknown argument {other} (expected --vendor V, --ranks N)"),
        }
    }
    Ok(a)
}

/// Runs `body`; on error prints one line with its causes (no backtrace) and exits 1.
pub fn main_with(body: impl FnOnce() -> anyhow::Result<()>) {
    if let Err(e) = body() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// Runs `f` on one thread per rank; a rank that panics is an error, not a crash.
pub fn per_rank<F>(comms: &[unicomm::Comm], f: F) -> Vec<anyhow::Result<String>>
where
    F: Fn(&unicomm::Comm) -> anyhow::Result<String> + Sync,
{
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(move || f(c))).collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a rank panicked")))
            })
            .collect()
    })
}

/// Prints one line per rank, finalizes the communicators, and gives the verdict: an error
/// (non-zero exit) if any rank failed.
pub fn verdict(
    name: &str,
    results: Vec<anyhow::Result<String>>,
    comms: Vec<unicomm::Comm>,
    passed: &str,
) -> anyhow::Result<()> {
    let mut failed = false;
    for r in results {
        match r {
            Ok(line) => println!("{line}"),
            Err(e) => {
                failed = true;
                println!("FAILED: {e:#}");
            }
        }
    }
    for c in comms {
        c.finalize()?;
    }
    if failed {
        bail!("{name}: FAILED");
    }
    println!("{name}: PASSED {passed}");
    Ok(())
}
