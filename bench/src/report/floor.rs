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
    iters: usize,
    launches: usize,
    results: &[Measure],
    json_path: Option<&Path>,
) -> anyhow::Result<()> {
    let st = c.create_stream()?;
    let dev = c.device_info()?.index.unwrap_or(0);
    let mut sizes: Vec<usize> = results.iter().map(|r| r.work.bytes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let fl = crate::run::floors(&st, dev, &sizes, iters, launches.max(20))
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

/// The floors' table of a `--floor` run's JSON, in markdown (docs/performance.md keeps it,
/// checked equal to this): per size, each all-reduce mode's time (out of place), over the
/// empty kernel node, and its share of the copy's bandwidth.
pub fn floor_table(doc: &serde_json::Value) -> anyhow::Result<String> {
    let floors = doc["floors"]
        .as_array()
        .context("no `floors` in the JSON: not a --floor run")?;
    let rows = doc["results"]
        .as_array()
        .context("no `results` in the JSON")?;
    let num = |v: &serde_json::Value, k: &str| v[k].as_f64().with_context(|| format!("no `{k}`"));
    let mut out = String::from(
        "| size | mode | time (us) | x empty kernel | % of copy bandwidth |\n| ---: | --- | ---: | ---: | ---: |\n",
    );
    for f in floors {
        let (size, empty, copy) = (num(f, "size")?, num(f, "emptyKernel")?, num(f, "copy")?);
        out.push_str(&format!(
            "| {} | empty kernel node | {empty:.2} | 1.00 | |\n",
            size as u64
        ));
        out.push_str(&format!(
            "| {} | device-to-device copy | {copy:.2} | {:.2} | 100% |\n",
            size as u64,
            copy / empty
        ));
        for r in rows.iter().filter(|r| {
            r["collective"] == "all_reduce"
                && r["inPlace"] == false
                && r["size"].as_f64() == Some(size)
        }) {
            let t = num(r, "time")?;
            let mode = r["mode"].as_str().unwrap_or("?");
            out.push_str(&format!(
                "| {} | {mode} | {t:.2} | {:.2} | {:.0}% |\n",
                size as u64,
                t / empty,
                100.0 * copy / t
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table edited by hand (or a JSON re-run without regenerating it) is named.
    #[test]
    fn a_floor_table_that_differs_from_its_json_is_named() {
        let doc = serde_json::json!({
            "floors": [{"size": 8, "emptyKernel": 2.0, "copy": 2.5}],
            "results": [{"collective": "all_reduce", "inPlace": false, "size": 8, "mode": "lamport", "time": 3.0}],
        });
        let t = floor_table(&doc).unwrap();
        assert!(t.contains("| 8 | lamport | 3.00 | 1.50 | 83% |"), "{t}");
        let page = format!("x\n<!-- floors: run.json -->\n{t}<!-- /floors -->\n");
        use super::super::pages::stale_tables;
        assert_eq!(
            stale_tables(&page, "floors", |_| Ok(t.clone())),
            (1, vec![])
        );
        let edited = page.replace("3.00", "2.90");
        let (n, v) = stale_tables(&edited, "floors", |_| Ok(t.clone()));
        assert_eq!((n, v.len()), (1, 1), "{v:?}");
    }
}
