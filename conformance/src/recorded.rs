//! The one door: every kind of stream-ordered work (a collective, each symmetric kernel, a
//! symmetric barrier, the one-sided calls, the device-API kernel) reaches the backend through
//! `Collective::enqueue` and is recorded there exactly once in the flight recorder, under
//! its own name and path; a graph counts every piece of work it captured and records each at
//! every replay. (Before the door took every kind, a symmetric all-reduce left the ring
//! empty and a graph of three of them and one all-reduce reported one collective.)

use unicomm_core::graph::Graph;
use unicomm_core::{each_rank, Collective, Comm, DeviceCommRequirements, Error, Result};
use unicomm_core::{DeviceStream, ExpertConfig, ExpertTokens, ReduceOp, SignalWait};

use crate::symmetric::ALGORITHMS;
use unicomm_core::symmetric::SymmetricOptions;

/// One record as the dump spells it: its number, kind, path and whether a graph replayed it.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    seq: u64,
    kind: String,
    path: String,
    replayed: bool,
}

/// The text after `key` up to the next `,` or `}` (quotes taken off).
fn field<'t>(entry: &'t str, key: &str) -> Option<&'t str> {
    let at = entry.find(key)? + key.len();
    let rest = &entry[at..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    Some(rest[..end].trim_matches('"'))
}

/// The records of `c` numbered `from` or later, oldest first.
fn records_since<C: Collective>(c: &Comm<C>, from: u64) -> Result<Vec<Entry>> {
    let json = c
        .flight_record("conformance")
        .ok_or_else(|| wrong(c.rank(), "the backend keeps no flight recorder".into()))?;
    Ok(json
        .split("{\"seq\":")
        .skip(1)
        .filter_map(|e| {
            let seq = e[..e.find(',')?].parse().ok()?;
            Some(Entry {
                seq,
                kind: field(e, "\"kind\":")?.to_string(),
                path: field(e, "\"path\":")?.to_string(),
                replayed: field(e, "\"graph\":").is_some_and(|g| g != "null"),
            })
        })
        .filter(|e| e.seq >= from)
        .collect())
}

/// The number the next record of `c` takes.
fn next_seq<C: Collective>(c: &Comm<C>) -> Result<u64> {
    let json = c.flight_record("conformance").unwrap_or_default();
    field(&json, "\"next_seq\":")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| wrong(c.rank(), format!("no next_seq in the dump: {json}")))
}

fn wrong(rank: usize, what: String) -> Error {
    Error::invalid("flight recorder", format!("rank {rank}: {what}"))
}

/// Runs `work` and checks that it left exactly the records `want` (kind and path, `None`:
/// any path), in order.
fn recorded_once<C: Collective>(
    c: &Comm<C>,
    want: &[(&str, Option<&str>)],
    work: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let from = next_seq(c)?;
    work()?;
    let got = records_since(c, from)?;
    let matches = got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, (k, p))| g.kind == *k && p.is_none_or(|p| g.path == p));
    if !matches {
        return Err(wrong(
            c.rank(),
            format!("{want:?} should be recorded once each, in order; the records: {got:?}"),
        ));
    }
    Ok(())
}

/// Every kind of work the backend has, each recorded once (see the module doc); `reqs`, the
/// device communicator's requirements where the device-API kernel is to be tried. Returns
/// per rank the kinds checked (those the backend and its library have: a kind answered
/// `Unsupported` is left out, and says so by its absence).
pub fn every_kind_of_work_is_recorded_once<C: Collective>(
    comms: &[Comm<C>],
    reqs: Option<&DeviceCommRequirements>,
) -> Result<Vec<Vec<&'static str>>> {
    each_rank(comms, |c| -> Result<Vec<&'static str>> {
        let st = c.create_stream()?;
        let mut seen = vec!["all_reduce"];
        let x = c.upload(&[1.0f32; 8], &st)?;
        let mut out = c.alloc::<f32>(8)?;
        recorded_once(c, &[("all_reduce", None)], || {
            c.all_reduce(&x, &mut out, ReduceOp::Sum, &st)
        })?;
        if symmetric_recorded(c, &st)? {
            seen.extend(["symmetric_all_reduce", "symmetric_barrier", "graph"]);
        }
        if one_sided_recorded(c, &st)? {
            seen.extend(["signal", "wait_signal"]);
        }
        if let Some(reqs) = reqs {
            if device_recorded(c, reqs, &st)? {
                seen.push("device_all_reduce");
            }
        }
        st.synchronize()?;
        Ok(seen)
    })
}

