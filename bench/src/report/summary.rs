//! `unicomm-bench report SWEEP.json`: a sweep's JSON read back as tables, per collective
//! and size: every mode's time, the best fixed mode (every mode but auto), auto over it (by
//! the mean, nccl-tests' figure, and by the median iteration), auto over the best by-hand
//! mode, and, where the run's tune file is known, the path auto took by the library's own
//! policy code (`Policy::parse` and `Policy::choose`, so the report and the policy cannot
//! disagree): a miss then reads as a wrong choice or as the cost of the best mode's own path.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use unicomm::core::Kind;
use unicomm_nccl_api::policy::{Path as Route, Policy};

/// Auto's target: within this factor of the best fixed mode.
const GOAL: f64 = 1.03;
/// The modes in the order of the columns.
const MODES: [&str; 8] = [
    "plain",
    "registered",
    "window",
    "raw",
    "raw-registered",
    "raw-window",
    "ce",
    "auto",
];
/// NCCL called by hand through the function table, on plain, registered, window buffers.
const BY_HAND: [&str; 3] = ["raw", "raw-registered", "raw-window"];

/// One mode's figures in one cell: mean time, median iteration, host-bound.
type Figures = (f64, f64, bool);

/// The mode a policy path is measured as: the path's own word.
fn mode_of(p: Route) -> &'static str {
    p.name()
}

/// The tune file the run used: `tune` if given, else `nccl-tune.txt` or `rccl-tune.txt`
/// beside the JSON (where the bundle writes it), else none.
fn tune_file(json: &Path, tune: Option<&Path>) -> Option<PathBuf> {
    if let Some(t) = tune {
        return Some(t.to_path_buf());
    }
    let dir = json.parent()?;
    ["nccl-tune.txt", "rccl-tune.txt"]
        .iter()
        .map(|n| dir.join(n))
        .find(|p| p.exists())
}

/// Prints the report of `json` (`in_place`: the in-place rows, else out of place).
pub fn summary(json: &Path, tune: Option<&Path>, in_place: bool) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(json).with_context(|| format!("reading {}", json.display()))?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", json.display()))?;
    let (colls, cells) = read_cells(&doc, in_place)?;
    let lib = &doc["library"];
    println!(
        "# {}: {} {}, {} ranks, {}",
        json.display(),
        lib["backend"].as_str().unwrap_or("?"),
        lib["version"].as_str().unwrap_or("?"),
        doc["nranks"],
        if in_place { "in place" } else { "out of place" }
    );
    let policy = match tune_file(json, tune) {
        Some(f) => {
            let t =
                std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
            println!("# auto's path per row by the rules of {}", f.display());
            Some(Policy::parse(&t, &f.display().to_string())?)
        }
        None => None,
    };
    let mut misses = Vec::new();
    for coll in &colls {
        misses.extend(print_collective(coll, &cells, policy.as_ref()));
    }
    println!(
        "\nauto over {GOAL}x the best fixed mode (mean): {} cells",
        misses.len()
    );
    for m in misses {
        let why = match m.path {
            Some(p) if p == m.best => format!("; auto took {p}, the best mode's own path"),
            Some(p) => format!("; auto took {p}, the best was {}", m.best),
            None => String::new(),
        };
        println!(
            "- {} {} B: {:.3} (median {:.3}){why}",
            m.coll, m.size, m.mean, m.median
        );
    }
    Ok(())
}

/// Per (collective, size), every mode's figures; the collectives in the order of the file.
type Cells = BTreeMap<(String, u64), BTreeMap<String, Figures>>;

