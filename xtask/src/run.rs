//! `run`: an example on the vendor, in this process or as N ranks, one per process.

use anyhow::{Context, Result};

use crate::cargo::{example_binary, example_command, step};
use crate::cli::Opts;
use crate::launch;

/// `run --procs N`: the example as the ranks of `job`, one per process.
pub(crate) fn run_procs(o: &Opts, example: &str, job: &launch::Job<'_>) -> Result<()> {
    let exe = example_binary(o, example)?;
    launch::run(&exe, &example_args(o), job)
}

/// The example's arguments: the vendor, then the caller's.
fn example_args(o: &Opts) -> Vec<String> {
    let mut args = vec!["--vendor".to_string(), o.vendor.arg().to_string()];
    args.extend(o.args.iter().cloned());
    args
}

/// Several examples' jobs, `width` at a time: each example built first (one after the
/// other: cargo builds one at a time), then the jobs launched side by side (each on a port
/// of its own). Most of a job's time is its ranks waiting (a deadline that must pass, a
/// victim's settling), so jobs side by side take a fraction of their sum. The first
/// failure in the list's order is the error, naming its job.
pub(crate) fn run_procs_side_by_side(
    jobs: &[(Opts, &str, launch::Job<'_>)],
    width: usize,
) -> Result<()> {
    let exes = jobs
        .iter()
        .map(|(o, example, _)| example_binary(o, example))
        .collect::<Result<Vec<_>>>()?;
    for (chunk, exes) in jobs.chunks(width.max(1)).zip(exes.chunks(width.max(1))) {
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .zip(exes)
                .map(|((o, _, job), exe)| s.spawn(move || launch::run(exe, &example_args(o), job)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a launcher thread panicked")))
                })
                .collect()
        });
        for (r, (o, example, job)) in results.into_iter().zip(chunk) {
            r.with_context(|| {
                format!(
                    "{example} {:?} in {} processes on the {}",
                    o.args,
                    job.n,
                    o.vendor.arg()
                )
            })?;
        }
    }
    Ok(())
}

pub(crate) fn run_example(o: &Opts, example: &str) -> Result<()> {
    let mut c = example_command("run", o, example);
    c.args(["--example", example, "--", "--vendor", o.vendor.arg()]);
    c.args(&o.args);
    if std::env::var_os("UNICOMM_MOCK_RANKS").is_none() {
        c.env("UNICOMM_MOCK_RANKS", "4");
    }
    step(&format!("run {example} on {}", o.vendor.arg()), c)
}