/// The all-to-all with device counts (nothing sent), where the backend runs it.
fn exchange_recorded<C: Collective>(c: &Comm<C>, st: &C::Stream) -> Result<()> {
    let w = c.world_size();
    let (x, splits) = (
        c.alloc_symmetric::<f32>(4)?,
        c.alloc_symmetric::<i64>(3 * w)?,
    );
    splits.write_from_host(&vec![0i64; 3 * w], st)?;
    let mut out = c.alloc::<f32>(4)?;
    let want = [("symmetric_all_to_all_v", Some("pull"))];
    match recorded_once(c, &want, || c.all_to_all_vdev(&x, &splits, &mut out, st)) {
        Err(Error::Unsupported { .. }) => return Ok(()),
        other => other?,
    }
    // Expert parallelism's dispatch and combine (no token routed).
    let cfg = ExpertConfig {
        experts: w,
        max_tokens: 2,
        hidden: 1,
        top_k: 1,
    };
    let g = c.expert_group::<f32>(cfg)?;
    let (none, weights) = (c.alloc::<i32>(0)?, c.alloc::<f32>(0)?);
    let (mut got, mut counts) = (c.alloc::<f32>(g.received_len())?, c.alloc::<i32>(1)?);
    recorded_once(c, &[("expert_dispatch", Some("push"))], || {
        let o = ExpertTokens {
            tokens: &mut got,
            counts: &mut counts,
        };
        g.dispatch(&x, &none, o, st)
    })?;
    recorded_once(c, &[("expert_combine", Some("push"))], || {
        g.combine(&got, &none, &weights, &mut out, st)
    })
}

/// Each symmetric algorithm and a barrier eagerly, then a graph of three symmetric
/// all-reduces and one all-reduce: counted as four and recorded as four at its replay.
fn symmetric_recorded<C: Collective>(c: &Comm<C>, st: &C::Stream) -> Result<bool> {
    let n = 16;
    let sym = match c.alloc_symmetric_lamport::<f32>(n) {
        Err(Error::Unsupported { .. }) => return Ok(false),
        other => other?,
    };
    sym.write_from_host(&[1.0f32; 16], st)?;
    let mut out = c.alloc::<f32>(n)?;
    for algorithm in ALGORITHMS {
        let want = [("symmetric_all_reduce", Some(algorithm.name()))];
        recorded_once(c, &want, || {
            c.all_reduce_symmetric(
                &sym,
                n,
                &mut out,
                SymmetricOptions::new(ReduceOp::Sum, algorithm),
                st,
            )
        })?;
    }
    recorded_once(c, &[("symmetric_barrier", None)], || {
        c.symmetric_barrier(&sym, st)
    })?;
    exchange_recorded(c, st)?;
    let plain = c.alloc::<f32>(n)?;
    let graph = Graph::capture(st, |g| {
        for algorithm in ALGORITHMS {
            g.all_reduce_symmetric(
                c,
                &sym,
                n,
                &out,
                SymmetricOptions::new(ReduceOp::Sum, algorithm),
            )?;
        }
        g.all_reduce_in_place(c, &plain, ReduceOp::Sum)
    })?;
    if graph.collectives() != vec![(c.id(), 4)] {
        let counted = graph.collectives();
        return Err(wrong(
            c.rank(),
            format!("a graph of 3 symmetric all-reduces and 1 all-reduce counted {counted:?}"),
        ));
    }
    let from = next_seq(c)?;
    graph.launch(st)?;
    st.synchronize()?;
    let got = records_since(c, from)?;
    let kinds: Vec<&str> = got.iter().map(|e| e.kind.as_str()).collect();
    let want = [
        "symmetric_all_reduce",
        "symmetric_all_reduce",
        "symmetric_all_reduce",
        "all_reduce",
    ];
    if kinds != want || !got.iter().all(|e| e.replayed) {
        return Err(wrong(
            c.rank(),
            format!("the replay of the graph recorded {got:?}"),
        ));
    }
    Ok(true)
}

/// A signal to the next rank and the wait for the previous one's (worlds of 2 and more).
fn one_sided_recorded<C: Collective>(c: &Comm<C>, st: &C::Stream) -> Result<bool> {
    let (r, w) = (c.rank(), c.world_size());
    if w == 1 {
        return Ok(false);
    }
    let from = next_seq(c)?;
    match c.signal((r + 1) % w, st) {
        Err(Error::Unsupported { .. }) => {
            // Refused, and recorded as refused: nothing else.
            let got = records_since(c, from)?;
            let refused = got.len() == 1 && got[0].kind == "signal" && got[0].path == "refused";
            return match refused {
                true => Ok(false),
                false => Err(wrong(r, format!("a refused signal recorded {got:?}"))),
            };
        }
        other => other?,
    }
    recorded_once(c, &[("wait_signal", Some("library"))], || {
        c.wait_signal(&[SignalWait::new((r + w - 1) % w, 1)], st)
    })?;
    let got = records_since(c, from)?;
    match got.first() {
        Some(e) if e.kind == "signal" && got.len() == 2 => Ok(true),
        _ => Err(wrong(r, format!("a signal and a wait recorded {got:?}"))),
    }
}

/// The device-API kernel once, where the backend and its library have it.
fn device_recorded<C: Collective>(
    c: &Comm<C>,
    reqs: &DeviceCommRequirements,
    st: &C::Stream,
) -> Result<bool> {
    let dc = match c.device_comm(reqs) {
        Err(Error::Unsupported { .. }) => return Ok(false),
        other => other?,
    };
    let send = c.register_window(c.upload(&[1.0f32; 8], st)?)?;
    let mut recv = c.register_window(c.alloc::<f32>(8)?)?;
    recorded_once(c, &[("device_all_reduce", Some("device-api"))], || {
        c.all_reduce_device(&dc, &send, &mut recv, 8, ReduceOp::Sum, st)
    })?;
    st.synchronize()?;
    Ok(true)
}