/// The results of one placement, by cell, and the collectives in the file's order.
fn read_cells(doc: &serde_json::Value, in_place: bool) -> anyhow::Result<(Vec<String>, Cells)> {
    let results = doc["results"]
        .as_array()
        .context("the JSON has no `results` (not a unicomm-bench -J file)")?;
    let mut cells = Cells::new();
    let mut colls: Vec<String> = Vec::new();
    for r in results {
        if r["inPlace"].as_bool() != Some(in_place) {
            continue;
        }
        let (Some(coll), Some(size), Some(mode), Some(time)) = (
            r["collective"].as_str(),
            r["size"].as_u64(),
            r["mode"].as_str(),
            r["time"].as_f64(),
        ) else {
            bail!("a result without collective, size, mode or time: {r}");
        };
        let p50 = r["iterTime"]["p50"].as_f64().unwrap_or(time);
        let host = r["hostBound"].as_bool().unwrap_or(false);
        if !colls.iter().any(|c| c == coll) {
            colls.push(coll.to_string());
        }
        cells
            .entry((coll.to_string(), size))
            .or_default()
            .insert(mode.to_string(), (time, p50, host));
    }
    Ok((colls, cells))
}

/// A cell where auto is over the goal.
struct Miss {
    coll: String,
    size: u64,
    mean: f64,
    median: f64,
    path: Option<&'static str>,
    best: String,
}

/// Prints one collective's table; its misses.
fn print_collective(coll: &str, cells: &Cells, policy: Option<&Policy>) -> Vec<Miss> {
    let kind = Kind::from_snake_name(coll);
    let sizes: Vec<u64> = cells
        .keys()
        .filter(|(c, _)| c == coll)
        .map(|k| k.1)
        .collect();
    let modes: Vec<&str> = MODES
        .into_iter()
        .filter(|m| {
            sizes
                .iter()
                .any(|s| cells[&(coll.to_string(), *s)].contains_key(*m))
        })
        .collect();
    println!("\n**{coll}** (time in us, `*` host-bound)\n");
    let took = if policy.is_some() { " auto took |" } else { "" };
    println!(
        "| size | {} | best fixed |{took} auto / best (mean) | (median) | auto / best by hand |",
        modes.join(" | ")
    );
    println!(
        "| ---: |{} --- |{} ---: | ---: | ---: |",
        " ---: |".repeat(modes.len()),
        if policy.is_some() { " --- |" } else { "" }
    );
    let mut misses = Vec::new();
    for s in sizes {
        let v = &cells[&(coll.to_string(), s)];
        let shown: Vec<String> = modes
            .iter()
            .map(|m| {
                v.get(*m).map_or("-".into(), |f| {
                    format!("{:.2}{}", f.0, if f.2 { "*" } else { "" })
                })
            })
            .collect();
        let path = match (policy, kind) {
            (Some(p), Some(k)) => Some(mode_of(p.choose(k, s as usize))),
            _ => None,
        };
        let took = path.map_or(String::new(), |p| format!(" {p} |"));
        match row(v) {
            None => println!("| {s} | {} | - |{took} - | - | - |", shown.join(" | ")),
            Some((best, mean, median, hand)) => {
                let flag = if mean > GOAL { " **miss**" } else { "" };
                println!(
                    "| {s} | {} | {best} |{took} {mean:.3}{flag} | {median:.3} | {hand} |",
                    shown.join(" | ")
                );
                if mean > GOAL {
                    let (coll, size) = (coll.to_string(), s);
                    misses.push(Miss {
                        coll,
                        size,
                        mean,
                        median,
                        path,
                        best,
                    });
                }
            }
        }
    }
    misses
}

/// A row's best fixed mode, auto over it by the mean and by the median iteration, and auto
/// over the best by-hand mode (shown); `None` without auto or a fixed mode.
fn row(v: &BTreeMap<String, Figures>) -> Option<(String, f64, f64, String)> {
    let fixed = || v.iter().filter(|(m, _)| m.as_str() != "auto");
    let (best, bf) = fixed().min_by(|a, b| a.1 .0.total_cmp(&b.1 .0))?;
    let auto = v.get("auto")?;
    let best_median = fixed().map(|(_, f)| f.1).fold(f64::INFINITY, f64::min);
    let hand = BY_HAND
        .iter()
        .filter_map(|m| v.get(*m).map(|f| f.0))
        .fold(f64::INFINITY, f64::min);
    let hand = if hand.is_finite() {
        format!("{:.3}", auto.0 / hand)
    } else {
        "-".into()
    };
    Some((best.clone(), auto.0 / bf.0, auto.1 / best_median, hand))
}
