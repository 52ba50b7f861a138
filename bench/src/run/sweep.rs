//! The sweep: the workloads in batches that fit the devices' memory, every mode per batch,
//! progress shown.

use anyhow::{bail, Context};
use half::{bf16, f16};
use indicatif::{ProgressBar, ProgressStyle};
use unicomm::{AnyStream, DataType, ReduceOp};

use super::cells::drive_modes;
use super::data::*;
use super::drive::*;
use super::modes::*;
use super::ranks::*;
use crate::{Args, Coll, Mode, Order, Work};

/// Whether `need` bytes per rank (every mode's two buffers) fit at once: within 3/4 of
/// each rank's free device memory where the backend reports it (the rest for the library's
/// own: auto's second communicator, NCCL's buffers), else (the mock: host memory, every rank
/// of this process) within [`HOST_BUDGET`] in all.
pub(crate) fn room(comms: &[unicomm::Comm], need: usize) -> Result<(), String> {
    let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
    let mut reported = false;
    for c in comms {
        if let Ok((free, _)) = c.device_memory() {
            reported = true;
            if need > free / 4 * 3 {
                return Err(format!(
                    "every mode's buffers at once need {:.0} MiB per rank, {:.0} MiB free",
                    mib(need),
                    mib(free)
                ));
            }
        }
    }
    let all = need.saturating_mul(comms.len());
    if !reported && all > HOST_BUDGET {
        return Err(format!(
            "every mode's buffers at once need {:.0} MiB of host memory, more than {:.0} MiB",
            mib(all),
            mib(HOST_BUDGET)
        ));
    }
    Ok(())
}

/// Host memory the buffers of a backend without device memory (the mock) may take at once.
pub(crate) const HOST_BUDGET: usize = 4 << 30;

/// The largest buffer any workload needs per rank, in elements.
pub(crate) fn capacity(works: &[Work], w: usize) -> usize {
    works
        .iter()
        .filter_map(|wk| shape(wk, w).map(|(_, s, r)| s.max(r)))
        .max()
        .unwrap_or(1)
        .max(1)
}

/// Runs every mode over every workload and placement; one thread per rank (or one for all
/// with `--single-thread`). With `--order size` (the default) the modes take turns at each
/// size, a collective at a time; with `--order mode` each mode runs every size before the
/// next. `done` is called with the results so far after each unit (a collective, or a
/// mode), so a run cut short keeps what it measured.
pub fn sweep(
    comms: &[unicomm::Comm],
    a: &Args,
    works: &[Work],
    modes: &[Mode],
    places: &[bool],
    done: &dyn Fn(&[Measure]),
) -> anyhow::Result<(Vec<Measure>, Vec<ModeMemory>, Option<anyhow::Error>)> {
    let dtype = works.first().map_or(a.dtype, |w| w.dtype);
    if works.iter().any(|w| w.dtype != dtype) {
        bail!("one element type per run");
    }
    let w = comms.first().map_or(0, |c| c.world_size());
    // One rank per process (under a launcher): every process measures its own rank; the
    // ranks' figures are combined (slowest time) through the communicator after each unit.
    let per_process = comms.len() < w;
    if per_process && a.single_thread {
        bail!("--single-thread drives every rank from one process; under a launcher each process has one");
    }
    let units = plan_units(comms, a, works, modes, w, per_process)?;
    let bar = progress(comms, (modes.len() * works.len() * places.len()) as u64);
    let mut results = Vec::new();
    // Per mode, the largest rank's cost in any unit.
    let mut memory: Vec<ModeMemory> = Vec::new();
    for (unit_works, unit_modes) in &units {
        let names: Vec<&str> = unit_modes.iter().map(|m| m.name()).collect();
        bar.set_message(match a.order {
            Order::Mode => names.join(","),
            Order::Size => unit_works
                .first()
                .map_or("", |wk| wk.coll.name())
                .to_string(),
        });
        let unit = Unit {
            works: unit_works,
            modes: unit_modes,
            places,
            cap: capacity(unit_works, w),
        };
        let per_rank = run_unit(comms, a, dtype, &unit, &|| bar.inc(1));
        let per_rank = match ranks_figures(comms, per_rank, &names, per_process) {
            Ok(p) => p,
            Err(e) => {
                // The failing rank aborted its communicator: nothing later can run. What
                // was measured so far is kept and reported.
                bar.finish_and_clear();
                return Ok((results, memory, Some(e)));
            }
        };
        results.extend(measures(&unit, &per_rank, &mut memory));
        done(&results);
    }
    bar.finish_and_clear();
    Ok((results, memory, None))
}

