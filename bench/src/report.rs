//! What a run prints and writes: the nccl-tests-style table, the JSON, the SVG plot.

use std::path::Path;

use anyhow::Context;
use clap::ValueEnum;
use plotters::prelude::*;
use serde_json::json;
use unicomm::{Capabilities, Vendor};

use crate::run::Measure;
use crate::{Args, Coll, Mode};

/// What identifies a run: machine, library, arguments.
pub struct Header {
    /// The command line.
    pub args: Vec<String>,
    /// The vendor and why.
    pub vendor: String,
    /// The library's capabilities (version, path).
    pub caps: Capabilities,
    /// Ranks.
    pub world: usize,
    /// Element type and reduction.
    pub dtype: String,
    /// The reduction.
    pub op: String,
    /// Warm-up and timed iterations.
    pub iters: (usize, usize),
    /// The variables that change NCCL's behaviour.
    pub env: Vec<(String, String)>,
    /// The measurement order, in words.
    pub order: String,
    /// CUDA graph launches per turn (`-G`); 0: direct calls.
    pub graphs: usize,
    /// Every rank's device.
    pub devices: Vec<crate::run::DeviceRow>,
}

impl Header {
    /// The header of this run.
    pub fn new(
        a: &Args,
        dtype: unicomm::DataType,
        vendor: Vendor,
        why: &str,
        caps: &Capabilities,
        world: usize,
        devices: Vec<crate::run::DeviceRow>,
    ) -> Self {
        let mut env: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| {
                ["NCCL_", "RCCL_", "UNICOMM_", "CUDA_VISIBLE", "HIP_VISIBLE"]
                    .iter()
                    .any(|p| k.starts_with(p))
            })
            .collect();
        env.sort();
        Header {
            args: std::env::args().collect(),
            vendor: format!("{vendor} ({why})"),
            caps: caps.clone(),
            world,
            dtype: dtype.to_string(),
            op: a.op.to_string(),
            iters: (a.warmup, a.iters),
            env,
            order: match a.order {
                crate::Order::Size => format!(
                    "modes take turns at each size, in {} rounds",
                    a.rounds.max(1)
                ),
                crate::Order::Mode => "one mode at every size, then the next".into(),
            },
            graphs: a.graphs,
            devices,
        }
    }

    /// The `#` lines above the table.
    pub fn print(&self) {
        println!(
            "# unicomm-bench {}: {}",
            env!("CARGO_PKG_VERSION"),
            self.args.join(" ")
        );
        println!("# vendor: {}", self.vendor);
        println!(
            "# {} ranks, {} {} at {}",
            self.world, self.caps.backend, self.caps.version, self.caps.library_path
        );
        println!(
            "# {} {}; warm-up {} iterations, timed {} (device events, back to back); {}",
            self.dtype, self.op, self.iters.0, self.iters.1, self.order
        );
        if self.graphs > 0 {
            println!(
                "# CUDA graphs: each turn's iterations captured once per rank, the graph launched {} times (time per call = launches' time / calls replayed)",
                self.graphs
            );
        }
        for d in &self.devices {
            println!(
                "#  Rank {:2} Pid {:6} on {:>10} device {:>2} [{}] {}",
                d.rank,
                d.pid,
                d.hostname,
                d.device.map_or("-".into(), |i| i.to_string()),
                d.device_hex.as_deref().unwrap_or("-"),
                d.device_info
            );
        }
        for (k, v) in &self.env {
            println!("# {k}={v}");
        }
    }
}

fn gbps(bytes: usize, us: f64) -> f64 {
    if us > 0.0 {
        bytes as f64 / (us * 1e3)
    } else {
        0.0
    }
}

/// Host-bound: enqueueing the timed iterations took at least this share of their device
/// time, so the device waited for the host and the time is the host path's.
const HOST_BOUND: f64 = 0.9;

/// Whether `m`'s time is the host's (see [`HOST_BOUND`]).
pub fn host_bound(m: &Measure) -> bool {
    m.time_us > 0.0 && m.host_us >= HOST_BOUND * m.time_us
}

fn wrong(w: Option<u64>) -> String {
    w.map_or_else(|| "-".into(), |n| n.to_string())
}

