//! Capture and replay ([`unicomm_core::graph`]): one step of every collective captured once
//! and replayed, data exact after each replay, on every backend that captures.

use unicomm_core::graph::Graph;

use crate::runner::{hold, Held};
use crate::Reg;
use unicomm_core::{
    each_rank, packed_displs, Buffer, Collective, Comm, Counts, DeviceStream, Error, ReduceOp,
    Result,
};

const N: usize = 6;

/// `[f(0), f(1), .., f(n - 1)]`.
fn each(f: &dyn Fn(usize) -> i64, n: usize) -> Vec<i64> {
    (0..n).map(f).collect()
}

fn check(what: &str, replay: u64, got: Vec<i64>, want: Vec<i64>) -> Result<()> {
    if got == want {
        return Ok(());
    }
    Err(Error::invalid(
        "graph",
        format!("{what} after replay {replay}: got {got:?}, want {want:?}"),
    ))
}

/// Rank `q`'s share of the variable-size collectives.
fn var(q: usize) -> usize {
    1 + q % N
}

/// What `name`'s output holds on rank `r` of `w` after `k` replays (rank `r`'s input is
/// `10 r + i`, its large input `100 r + i`); `None` where this rank's output is not written.
fn expected(name: &str, (r, w): (usize, usize), k: u64) -> Option<Vec<i64>> {
    let root_x = each(&|i| (10 * (w - 1) + i) as i64, N);
    let gathered = || each(&|i| (10 * (i / N) + i % N) as i64, N * w);
    Some(match name {
        "all_reduce" => each(&|i| (0..w).map(|q| (10 * q + i) as i64).sum(), N),
        "broadcast" | "broadcast in place" => root_x,
        "reduce (max)" | "gather" if r != 0 => return None,
        "reduce (max)" => root_x,
        "all_gather" | "all_gather in place" | "gather" => gathered(),
        "reduce_scatter" => each(&|i| (0..w).map(|q| (100 * q + r * N + i) as i64).sum(), N),
        "all_to_all" => each(&|i| (100 * (i / N) + r * N + i % N) as i64, N * w),
        "send/recv" => each(&|i| (10 * ((r + w - 1) % w) + i) as i64, N),
        "copy" => each(&|i| (10 * r + i) as i64, N),
        "in place" => vec![(w as i64).wrapping_pow(k as u32); N],
        // Reduced in place at every replay: the root's own input is the previous replay's
        // sum, the others' stay theirs.
        "reduce in place" if r != 0 => return None,
        "reduce in place" => each(
            &|i| i as i64 + k as i64 * (1..w).map(|q| (10 * q + i) as i64).sum::<i64>(),
            N,
        ),
        "scatter" => each(&|i| (100 * (w - 1) + r * N + i) as i64, N),
        // Rank q gives `1 + q % N` elements; blocks packed in rank order.
        "all_gather_v" => (0..w)
            .flat_map(|q| (0..var(q)).map(move |i| (10 * q + i) as i64))
            .collect(),
        "reduce_scatter_v" => {
            let at: usize = (0..r).map(var).sum();
            each(&|i| (0..w).map(|q| (100 * q + at + i) as i64).sum(), var(r))
        }
        // Each peer's chunk for rank r sits at (w - 1 - r) N in its send buffer.
        "all_to_all_v" => each(&|j| (100 * (j / N) + (w - 1 - r) * N + j % N) as i64, N * w),
        // A name without an expectation is checked against nothing, so it fails.
        _ => Vec::new(),
    })
}

/// Every collective of a captured step runs at each launch and only then: after the capture
/// the outputs are as they were (the capture pass runs nothing, the warm-up pass ran on
/// scratch memory); after each of `replays` launches they hold the collectives' results,
/// and an in-place all-reduce compounds once per launch. With `reg` other than
/// [`Reg::None`], a second in-place all-reduce runs on a buffer so registered (NCCL captures
/// its registered and symmetric kernels; a window or an automatic registration is made
/// before the capture, as registration is refused inside one).
pub fn captured_step_replays<C: Collective>(
    comms: &[Comm<C>],
    replays: u64,
    reg: Reg,
) -> Result<()> {
    each_rank(comms, |c| {
        let (r, w) = (c.rank(), c.world_size());
        let st = c.create_stream()?;
        let b = Every::new(c, &st)?;
        let held = match reg {
            Reg::None => None,
            _ => Some(hold(c, c.upload(&[1i64; N], &st)?, reg)?),
        };
        let reg = held.as_ref().map(Held::buffer);
        // The variable all-gather's input: a view of the first input, borrowed by the graph.
        let xv = b.xs.slice(..var(r))?;
        let graph = Graph::capture(&st, |g| b.capture(g, c, (&xv, reg)))?;
        st.synchronize()?;
        let mut outs = b.outputs();
        if let Some(b) = reg {
            outs.push(("in place", b));
        }
        replay_and_check(&graph, &st, &outs, (r, w), replays)?;
        drop(graph);
        if let Some(h) = held {
            h.release(c)?;
        }
        Ok(())
    })
    .map(drop)
}

