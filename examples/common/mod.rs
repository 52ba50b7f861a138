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

/// Runs `body`; on error prints one line with its causes (no backtrace) and exits 1.
pub fn main_with(body: impl FnOnce() -> anyhow::Result<()>) {
    if let Err(e) = body() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
