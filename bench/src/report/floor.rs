//! `--floor`'s report: each all-reduce measured beside the floors one GPU has, in the same
//! run (an empty kernel node of the symmetric kernels' module, a device-to-device copy of
//! the same bytes), as ratios: the time over the empty kernel's, and the share of the copy's
//! bandwidth (bytes read plus written, counted as the copy is: at world 1 the all-reduce
//! reads and writes its bytes once). Printed, and kept in the JSON (`floors`).

use std::path::Path;

use anyhow::Context;
use serde_json::json;

use crate::run::{Floor, Measure};
use crate::Coll;

/// Measures the floors on `c`'s device at every size of `results` and reports them.
pub fn floors(
    c: &unicomm::Comm,
    (iters, launches): (usize, usize),
    results: &[Measure],
    json_path: Option<&Path>,
) -> anyhow::Result<()> {
    let st = c.create_stream()?;
    let dev = c.device_info()?.index.unwrap_or(0);
    let mut sizes: Vec<usize> = results.iter().map(|r| r.work.bytes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let fl = crate::run::floors(&st, dev, &sizes, (iters, launches.max(20)))
        .context("measuring the floors")?;
    print(&fl, results);
    if let Some(p) = json_path {
        let mut doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p)?)?;
        doc["floors"] = fl
            .iter()
            .map(|f| json!({"size": f.bytes, "emptyKernel": f.empty_us, "copy": f.copy_us}))
            .collect::<Vec<_>>()
            .into();
        std::fs::write(p, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// One line per all-reduce row (out of place): its time, over the empty kernel, and the
/// share of the copy's bandwidth it reaches.
fn print(fl: &[Floor], results: &[Measure]) {
    let empty = fl.first().map_or(0.0, |f| f.empty_us);
    println!("#\n# floors (same run, same GPU): empty kernel node {empty:.2} us");
    println!(
        "# {:>12} {:>10} {:>12} {:>10} {:>9} {:>10}",
        "size", "mode", "time(us)", "x empty", "copy(us)", "% copy bw"
    );
    for r in results
        .iter()
        .filter(|r| r.work.coll == Coll::AllReduce && !r.in_place)
    {
        let Some(f) = fl.iter().find(|f| f.bytes == r.work.bytes) else {
            continue;
        };
        let share = if r.time_us > 0.0 {
            100.0 * f.copy_us / r.time_us
        } else {
            0.0
        };
        println!(
            "  {:>12} {:>10} {:>12.2} {:>10.2} {:>9.2} {:>9.0}%",
            r.work.bytes,
            r.mode.name(),
            r.time_us,
            r.time_us / empty.max(f64::MIN_POSITIVE),
            f.copy_us,
            share
        );
    }
}
