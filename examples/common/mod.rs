//! What the examples share: their command line and the way they report.

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

/// Prints the libraries' events on stderr: warnings by default, `RUST_LOG` for more (the
/// libraries print nothing by themselves).
pub fn log() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs `body`; on error prints one line with its causes (no backtrace) and exits 1.
pub fn main_with(body: impl FnOnce() -> anyhow::Result<()>) {
    log();
    if let Err(e) = body() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// The vendor to run on: `vendor` resolved by the library, except that when `auto` finds no
/// usable GPU vendor the examples fall back to the mock, explicitly and in one line (the
/// library's `Vendor::Auto` never does so by itself).
pub fn choose(vendor: Vendor) -> anyhow::Result<Vendor> {
    match unicomm::resolve(vendor) {
        Ok((v, why)) => {
            println!("vendor: {v} ({why})");
            Ok(v)
        }
        Err(e @ unicomm::Error::NoDevice { .. }) if vendor == Vendor::Auto => {
            println!("vendor: mock, the examples' fallback ({e})");
            Ok(Vendor::Mock)
        }
        Err(e) => Err(e.into()),
    }
}

/// The communicators this process drives: its one rank when a launcher started it (torchrun,
/// mpirun, srun, `cargo xtask run --procs N`: `unicomm::from_env`), else every rank of a
/// local world (`--ranks N`, or every device).
pub fn comms(vendor: Vendor, ranks: Option<usize>) -> anyhow::Result<Vec<unicomm::Comm>> {
    if unicomm::bootstrap::LaunchEnv::detect().is_ok() {
        if ranks.is_some() {
            bail!(
                "--ranks is for one process driving every rank; the launcher sets the ranks here"
            );
        }
        let c = unicomm::from_env(vendor).context("joining the job (one rank per process)")?;
        return Ok(vec![c]);
    }
    unicomm::local_comms_n(vendor, ranks).context("creating communicators")
}

/// Runs `f` on one thread per rank; a rank that panics is an error, not a crash. A rank
/// that fails aborts its communicator, so that its peers stop waiting for it (on the mock
/// at once; on NCCL/RCCL the abort ends this rank's part and its peers' next waits fail).
pub fn per_rank<F>(comms: &[unicomm::Comm], f: F) -> Vec<anyhow::Result<String>>
where
    F: Fn(&unicomm::Comm) -> anyhow::Result<String> + Sync,
{
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(c)))
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("rank {} panicked", c.rank())));
                    if r.is_err() {
                        let _ = c.abort();
                    }
                    r
                })
            })
            .collect();
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
        // An aborted communicator (a failed rank) has nothing left to finalize.
        if !failed {
            c.finalize()?;
        }
    }
    if failed {
        bail!("{name}: FAILED");
    }
    println!("{name}: PASSED {passed}");
    Ok(())
}