/// The progress bar of `steps` (shown by rank 0 only: the other processes of a launched run
/// stay quiet).
fn progress(comms: &[unicomm::Comm], steps: u64) -> ProgressBar {
    let bar = if comms.first().is_some_and(|c| c.rank() == 0) {
        ProgressBar::new(steps)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// One unit of a sweep: its workloads, the modes taking turns, the placements, and the
/// largest buffer (elements) any workload needs.
struct Unit<'u> {
    works: &'u [Work],
    modes: &'u [Mode],
    places: &'u [bool],
    cap: usize,
}

/// Runs `unit` on every rank of this process: from one thread (`--single-thread`; a failure
/// aborts every communicator) or one thread per rank (a failing rank aborts its own, so its
/// peers do not wait). Each rank's figures per mode, or its error.
fn run_unit(
    comms: &[unicomm::Comm],
    a: &Args,
    dtype: DataType,
    unit: &Unit<'_>,
    tick: &(dyn Fn() + Sync),
) -> Vec<anyhow::Result<Vec<ModeOut>>> {
    let Unit {
        works,
        modes,
        places,
        cap,
    } = *unit;
    if a.single_thread {
        let run = || -> anyhow::Result<Vec<Vec<ModeOut>>> {
            let streams: Vec<AnyStream> = comms
                .iter()
                .map(|c| c.create_stream())
                .collect::<unicomm::Result<_>>()?;
            let d = Driver {
                comms,
                streams: &streams,
            };
            by_type!(dtype, T => drive_modes::<T>(&d, a, works, places, modes, cap, tick))
        };
        return match run() {
            Ok(v) => v.into_iter().map(Ok).collect(),
            Err(e) => {
                for c in comms {
                    let _ = c.abort();
                }
                let msg = format!("{e:#}");
                comms
                    .iter()
                    .map(|_| Err(anyhow::anyhow!("{msg}")))
                    .collect()
            }
        };
    }
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || -> anyhow::Result<Vec<ModeOut>> {
                    let st = c.create_stream()?;
                    let d = Driver {
                        comms: std::slice::from_ref(c),
                        streams: std::slice::from_ref(&st),
                    };
                    let rank0 = || {
                        if c.rank() == 0 {
                            tick()
                        }
                    };
                    let r = by_type!(dtype, T => drive_modes::<T>(&d, a, works, places, modes, cap, &rank0));
                    match r {
                        Ok(mut v) => v.pop().context("no figures for this rank"),
                        Err(e) => {
                            // Peers must not wait for this rank (docs: one rank fails).
                            let _ = c.abort();
                            Err(e)
                        }
                    }
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a rank panicked")))
            })
            .collect()
    })
}

/// Every rank's figures of a unit, its errors named by rank and modes; one rank per process:
/// combined through the communicator (the slowest rank's time).
fn ranks_figures(
    comms: &[unicomm::Comm],
    per_rank: Vec<anyhow::Result<Vec<ModeOut>>>,
    names: &[&str],
    per_process: bool,
) -> anyhow::Result<Vec<Vec<ModeOut>>> {
    let per_rank: Vec<Vec<ModeOut>> = per_rank
        .into_iter()
        .zip(comms.iter())
        .map(|(o, c)| {
            // The communicator's rank, not its index here (one per process: always 0).
            let r = c.rank();
            o.with_context(|| format!("rank {r}, modes {}", names.join(",")))
        })
        .collect::<anyhow::Result<_>>()?;
    if per_process {
        per_rank
            .into_iter()
            .map(|mine| combine(&comms[0], mine))
            .collect()
    } else {
        Ok(per_rank)
    }
}

/// The unit's measures: per mode, workload and placement, the slowest rank's times (per
/// iteration too) and everyone's wrong elements; each mode's largest memory cost joins
/// `memory`.
fn measures(
    unit: &Unit<'_>,
    per_rank: &[Vec<ModeOut>],
    memory: &mut Vec<ModeMemory>,
) -> Vec<Measure> {
    let mut out = Vec::new();
    for (m, &mode) in unit.modes.iter().enumerate() {
        let cost = per_rank.iter().filter_map(|p| p[m].1).max();
        match memory.iter_mut().find(|(mm, _)| *mm == mode) {
            Some(slot) => slot.1 = slot.1.max(cost),
            None => memory.push((mode, cost)),
        }
        let mut i = 0;
        for work in unit.works {
            for &in_place in unit.places {
                let cells: Vec<Option<Cell>> = per_rank.iter().map(|p| p[m].0[i].clone()).collect();
                i += 1;
                let Some(count) = cells.first().and_then(|c| c.as_ref()).map(|c| c.count) else {
                    continue;
                };
                let cells: Vec<Cell> = cells.into_iter().flatten().collect();
                out.push(slowest(*work, mode, in_place, count, &cells));
            }
        }
    }
    out
}

