//! The JSON report: the header and every measurement.

use std::path::Path;

use anyhow::Context;
use serde_json::json;

use super::header::Header;
use super::table::*;
use crate::run::Measure;

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
