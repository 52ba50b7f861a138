//! The tune file: per collective and size, the fastest of the registered, window and
//! copy-engine paths (what `UNICOMM_TUNE_FILE` gives the automatic policy).

use std::path::Path;

use anyhow::Context;

use super::header::Header;
use crate::run::Measure;
use crate::{Coll, Mode};

/// The automatic policy's thresholds this run measured: per collective, the fastest of the
/// registered, window and ce modes at each size (out of place), as `UNICOMM_TUNE_FILE` rules.
/// How much slower (median) than the fastest path the previous size's path may be and
/// still be kept at the next size.
pub(crate) const TUNE_TOLERANCE: f64 = 0.03;

pub(crate) fn median(v: &[f64]) -> Option<f64> {
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
