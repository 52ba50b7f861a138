//! `run`: an example on the vendor, in this process or as N ranks, one per process.

use anyhow::Result;

use crate::cargo::{example_binary, example_command, step};
use crate::cli::Opts;
use crate::launch;

/// `run --procs N`: the example as the ranks of `job`, one per process.
pub(crate) fn run_procs(o: &Opts, example: &str, job: &launch::Job<'_>) -> Result<()> {
    let exe = example_binary(o, example)?;
    let mut args = vec!["--vendor".to_string(), o.vendor.arg().to_string()];
    args.extend(o.args.iter().cloned());
    launch::run(&exe, &args, job)
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
