//! `-G` through unicomm's own capture ([`unicomm::Graph`]): a turn's calls captured once
//! through a step and the graph launched back to back, on every backend (NCCL, RCCL, the
//! mock), for one rank driven by this thread.

use anyhow::Context;
use unicomm::{Counts, ReduceOp, Step, View, ViewMut};

use super::data::*;
use super::drive::{settle, Driver, Turn};
use super::modes::{lens, Call, Held};
use crate::Coll;

/// One call of `k` through the step, on the views made for it.
fn launch_step<'g, T: Val>(
    step: &Step<'g>,
    c: &'g unicomm::Comm,
    k: &Call<'_>,
    (s, r): (&'g View<'g, T>, &'g ViewMut<'g, T>),
) -> unicomm::Result<()> {
    // `premulsum`: the scalar 1 of this run's type.
    let op = match k.op {
        ReduceOp::PreMulSum(_) => ReduceOp::pre_mul_sum(T::of(1)),
        op => op,
    };
    match (k.coll, k.in_place) {
        (Coll::AllReduce, false) => step.all_reduce(c, s, r, op),
        (Coll::AllReduce, true) => step.all_reduce_in_place(c, r, op),
        (Coll::Broadcast, false) => step.broadcast(c, s, r, 0),
        (Coll::Broadcast, true) => step.broadcast_in_place(c, r, 0),
        (Coll::AllGather, false) => step.all_gather(c, s, r),
        (Coll::AllGather, true) => step.all_gather_in_place(c, r),
        (Coll::ReduceScatter, false) => step.reduce_scatter(c, s, r, op),
        (Coll::ReduceScatter, true) => step.reduce_scatter_in_place(c, r, op),
        (Coll::AllToAll, _) => step.all_to_all(c, s, r),
        (Coll::Gather, _) => step.gather(c, s, r, 0),
        (Coll::Scatter, _) => step.scatter(c, s, r, 0),
        (Coll::AllToAllV, _) => {
            let Some(v) = k.a2av.as_ref() else {
                return Err(unicomm::Error::invalid(
                    "a2av",
                    "all_to_all_v without its counts",
                ));
            };
            let (sc, rc) = (v.send(c.rank()), v.recv(c.rank()));
            let (sd, rd) = (unicomm::packed_displs(&sc)?, unicomm::packed_displs(&rc)?);
            let counts = |counts, displs| Counts { counts, displs };
            step.all_to_all_v(c, s, counts(&sc, &sd), r, counts(&rc, &rd))
        }
    }
}

/// `iters` calls captured into one graph (unicomm's capture: warmed up first, then
/// recorded through a step), launched once (the upload) and then `launches` times back to
/// back with an event after each, as [`super::drive::graph_turn`] does with CUDA's capture.
/// The real buffers see `1 + launches` replays (the warm-up pass uses scratch memory).
pub(crate) fn step_graph_turn<'c, T: Val>(
    d: &Driver<'c, '_>,
    k: &Call<'_>,
    h: &mut Held<'c, T>,
    iters: usize,
    launches: usize,
) -> anyhow::Result<Turn> {
    let (c, st) = (&d.comms[0], &d.streams[0]);
    if let (Some(algorithm), Held::Sym(sym, out)) = (k.mode.symmetric(), &*h) {
        let how = unicomm::SymmetricOptions::new(k.op, algorithm);
        let graph = unicomm::Graph::capture(st, |step| {
            (0..iters).try_for_each(|_| step.all_reduce_symmetric(c, sym, k.count, out, how))
        })
        .context("capturing the symmetric all-reduce through unicomm::Graph")?;
        return launched(d, &graph, iters, launches);
    }
    if let Held::Fused(f) = &*h {
        let weight = f.weight(k.hidden)?;
        let graph = unicomm::Graph::capture(st, |step| {
            (0..iters).try_for_each(|_| f.step(step, c, k.count, &weight))
        })
        .context("capturing the fused all-reduce + RMSNorm through unicomm::Graph")?;
        return launched(d, &graph, iters, launches);
    }
    if let Held::Dev(dc, s, r) = &*h {
        let graph = unicomm::Graph::capture(st, |step| {
            (0..iters).try_for_each(|_| step.all_reduce_device(c, dc, s, r, k.count, k.op))
        })
        .context("capturing the device-API all-reduce through unicomm::Graph")?;
        return launched(d, &graph, iters, launches);
    }
    let (sn, rn) = lens(k, c.rank(), c.world_size())?;
    let (send, recv) = h.bufs();
    let s = send.view().slice(..sn)?;
    let r = recv.view_mut().into_slice_mut(..rn)?;
    let graph = unicomm::Graph::capture(st, |step| {
        (0..iters).try_for_each(|_| launch_step(step, c, k, (&s, &r)))
    })
    .context("capturing the iterations through unicomm::Graph")?;
    launched(d, &graph, iters, launches)
}

/// `graph` launched once (the upload) and then `launches` times back to back, an event
/// after each.
fn launched(
    d: &Driver<'_, '_>,
    graph: &unicomm::Graph<'_>,
    iters: usize,
    launches: usize,
) -> anyhow::Result<Turn> {
    let st = &d.streams[0];
    // One launch before timing: the first uploads the graph.
    graph.launch(st)?;
    let mut marks = d.mark()?;
    let enqueue = std::time::Instant::now();
    for _ in 0..launches {
        graph.launch(st)?;
        marks[0].push(st.record()?);
    }
    let host_us = enqueue.elapsed().as_secs_f64() * 1e6;
    settle(d, &marks, iters.max(1) as f64, host_us)
}