/// The buffers of a step holding every collective: inputs, then one output each.
struct Every<C: Collective> {
    xs: Buffer<i64, C>,
    bigs: Buffer<i64, C>,
    v: Layouts,
    outs: Vec<(&'static str, Buffer<i64, C>)>,
}

impl<C: Collective> Every<C> {
    fn new(c: &Comm<C>, st: &C::Stream) -> Result<Self> {
        let (r, w) = (c.rank(), c.world_size());
        let x: Vec<i64> = (0..N).map(|i| (10 * r + i) as i64).collect();
        let big: Vec<i64> = (0..N * w).map(|i| (100 * r + i) as i64).collect();
        let zeros = |n: usize| c.upload(&vec![0i64; n], st);
        // The in-place and rooted ones: broadcast and reduce in place, all-gather and
        // reduce-scatter in NCCL's in-place layout, gather and scatter.
        let mut agi = vec![0i64; N * w];
        agi[r * N..(r + 1) * N].copy_from_slice(&x);
        let v = Layouts::new(w)?;
        let outs = vec![
            ("all_reduce", zeros(N)?),
            ("broadcast", zeros(N)?),
            ("reduce (max)", zeros(N)?),
            ("all_gather", zeros(N * w)?),
            ("reduce_scatter", zeros(N)?),
            ("all_to_all", zeros(N * w)?),
            ("send/recv", zeros(N)?),
            ("copy", zeros(N)?),
            ("in place", c.upload(&[1i64; N], st)?),
            ("broadcast in place", c.upload(&x, st)?),
            ("reduce in place", c.upload(&x, st)?),
            ("all_gather in place", c.upload(&agi, st)?),
            ("gather", zeros(N * w)?),
            ("scatter", zeros(N)?),
            ("all_gather_v", zeros(v.shares.iter().sum())?),
            ("reduce_scatter_v", zeros(var(r))?),
            ("all_to_all_v", zeros(N * w)?),
        ];
        Ok(Every {
            xs: c.upload(&x, st)?,
            bigs: c.upload(&big, st)?,
            v,
            outs,
        })
    }

    /// Output `i` (in the order of [`Every::new`]).
    fn o(&self, i: usize) -> &Buffer<i64, C> {
        &self.outs[i].1
    }

    /// Every collective through the step (`xv`: the variable all-gather's input), then an
    /// in-place all-reduce on `reg` if any.
    fn capture<'a>(
        &'a self,
        g: &unicomm_core::step::Step<'a, C>,
        c: &'a Comm<C>,
        (xv, reg): (
            &'a unicomm_core::View<'a, i64, C>,
            Option<&'a Buffer<i64, C>>,
        ),
    ) -> Result<()> {
        let (r, w) = (c.rank(), c.world_size());
        let (xs, bigs, v) = (&self.xs, &self.bigs, &self.v);
        g.all_reduce(c, xs, self.o(0), ReduceOp::Sum)?;
        g.broadcast(c, xs, self.o(1), w - 1)?;
        g.reduce(c, xs, self.o(2), ReduceOp::Max, 0)?;
        g.all_gather(c, xs, self.o(3))?;
        g.reduce_scatter(c, bigs, self.o(4), ReduceOp::Sum)?;
        g.all_to_all(c, bigs, self.o(5))?;
        g.group(c, || {
            g.send(c, xs, (r + 1) % w)?;
            g.recv(c, self.o(6), (r + w - 1) % w)
        })?;
        g.copy(c, xs, self.o(7))?;
        g.all_reduce_in_place(c, self.o(8), ReduceOp::Sum)?;
        g.broadcast_in_place(c, self.o(9), w - 1)?;
        g.reduce_in_place(c, self.o(10), ReduceOp::Sum, 0)?;
        g.all_gather_in_place(c, self.o(11))?;
        g.gather(c, xs, self.o(12), 0)?;
        g.scatter(c, bigs, self.o(13), w - 1)?;
        g.all_gather_v(c, xv, self.o(14), v.counts(&v.shares, &v.packed))?;
        let shares = v.counts(&v.shares, &v.packed);
        g.reduce_scatter_v(c, bigs, shares, self.o(15), ReduceOp::Sum)?;
        let (out_of, into) = (v.counts(&v.even, &v.rev), v.counts(&v.even, &v.fwd));
        g.all_to_all_v(c, bigs, out_of, self.o(16), into)?;
        match reg {
            Some(b) => g.all_reduce_in_place(c, b, ReduceOp::Sum),
            None => Ok(()),
        }
    }

