//! The nccl-tests-style table (bus bandwidth by nccl-tests' formulas) and the memory
//! each mode took.

use crate::run::Measure;
use crate::{Coll, Mode};

pub(crate) fn gbps(bytes: usize, us: f64) -> f64 {
    if us > 0.0 {
        bytes as f64 / (us * 1e3)
    } else {
        0.0
    }
}

/// Host-bound: enqueueing the timed iterations took at least this share of their device
/// time, so the device waited for the host and the time is the host path's.
pub(crate) const HOST_BOUND: f64 = 0.9;

/// Whether `m`'s time is the host's (see [`HOST_BOUND`]).
pub fn host_bound(m: &Measure) -> bool {
    m.time_us > 0.0 && m.host_us >= HOST_BOUND * m.time_us
}

pub(crate) fn wrong(w: Option<u64>) -> String {
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
        heading(coll);
        let mut keys: Vec<(usize, Mode, &'static str)> = Vec::new();
        for r in results.iter().filter(|r| r.work.coll == coll) {
            let k = (r.work.bytes, r.mode, r.work.label);
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        for key in keys {
            row(results, (coll, world), key);
        }
    }
}

/// A collective's name and its columns' two header lines.
fn heading(coll: Coll) {
    println!("#\n# {}", coll.name());
    let line = |c: [&str; 12]| {
        println!(
            "# {:>12} {:>12} {:>8} {:>10} | {:>10} {:>8} {:>8} {:>6} | {:>10} {:>8} {:>8} {:>6}",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11]
        )
    };
    line([
        "size", "count", "type", "mode", "time", "algbw", "busbw", "#wrong", "time", "algbw",
        "busbw", "#wrong",
    ]);
    line([
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
        "in",
    ]);
}

/// One row: a size in one mode, out of place then in place.
fn row(
    results: &[Measure],
    (coll, world): (Coll, usize),
    (bytes, mode, label): (usize, Mode, &'static str),
) {
    let find = |inp: bool| {
        results.iter().find(|r| {
            // The label too: a preset's shapes can share a size (decode h4096 b64, h8192 b32).
            r.work.coll == coll
                && r.work.bytes == bytes
                && r.work.label == label
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
    let (count, dtype) = any.map_or((0, String::new()), |m| (m.count, m.work.dtype.to_string()));
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

pub(crate) fn percentile(v: &[f64], p: f64) -> f64 {
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
