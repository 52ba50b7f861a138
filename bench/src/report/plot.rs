//! The SVG plot (plotters): bus bandwidth by size, one series per mode; and the plot
//! drawn again from a JSON report.

use std::path::Path;

use anyhow::Context;
use clap::ValueEnum;
use plotters::prelude::*;

use super::header::Header;
use super::table::*;
use crate::run::Measure;
use crate::{Coll, Mode};

/// One plotted line: its mode and (size, busbw, us) points.
pub(crate) type Series = (String, Vec<(f64, f64, f64)>);

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
        for (area, latency) in [(&left, false), (&right, true)] {
            let ymax = if latency { tmax * 1.5 } else { bmax * 1.2 };
            panel(area, (title, *coll, latency), &series, &modes, (xmax, ymax))?;
        }
    }
    root.present()
        .with_context(|| format!("writing {}", path.display()))
}

/// One panel: a collective's bus bandwidth (or, `latency`, time per call) by size, a line
/// per mode, on log axes up to `(xmax, ymax)`.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    (title, coll, latency): (&str, Coll, bool),
    series: &[Series],
    modes: &[String],
    (xmax, ymax): (f64, f64),
) -> anyhow::Result<()> {
    let what = if latency {
        "time per call (us)"
    } else {
        "bus bandwidth (GB/s)"
    };
    let mut chart = ChartBuilder::on(area)
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
    for (name, pts) in series {
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
    Ok(())
}

/// 8 B, 1 KiB, 512 MiB.
pub(crate) fn human(x: f64) -> String {
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
            Some("gather") => Coll::Gather,
            Some("scatter") => Coll::Scatter,
            Some("all_to_all_v") => Coll::AllToAllV,
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