    /// The outputs by name, for the checks after each replay.
    fn outputs(&self) -> Vec<(&'static str, &Buffer<i64, C>)> {
        self.outs.iter().map(|(n, b)| (*n, b)).collect()
    }
}

/// The copy-engine path inside a graph (`set_copy_engine(true)`): an all-to-all and an
/// all-gather into symmetric windows captured once and replayed `replays` times, data
/// exact after each replay, and the flight record naming the copy engines as the replays'
/// path (so the graph holds the engines' copies, not the library's kernels). Every rank
/// calls it; `Unsupported` where the backend has no copy engines.
pub fn captured_copy_engine_replays<C: Collective>(comms: &[Comm<C>], replays: u64) -> Result<()> {
    each_rank(comms, |c| {
        let (r, w) = (c.rank(), c.world_size());
        c.set_copy_engine(true)?;
        let st = c.create_stream()?;
        let x: Vec<i64> = (0..N).map(|i| (10 * r + i) as i64).collect();
        let big: Vec<i64> = (0..N * w).map(|i| (100 * r + i) as i64).collect();
        let (xs, bigs) = (c.upload(&x, &st)?, c.upload(&big, &st)?);
        let a2a = c.register_window(c.upload(&vec![0i64; N * w], &st)?)?;
        let ag = c.register_window(c.upload(&vec![0i64; N * w], &st)?)?;
        let graph = Graph::capture(&st, |g| {
            g.all_to_all(c, &bigs, &a2a)?;
            g.all_gather(c, &xs, &ag)
        })?;
        st.synchronize()?;
        let outs = [("all_to_all", &*a2a), ("all_gather", &*ag)];
        replay_and_check(&graph, &st, &outs, (r, w), replays)?;
        let record = c
            .flight_record("copy engines in a graph")
            .unwrap_or_default();
        if w > 1 && !record.contains("\"path\":\"ce\"") {
            return Err(Error::invalid(
                "copy_engine",
                format!("rank {r}: the replays did not take the copy engines: {record}"),
            ));
        }
        drop(graph);
        c.deregister_window(ag)?;
        c.deregister_window(a2a)?;
        c.set_copy_engine(false)
    })
    .map(drop)
}

/// The host layouts of the variable-size collectives: uneven shares (`var`) packed in rank
/// order, and even chunks in order (`fwd`) or reversed (`rev`).
struct Layouts {
    shares: Vec<usize>,
    packed: Vec<usize>,
    even: Vec<usize>,
    fwd: Vec<usize>,
    rev: Vec<usize>,
}

impl Layouts {
    fn new(w: usize) -> Result<Layouts> {
        let shares: Vec<usize> = (0..w).map(var).collect();
        Ok(Layouts {
            packed: packed_displs(&shares)?,
            shares,
            even: vec![N; w],
            fwd: (0..w).map(|q| q * N).collect(),
            rev: (0..w).map(|q| (w - 1 - q) * N).collect(),
        })
    }

    fn counts<'a>(&self, counts: &'a [usize], displs: &'a [usize]) -> Counts<'a> {
        Counts { counts, displs }
    }
}

/// Launches `graph` `replays` times, each output checked against `expected` after each.
fn replay_and_check<C: Collective>(
    graph: &Graph<'_, C>,
    st: &C::Stream,
    outs: &[(&str, &Buffer<i64, C>)],
    (r, w): (usize, usize),
    replays: u64,
) -> Result<()> {
    // Before any launch the outputs are as they were: the capture pass ran nothing and the
    // warm-up pass wrote scratch memory.
    for (name, b) in outs {
        let want = match *name {
            "all_reduce" => vec![0; N],
            "in place" => vec![1; N],
            _ => continue,
        };
        check(
            &format!("{name} before any launch"),
            0,
            b.copy_to_host(st)?,
            want,
        )?;
    }
    for k in 1..=replays {
        graph.launch(st)?;
        st.synchronize()?;
        for (name, b) in outs {
            if let Some(want) = expected(name, (r, w), k) {
                check(name, k, b.copy_to_host(st)?, want)?;
            }
        }
    }
    if graph.replays() != replays {
        return Err(Error::invalid("graph", "the replay count is off"));
    }
    Ok(())
}