/// The table: per collective, one row per size and mode, out-of-place then in-place columns.
pub fn table(results: &[Measure], world: usize) {
    let mut colls: Vec<Coll> = Vec::new();
    for r in results {
        if !colls.contains(&r.work.coll) {
            colls.push(r.work.coll);
        }
    }
    if results.iter().any(host_bound) {
        println!(
            "# time*: host-bound, enqueueing took >= {:.0}% of the time (the device waited for the host)",
            HOST_BOUND * 100.0
        );
    }
    for coll in colls {
        println!("#\n# {}", coll.name());
        println!(
            "# {:>12} {:>12} {:>8} {:>10} | {:>10} {:>8} {:>8} {:>6} | {:>10} {:>8} {:>8} {:>6}",
            "size",
            "count",
            "type",
            "mode",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "time",
            "algbw",
            "busbw",
            "#wrong"
        );
        println!(
            "# {:>12} {:>12} {:>8} {:>10} | {:>10} {:>8} {:>8} {:>6} | {:>10} {:>8} {:>8} {:>6}",
            "(B)",
            "(elements)",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "out",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "in"
        );
        let mut keys: Vec<(usize, Mode, &'static str)> = Vec::new();
        for r in results.iter().filter(|r| r.work.coll == coll) {
            let k = (r.work.bytes, r.mode, r.work.label);
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        for (bytes, mode, label) in keys {
            let find = |inp: bool| {
                results.iter().find(|r| {
                    r.work.coll == coll
                        && r.work.bytes == bytes
                        && r.mode == mode
                        && r.in_place == inp
                })
            };
            let cell = |m: Option<&Measure>| match m {
                Some(m) => {
                    let alg = gbps(bytes, m.time_us);
                    format!(
                        "{:>9.2}{} {:>8.2} {:>8.2} {:>6}",
                        m.time_us,
                        if host_bound(m) { '*' } else { ' ' },
                        alg,
                        alg * coll.bus_factor(world),
                        wrong(m.wrong)
                    )
                }
                None => format!("{:>10} {:>8} {:>8} {:>6}", "-", "-", "-", "-"),
            };
            let any = find(false).or(find(true));
            let (count, dtype) =
                any.map_or((0, String::new()), |m| (m.count, m.work.dtype.to_string()));
            println!(
                "  {:>12} {:>12} {:>8} {:>10} | {} | {}{}",
                bytes,
                count,
                dtype,
                mode.name(),
                cell(find(false)),
                cell(find(true)),
                if label.is_empty() {
                    String::new()
                } else {
                    format!("  {label}")
                }
            );
        }
    }
}

fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[((s.len() - 1) as f64 * p).round() as usize]
}

/// Each mode's device memory beyond its buffers.
pub fn memory(m: &[crate::run::ModeMemory]) {
    for (mode, extra) in m {
        match extra {
            Some(b) => println!(
                "# mode {}: device memory beyond its buffers: {:.1} MiB",
                mode.name(),
                *b as f64 / (1 << 20) as f64
            ),
            None => println!(
                "# mode {}: device memory not reported by this backend",
                mode.name()
            ),
        }
    }
}

/// [`json()`] with each mode's device memory beyond its buffers (`memoryBytes`).
pub fn json_with_memory(
    path: &Path,
    h: &Header,
    results: &[Measure],
    m: &[crate::run::ModeMemory],
) -> anyhow::Result<()> {
    json(path, h, results)?;
    let mut doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    doc["memoryBytes"] = m
        .iter()
        .map(|(mode, b)| (mode.name().to_string(), json!(b)))
        .collect::<serde_json::Map<_, _>>()
        .into();
    std::fs::write(path, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// The automatic policy's thresholds this run measured: per collective, the fastest of the
/// registered, window and ce modes at each size (out of place), as `UNICOMM_TUNE_FILE` rules.
/// How much slower (median) than the fastest path the previous size's path may be and
/// still be kept at the next size.
const TUNE_TOLERANCE: f64 = 0.03;

fn median(v: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

pub fn tune(path: &Path, h: &Header, results: &[Measure]) -> anyhow::Result<()> {
    let mut out = format!(
        "# unicomm automatic policy, measured by: {}\n# {} {} at {}, {} ranks\n",
        h.args.join(" "),
        h.caps.backend,
        h.caps.version,
        h.caps.library_path,
        h.world
    );
    let mut colls: Vec<Coll> = Vec::new();
    for r in results {
        if !colls.contains(&r.work.coll) {
            colls.push(r.work.coll);
        }
    }
    for coll in colls {
        let mut sizes: Vec<usize> = results
            .iter()
            .filter(|r| r.work.coll == coll)
            .map(|r| r.work.bytes)
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        // The fastest path per size by the median iteration (single slow iterations of a
        // shared machine move a mean of ~10 us calls by 10-50%, and not the same way in the
        // next run); where the previous size's path is within TUNE_TOLERANCE of the
        // fastest, it stays (one path across a range rather than a switch on noise). Then
        // one rule per run of equal paths.
        let mut best: Vec<(usize, &'static str)> = Vec::new();
        for &b in &sizes {
            let cands: Vec<(&'static str, f64)> = results
                .iter()
                .filter(|r| {
                    r.work.coll == coll
                        && r.work.bytes == b
                        && !r.in_place
                        && matches!(r.mode, Mode::Registered | Mode::Window | Mode::Ce)
                })
                .map(|r| {
                    let path = if r.mode == Mode::Ce {
                        "ce"
                    } else {
                        r.mode.name()
                    };
                    (path, median(&r.iter_us).unwrap_or(r.time_us))
                })
                .collect();
            let Some(&(fastest, t)) = cands.iter().min_by(|x, y| x.1.total_cmp(&y.1)) else {
                continue;
            };
            let keep = best.last().and_then(|&(_, prev)| {
                cands
                    .iter()
                    .find(|c| c.0 == prev && c.1 <= t * (1.0 + TUNE_TOLERANCE))
                    .map(|c| c.0)
            });
            best.push((b, keep.unwrap_or(fastest)));
        }
        for (i, (b, path)) in best.iter().enumerate() {
            let last = i + 1 == best.len();
            if last || best[i + 1].1 != *path {
                let bound = if last {
                    "max".to_string()
                } else {
                    b.to_string()
                };
                out.push_str(&format!("{} {bound} {path}\n", coll.name()));
            }
        }
    }
    // Read back as the library reads it; its digest is what the ranks of a job compare at
    // their first automatic registration, so nodes can check their files agree by this line.
    let shown = path.display().to_string();
    let digest = unicomm_nccl_api::Policy::parse(&out, &shown)?.digest();
    out.push_str(&format!(
        "# digest {digest:016x} (every rank of a job must read rules with the same digest)\n"
    ));
    std::fs::write(path, out).with_context(|| format!("writing {shown}"))
}

/// The JSON: nccl-tests' keys where it has them (time, algBw, busBw, wrong, size, count,
/// type, redop, inPlace), plus the mode, per-iteration min/p50/max (`iterTime`, from
/// `iterations` samples: one per call, or with `-G` one per graph launch divided by the calls
/// it replays) and the host's enqueue time per call (`hostTime`, `hostBound`).
pub fn json(path: &Path, h: &Header, results: &[Measure]) -> anyhow::Result<()> {
    let rows: Vec<_> = results
        .iter()
        .map(|r| {
            let alg = gbps(r.work.bytes, r.time_us);
            json!({
                "collective": r.work.coll.name(),
                "mode": r.mode.name(),
                "label": r.work.label,
                "size": r.work.bytes,
                "count": r.count,
                "type": r.work.dtype.to_string(),
                "redop": h.op,
                "inPlace": r.in_place,
                "time": r.time_us,
                "algBw": alg,
                "busBw": alg * r.work.coll.bus_factor(h.world),
                "wrong": r.wrong,
                "iterTime": {
                    "min": percentile(&r.iter_us, 0.0),
                    "p50": percentile(&r.iter_us, 0.5),
                    "max": percentile(&r.iter_us, 1.0),
                },
                "iterations": r.iter_us.len(),
                "hostTime": r.host_us,
                "hostBound": host_bound(r),
            })
        })
        .collect();
    let doc = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "args": h.args,
        "env": h.env.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
        "vendor": h.vendor,
        "library": {
            "backend": h.caps.backend,
            "version": h.caps.version.to_string(),
            "path": h.caps.library_path,
        },
        "nranks": h.world,
        "devices": h.devices.iter().map(|d| json!({
            "rank": d.rank,
            "pid": d.pid,
            "hostname": d.hostname,
            "device": d.device,
            "device_hex": d.device_hex,
            "device_info": d.device_info,
        })).collect::<Vec<_>>(),
        "type": h.dtype,
        "redop": h.op,
        "warmupIters": h.iters.0,
        "order": h.order,
        "cudaGraphLaunches": h.graphs,
        "iters": h.iters.1,
        "results": rows,
    });
    std::fs::write(path, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// One plotted line: its mode and (size, busbw, us) points.
type Series = (String, Vec<(f64, f64, f64)>);

/// One row per collective: bus bandwidth and time per call against size (log-log), one line
/// per mode, out-of-place results.
pub fn plot(path: &Path, h: &Header, results: &[Measure]) -> anyhow::Result<()> {
    let points: Vec<(Coll, &'static str, f64, f64, f64)> = results
        .iter()
        .filter(|r| !r.in_place)
        .map(|r| {
            let alg = gbps(r.work.bytes, r.time_us);
            let bus = alg * r.work.coll.bus_factor(h.world);
            (
                r.work.coll,
                r.mode.name(),
                r.work.bytes as f64,
                bus,
                r.time_us,
            )
        })
        .collect();
    draw(
        path,
        &format!("{} {} {} ranks", h.caps.backend, h.caps.version, h.world),
        &points,
    )
}

/// Draws `(collective, mode, size, busbw, us)` points.
pub fn draw(
    path: &Path,
    title: &str,
    points: &[(Coll, &str, f64, f64, f64)],
) -> anyhow::Result<()> {
    let mut colls: Vec<Coll> = Vec::new();
    for p in points {
        if !colls.contains(&p.0) {
            colls.push(p.0);
        }
    }
    let rows = colls.len().max(1);
    let root = SVGBackend::new(path, (1400, 460 * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut modes: Vec<String> = Vec::new();
    for p in points {
        if !modes.iter().any(|m| m == p.1) {
            modes.push(p.1.to_string());
        }
    }
    for (area, coll) in root.split_evenly((rows, 1)).iter().zip(&colls) {
        let (left, right) = area.split_horizontally(700);
        let mut series: Vec<Series> = Vec::new();
        for p in points.iter().filter(|p| p.0 == *coll) {
            match series.iter_mut().find(|(n, _)| n == p.1) {
                Some((_, v)) => v.push((p.2, p.3, p.4)),
                None => series.push((p.1.to_string(), vec![(p.2, p.3, p.4)])),
            }
        }
        let xmax = series
            .iter()
            .flat_map(|s| s.1.iter().map(|p| p.0))
            .fold(8.0, f64::max);
        let bmax = series
            .iter()
            .flat_map(|s| s.1.iter().map(|p| p.1))
            .fold(1.0, f64::max);
        let tmax = series
            .iter()
            .flat_map(|s| s.1.iter().map(|p| p.2))
            .fold(10.0, f64::max);
        for (panel, latency) in [(&left, false), (&right, true)] {
            let ymax = if latency { tmax * 1.5 } else { bmax * 1.2 };
            let what = if latency {
                "time per call (us)"
            } else {
                "bus bandwidth (GB/s)"
            };
            let mut chart = ChartBuilder::on(panel)
                .caption(
                    format!("{title}: {} {what}", coll.name()),
                    ("sans-serif", 17),
                )
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .build_cartesian_2d(
                    (1.0f64..xmax * 1.5).log_scale(),
                    (0.01f64..ymax).log_scale(),
                )?;
            chart
                .configure_mesh()
                .x_desc("size (bytes)")
                .y_desc(if latency { "us" } else { "GB/s" })
                .x_label_formatter(&|x| human(*x))
                .draw()?;
            for (name, pts) in &series {
                let i = modes.iter().position(|m| m == name).unwrap_or(0);
                let color = Palette99::pick(i).to_rgba();
                let data: Vec<(f64, f64)> = pts
                    .iter()
                    .map(|p| (p.0, if latency { p.2 } else { p.1.max(0.01) }))
                    .collect();
                chart
                    .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))?
                    .label(name.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                    });
                chart.draw_series(data.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
        }
    }
    root.present()
        .with_context(|| format!("writing {}", path.display()))
}

/// 8 B, 1 KiB, 512 MiB.
fn human(x: f64) -> String {
    let x = x.round() as u64;
    for (u, s) in [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")] {
        if x >= u {
            return format!("{} {s}", x / u);
        }
    }
    format!("{x} B")
}

/// Re-draws the plot of a run from its JSON (`--replot FILE.json --plot OUT.svg`).
pub fn replot(json_path: &Path, out: &Path) -> anyhow::Result<()> {
    let doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(json_path)
            .with_context(|| format!("reading {}", json_path.display()))?,
    )?;
    let mut points = Vec::new();
    let rows = doc["results"]
        .as_array()
        .context("no results in the JSON")?;
    for r in rows {
        if r["inPlace"].as_bool() == Some(true) {
            continue;
        }
        let coll = match r["collective"].as_str() {
            Some("all_reduce") => Coll::AllReduce,
            Some("all_to_all") => Coll::AllToAll,
            Some("all_gather") => Coll::AllGather,
            Some("reduce_scatter") => Coll::ReduceScatter,
            Some("broadcast") => Coll::Broadcast,
            _ => continue,
        };
        let mode: &'static str = match r["mode"].as_str() {
            Some(m) => Mode::value_variants()
                .iter()
                .map(|v| v.name())
                .find(|n| *n == m)
                .unwrap_or("?"),
            None => continue,
        };
        points.push((
            coll,
            mode,
            r["size"].as_f64().unwrap_or(0.0),
            r["busBw"].as_f64().unwrap_or(0.0),
            r["time"].as_f64().unwrap_or(0.0),
        ));
    }
    let title = format!(
        "{} {} {} ranks",
        doc["library"]["backend"].as_str().unwrap_or("?"),
        doc["library"]["version"].as_str().unwrap_or("?"),
        doc["nranks"]
    );
    draw(out, &title, &points)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Coll, Work};

    fn m(bytes: usize, mode: Mode, iters: &[f64]) -> Measure {
        Measure {
            work: Work {
                coll: Coll::AllReduce,
                bytes,
                dtype: unicomm::DataType::F32,
                label: "",
            },
            mode,
            in_place: false,
            count: bytes / 4,
            time_us: iters.iter().sum::<f64>() / iters.len() as f64,
            iter_us: iters.to_vec(),
            host_us: 0.0,
            wrong: Some(0),
        }
    }

    #[test]
    fn host_bound_when_enqueueing_takes_nearly_the_device_time() {
        let mut r = m(8, Mode::Window, &[10.0, 10.0]);
        assert!(!host_bound(&r));
        r.host_us = 8.9;
        assert!(!host_bound(&r));
        r.host_us = 9.0;
        assert!(host_bound(&r));
        r.host_us = 14.0;
        assert!(host_bound(&r));
        r.time_us = 0.0;
        assert!(!host_bound(&r), "no time measured: not called host-bound");
    }

    /// The tuner ranks paths by the median iteration (one slow iteration does not decide)
    /// and keeps the previous size's path within 3% of the fastest.
    #[test]
    fn tune_uses_the_median_and_keeps_a_path_within_the_tolerance() {
        let h = Header {
            args: vec!["unicomm-bench".into()],
            vendor: "test".into(),
            caps: unicomm::local_comms_n(unicomm::Vendor::Mock, Some(1))
                .expect("a mock communicator")[0]
                .capabilities(),
            world: 2,
            dtype: "float".into(),
            op: "sum".into(),
            iters: (1, 4),
            env: Vec::new(),
            order: String::new(),
            graphs: 0,
            devices: Vec::new(),
        };
        let results = vec![
            // 8 B: the window's mean (29.5) loses to registered (8.0), its median (6) wins.
            m(8, Mode::Window, &[6.0, 6.0, 6.0, 100.0]),
            m(8, Mode::Registered, &[8.0, 8.0, 8.0, 8.0]),
            // 32 B: registered is 2% faster: the window stays.
            m(32, Mode::Window, &[6.12, 6.12, 6.12, 6.12]),
            m(32, Mode::Registered, &[6.0, 6.0, 6.0, 6.0]),
            // 128 B: registered is 20% faster: it takes over.
            m(128, Mode::Window, &[7.2, 7.2, 7.2, 7.2]),
            m(128, Mode::Registered, &[6.0, 6.0, 6.0, 6.0]),
        ];
        let path =
            std::env::temp_dir().join(format!("unicomm-tune-test-{}.txt", std::process::id()));
        tune(&path, &h, &results).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let rules: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            rules,
            ["all_reduce 32 window", "all_reduce max registered"],
            "{text}"
        );
        // The digest line is the library's digest of the rules as it reads the file.
        let digest = unicomm_nccl_api::Policy::parse(&text, "t")
            .unwrap()
            .digest();
        assert!(text.contains(&format!("# digest {digest:016x} ")), "{text}");
    }
}