/// One measure from every rank's cell: the slowest rank bounds a collective.
fn slowest(work: Work, mode: Mode, in_place: bool, count: usize, cells: &[Cell]) -> Measure {
    let time_us = cells.iter().map(|c| c.total_us).fold(0.0, f64::max);
    let host_us = cells.iter().map(|c| c.host_us).fold(0.0, f64::max);
    let iters = cells.iter().map(|c| c.iter_us.len()).min().unwrap_or(0);
    let iter_us = (0..iters)
        .map(|k| cells.iter().map(|c| c.iter_us[k]).fold(0.0, f64::max))
        .collect();
    let wrong = cells.iter().map(|c| c.wrong).sum::<Option<u64>>();
    Measure {
        work,
        mode,
        in_place,
        count,
        time_us,
        iter_us,
        host_us,
        wrong,
    }
}

/// The units of a sweep: which workloads run with which modes taking turns. With `--order
/// size`, a collective's workloads with every mode at once where every mode's buffers fit
/// on every rank, else one mode at a time; with `--order mode`, one mode at a time.
fn plan_units(
    comms: &[unicomm::Comm],
    a: &Args,
    works: &[Work],
    modes: &[Mode],
    w: usize,
    per_process: bool,
) -> anyhow::Result<Vec<(Vec<Work>, Vec<Mode>)>> {
    let dtype = works.first().map_or(a.dtype, |w| w.dtype);
    Ok(match a.order {
        Order::Mode => modes.iter().map(|&m| (works.to_vec(), vec![m])).collect(),
        Order::Size => {
            let mut colls: Vec<Coll> = Vec::new();
            for wk in works {
                if !colls.contains(&wk.coll) {
                    colls.push(wk.coll);
                }
            }
            let mut units = Vec::new();
            for c in colls {
                let ws: Vec<Work> = works.iter().filter(|wk| wk.coll == c).copied().collect();
                let need = modes.len() * 2 * capacity(&ws, w) * dtype.size();
                let mut fits = room(comms, need);
                if per_process {
                    // Every rank must run the same calls: one rank short of room decides.
                    let short = f64::from(u8::from(fits.is_err()));
                    let any = reduce_host(&comms[0], &[short], ReduceOp::Max)?;
                    if fits.is_ok() && any.first().is_some_and(|&s| s > 0.0) {
                        fits = Err(
                            "another rank has too little memory for every mode's buffers at once"
                                .into(),
                        );
                    }
                }
                match fits {
                    Ok(()) => units.push((ws, modes.to_vec())),
                    Err(why) => {
                        // Taking turns needs every mode's buffers at once; one after
                        // another needs one mode's.
                        if comms.first().is_some_and(|c| c.rank() == 0) {
                            println!("# {}: one mode at a time ({why})", c.name());
                        }
                        units.extend(modes.iter().map(|&m| (ws.clone(), vec![m])));
                    }
                }
            }
            units
        }
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    pub(crate) fn raw_in_place_pointers_are_nccls() {
        let (base, n, rank) = (0x1000, 10, 3);
        let chunk = base + rank * n * 4;
        let dt = DataType::F32;
        assert_eq!(
            in_place_ptrs(Coll::AllGather, base, rank, n, dt),
            (chunk, base)
        );
        assert_eq!(
            in_place_ptrs(Coll::ReduceScatter, base, rank, n, dt),
            (base, chunk)
        );
        for c in [Coll::AllReduce, Coll::Broadcast] {
            assert_eq!(in_place_ptrs(c, base, rank, n, dt), (base, base));
        }
    }

    /// A device row survives the bytes it is gathered as; a long name is cut to fit, at a
    /// character boundary, and tabs in names do not shift the fields.
    #[test]
    pub(crate) fn device_rows_round_trip_through_their_bytes() {
        let row = DeviceRow {
            rank: 3,
            pid: 4242,
            hostname: "node\t7".into(),
            device: Some(1),
            device_hex: Some("0000:1b:00".into()),
            device_info: "NVIDIA H200".into(),
        };
        let back = DeviceRow::decode(3, &row.encode());
        assert_eq!(back.hostname, "node 7");
        assert_eq!(
            (back.pid, back.device, back.device_hex.as_deref()),
            (4242, Some(1), Some("0000:1b:00"))
        );
        assert_eq!(back.device_info, "NVIDIA H200");
        let long = DeviceRow {
            device: None,
            device_hex: None,
            device_info: "é".repeat(400),
            ..row
        };
        let b = long.encode();
        assert_eq!(b.len(), ROW_BYTES);
        let back = DeviceRow::decode(3, &b);
        assert!(back.device_info.chars().all(|c| c == 'é') && !back.device_info.is_empty());
        assert_eq!((back.device, back.device_hex), (None, None));
    }

    #[test]
    pub(crate) fn room_counts_every_rank_of_the_process_on_the_mock() {
        let comms = unicomm::local_comms_n(unicomm::Vendor::Mock, Some(2)).expect("mock");
        assert!(room(&comms, HOST_BUDGET / 2).is_ok());
        let why = room(&comms, HOST_BUDGET / 2 + 1).expect_err("over the budget");
        assert!(why.contains("host memory"), "{why}");
        assert!(room(&comms, usize::MAX).is_err(), "no overflow");
    }
}