/// `cycles` captures of a small step (an all-reduce and an all-gather), each launched twice,
/// checked, and destroyed, as an engine that recaptures its decode graphs does (a new batch
/// size, a new sequence bucket). Returns how much this rank's device memory shrank from after
/// the first ten cycles to the end, the largest over the ranks (`None` where the backend
/// gives no memory figures, as the mock): what a destroyed graph failed to give back.
pub fn capture_cycles<C: Collective>(comms: &[Comm<C>], cycles: usize) -> Result<Option<usize>> {
    let per_rank = each_rank(comms, |c| {
        let (r, w) = (c.rank(), c.world_size());
        let st = c.create_stream()?;
        let x: Vec<i64> = (0..N).map(|i| (10 * r + i) as i64).collect();
        let xs = c.upload(&x, &st)?;
        let (ar, ag) = (
            c.upload(&[0i64; N], &st)?,
            c.upload(&vec![0i64; N * w], &st)?,
        );
        let mut before = None;
        for cycle in 0..cycles {
            if cycle == cycles.min(10) {
                st.synchronize()?;
                before = c.device_memory().ok().map(|(free, _)| free);
            }
            let graph = Graph::capture(&st, |g| {
                g.all_reduce(c, &xs, &ar, ReduceOp::Sum)?;
                g.all_gather(c, &xs, &ag)
            })?;
            for _ in 0..2 {
                graph.launch(&st)?;
            }
            st.synchronize()?;
            for (name, b) in [("all_reduce", &ar), ("all_gather", &ag)] {
                let want = expected(name, (r, w), 2).unwrap_or_default();
                check(name, cycle as u64, b.copy_to_host(&st)?, want)?;
            }
            drop(graph);
        }
        st.synchronize()?;
        let after = c.device_memory().ok().map(|(free, _)| free);
        Ok::<_, Error>(before.zip(after).map(|(b, a)| b.saturating_sub(a)))
    })?;
    Ok(per_rank.into_iter().flatten().max())
}

/// A panic in a capture's closure during the capturing pass, caught by the caller, ends the
/// capture: the stream runs eager work again at once (a stream left capturing would record
/// each later collective instead of running it, and the reader would see stale data). Every
/// rank panics after enqueuing one collective into the capture, then runs an eager
/// all-reduce that must be exact.
pub fn capture_panic_leaves_the_stream_eager<C: Collective>(comms: &[Comm<C>]) -> Result<()> {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    each_rank(comms, |c| {
        let (r, w) = (c.rank(), c.world_size());
        let st = c.create_stream()?;
        let x = c.upload(&[(r + 1) as i64; N], &st)?;
        let y = c.upload(&[0i64; N], &st)?;
        let caught = catch_unwind(AssertUnwindSafe(|| {
            Graph::capture(&st, |g| {
                g.all_reduce(c, &x, &y, ReduceOp::Sum)?;
                if !g.is_warm_up() {
                    panic!("the engine's own code panics inside the capture");
                }
                Ok(())
            })
            .map(drop)
        }));
        if caught.is_ok() {
            return Err(Error::invalid(
                "graph",
                "the closure's panic was not resumed",
            ));
        }
        if st.capturing()? {
            return Err(Error::invalid(
                "graph",
                "the stream is still capturing after the closure panicked",
            ));
        }
        let mut z = c.upload(&[0i64; N], &st)?;
        c.all_reduce(&x, &mut z, ReduceOp::Sum, &st)?;
        let want = vec![(w * (w + 1) / 2) as i64; N];
        check(
            "eager all_reduce after a caught capture panic",
            0,
            z.copy_to_host(&st)?,
            want,
        )
    })?;
    Ok(())
}

/// A decode loop's graph fed a new input at each replay: the input written through a
/// shared borrow between launches (`write_from`, a device copy in stream order, the host not
/// waiting; `write_from_host` on alternate steps), each replay's all-reduce exact for that
/// step's input.
pub fn graph_inputs_written_between_replays<C: Collective>(comms: &[Comm<C>]) -> Result<()> {
    each_rank(comms, |c| {
        let (r, w) = (c.rank() as i64, c.world_size() as i64);
        let st = c.create_stream()?;
        let input = c.alloc::<i64>(N)?;
        let out = c.alloc::<i64>(N)?;
        let next = c.alloc::<i64>(N)?;
        let step = Graph::capture(&st, |g| g.all_reduce(c, &input, &out, ReduceOp::Sum))?;
        for token in 0..6i64 {
            let mine = vec![100 * token + r; N];
            if token % 2 == 0 {
                next.write_from_host(&mine, &st)?;
                input.write_from(&next, &st)?;
            } else {
                input.write_from_host(&mine, &st)?;
            }
            step.launch(&st)?;
            let want = vec![100 * token * w + w * (w - 1) / 2; N];
            check(
                "all_reduce of the step's input",
                token as u64,
                out.copy_to_host(&st)?,
                want,
            )?;
        }
        Ok::<_, Error>(())
    })?;
    Ok(())
}
