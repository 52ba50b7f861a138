//! One thread's share of a sweep unit: every mode's buffers set up, then each (workload,
//! placement) cell timed in every mode in turn, checked where asked, and the buffers
//! released.

use anyhow::bail;
use unicomm::{DataType, ReduceOp};

use super::data::*;
use super::drive::*;
use super::graphed::step_graph_turn;
use super::modes::*;
use crate::{Args, Coll, Mode, Order, Work};

/// Everything the ranks driven by one thread do for a set of modes: each mode's buffers
/// (allocated, registered or windows; window and automatic registration are collective, so
/// with several ranks here they are made on one thread per rank), then every (workload,
/// placement) timed in every mode in turn. Interleaving the modes per workload (`modes`
/// holding several) means a slow phase of the host (a shared machine's, seconds long) hits
/// every mode of the workloads it overlaps, not one mode at every size, so the modes'
/// ratios stay comparable; `modes` of one runs one mode at every size, as nccl-tests does.
/// Result: per rank driven here, per mode in `modes`.
pub(crate) fn drive_modes<T: Val>(
    d: &Driver<'_, '_>,
    a: &Args,
    works: &[Work],
    places: &[bool],
    modes: &[Mode],
    cap: usize,
    tick: &dyn Fn(),
) -> anyhow::Result<Vec<Vec<ModeOut>>> {
    let comms = d.comms;
    let n = comms.len();
    if n > 1 && modes.contains(&Mode::Ce) {
        bail!("the copy-engine path does not run inside a group: not with --single-thread");
    }
    let mut s = Session::<T>::new(d, a);
    let (mut held, extra) = s.set_up(modes, works, places, cap)?;
    let mut outs: Vec<Vec<RankOut>> = vec![vec![Vec::new(); modes.len()]; n];
    for work in works {
        for &in_place in places {
            // The modes that run this cell; the others get no figures.
            let mut active = Vec::new();
            for (m, &mode) in modes.iter().enumerate() {
                match s.plan(mode, work, in_place) {
                    Some((count, send, recv)) => active.push(Active {
                        m,
                        mode,
                        count,
                        lens: (send, recv),
                    }),
                    None => {
                        outs.iter_mut().for_each(|o| o[m].push(None));
                        tick();
                    }
                }
            }
            let t = s.time_cell(work, in_place, &active, &mut held)?;
            s.record_cell(work, in_place, &active, &mut held, t, &mut outs, tick)?;
        }
    }
    d.copy_engine(false)?;
    release_held(comms, held)?;
    Ok((0..n)
        .map(|r| outs[r].drain(..).zip(extra.iter().map(|e| e[r])).collect())
        .collect())
}

/// A mode that runs a cell: its index in the modes, the count, and the elements sent and
/// received.
struct Active {
    m: usize,
    mode: Mode,
    count: usize,
    lens: (usize, usize),
}

/// A cell's times, per active mode: per rank its per-iteration and total device times, and
/// the host's time.
struct Times {
    iter_us: Vec<Vec<Vec<f64>>>,
    total_us: Vec<Vec<f64>>,
    host_us: Vec<f64>,
}

/// What every phase of one thread's drive shares.
struct Session<'d, 'c, 'a, T> {
    d: &'d Driver<'c, 'a>,
    a: &'d Args,
    /// The world's size.
    w: usize,
    /// Per rank here, its input pattern of the largest size.
    bases: Vec<Vec<T>>,
    /// Whether results are checked (`--check 1`, a reduction with an exact result).
    check: bool,
}

impl<'d, 'c, 'a, T: Val> Session<'d, 'c, 'a, T> {
    fn new(d: &'d Driver<'c, 'a>, a: &'d Args) -> Self {
        Session {
            d,
            a,
            w: d.comms[0].world_size(),
            bases: Vec::new(),
            check: a.check == 1
                && matches!(
                    a.op,
                    ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min | ReduceOp::PreMulSum(_)
                ),
        }
    }

    /// A cell's (count, send elements, receive elements), or `None` where it does not run:
    /// all_to_all has no in-place form, the copy engines move only all_to_all(_v)/all_gather.
    fn plan(&self, mode: Mode, work: &Work, in_place: bool) -> Option<(usize, usize, usize)> {
        let out_of_place_only = matches!(
            work.coll,
            Coll::AllToAll | Coll::Gather | Coll::Scatter | Coll::AllToAllV
        );
        let new_colls = matches!(work.coll, Coll::Gather | Coll::Scatter | Coll::AllToAllV);
        let skip = (in_place && out_of_place_only)
            || (mode == Mode::Ce
                && !matches!(work.coll, Coll::AllToAll | Coll::AllToAllV | Coll::AllGather))
            // Neither the raw-NCCL baselines nor the copy engines take these.
            || (mode.is_raw() && new_colls)
            // unicomm's own kernels: a float all_reduce by sum, max or min, out of place.
            || (mode.own_kernel()
                && (work.coll != Coll::AllReduce
                    || in_place
                    || !matches!(T::DTYPE, DataType::F32 | DataType::F16 | DataType::Bf16)
                    || !matches!(self.a.op, ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min)))
            // The fused op: a sum over rows of the decode preset's hidden size.
            || (mode.fused().is_some() && (work.hidden.is_none() || self.a.op != ReduceOp::Sum));
        shape(work, self.w).filter(|_| !skip)
    }

    /// One call per rank here of `work` in `mode`.
    fn calls(&self, mode: Mode, work: &Work, in_place: bool, count: usize) -> Vec<Call<'a>> {
        self.d
            .streams
            .iter()
            .map(|stream| Call {
                coll: work.coll,
                mode,
                in_place,
                count,
                op: self.a.op,
                stream,
                a2av: (work.coll == Coll::AllToAllV)
                    .then(|| std::sync::Arc::new(super::vcounts::A2av::new(work, count, self.w))),
                hidden: work.hidden,
            })
            .collect()
    }

    /// Set-up, one mode after the other: its buffers, then one call of each of its cells
    /// (NCCL sets registrations and the second communicator up lazily, at first use), so
    /// each mode's device memory is its own. Per mode, the buffers of every rank here and
    /// each rank's device memory beyond its two buffers.
    #[allow(clippy::type_complexity, reason = "per mode, per rank")]
    fn set_up(
        &mut self,
        modes: &[Mode],
        works: &[Work],
        places: &[bool],
        cap: usize,
    ) -> anyhow::Result<(Vec<Vec<Held<'c, T>>>, Vec<Vec<Option<i64>>>)> {
        let (d, comms) = (self.d, self.d.comms);
        self.bases = comms
            .iter()
            .map(|c| (0..cap).map(|i| T::of(input(c.rank(), i))).collect())
            .collect();
        let mut held = Vec::new();
        let mut extra = Vec::new();
        for &mode in modes {
            d.copy_engine(mode == Mode::Ce)?;
            let before: Vec<Option<usize>> = comms
                .iter()
                .map(|c| c.device_memory().ok().map(|m| m.0))
                .collect();
            let mut h = if comms.len() == 1 {
                vec![Held::<T>::new(&comms[0], mode, cap)?]
            } else {
                on_each(comms, |c| Held::<T>::new(c, mode, cap))?
            };
            for work in works {
                for &in_place in places {
                    if let Some((count, ..)) = self.plan(mode, work, in_place) {
                        d.launch(&self.calls(mode, work, in_place, count), &mut h)?;
                    }
                }
            }
            for st in d.streams {
                st.synchronize()?;
            }
            let bufs = 2 * (cap * T::DTYPE.size()) as i64;
            extra.push(
                comms
                    .iter()
                    .zip(&before)
                    .map(|(c, b)| match (b, c.device_memory().ok()) {
                        (Some(b), Some((after, _))) => Some(*b as i64 - after as i64 - bufs),
                        _ => None,
                    })
                    .collect(),
            );
            held.push(h);
        }
        Ok((held, extra))
    }

    /// Times one cell: its inputs written, then the iterations in `rounds` turns of every
    /// active mode, so that a slow phase of the host lands on one turn of one mode, not on
    /// all of its iterations.
    fn time_cell(
        &self,
        work: &Work,
        in_place: bool,
        active: &[Active],
        held: &mut [Vec<Held<'c, T>>],
    ) -> anyhow::Result<Times> {
        let (d, a, n) = (self.d, self.a, self.d.comms.len());
        let mut t = Times {
            iter_us: vec![vec![Vec::new(); n]; active.len()],
            total_us: vec![vec![0.0; n]; active.len()],
            host_us: vec![0.0; active.len()],
        };
        for x in active {
            d.copy_engine(x.mode == Mode::Ce)?;
            self.fill_all(
                &self.calls(x.mode, work, in_place, x.count),
                &mut held[x.m],
                x.lens,
            )?;
        }
        let rounds = match a.order {
            Order::Size => a.rounds.max(1),
            Order::Mode => 1,
        };
        for round in 0..rounds {
            let iters = a.iters / rounds + usize::from(round < a.iters % rounds);
            if iters == 0 {
                continue;
            }
            let warmup = if round == 0 {
                a.warmup
            } else {
                a.warmup.div_ceil(rounds)
            };
            for (j, x) in active.iter().enumerate() {
                d.copy_engine(x.mode == Mode::Ce)?;
                let ks = self.calls(x.mode, work, in_place, x.count);
                let h = &mut held[x.m];
                for _ in 0..warmup {
                    d.launch(&ks, h)?;
                }
                let turn = if a.graphs > 0 {
                    match (&ks[..], &mut h[..]) {
                        // One rank on this thread: unicomm's capture, on every backend.
                        ([k], [hr]) if !k.mode.is_raw() => {
                            step_graph_turn(d, k, hr, iters, a.graphs)?
                        }
                        // NCCL called by hand, or several ranks in one group: CUDA's.
                        _ => graph_turn(d, &ks, h, iters, a.graphs)?,
                    }
                } else {
                    direct_turn(d, &ks, h, iters)?
                };
                t.host_us[j] += turn.host_us;
                for r in 0..n {
                    t.iter_us[j][r].extend_from_slice(&turn.iter_us[r]);
                    t.total_us[j][r] += turn.total_us[r];
                }
            }
        }
        Ok(t)
    }

    /// Writes every rank's inputs of `ks`.
    fn fill_all(
        &self,
        ks: &[Call<'_>],
        h: &mut [Held<'c, T>],
        (send, recv): (usize, usize),
    ) -> anyhow::Result<()> {
        for (r, hr) in h.iter_mut().enumerate() {
            fill(&self.d.comms[r], &ks[r], hr, &self.bases[r], send, recv)?;
        }
        Ok(())
    }

    /// A timed cell's figures per rank, checked once more where asked.
    #[allow(
        clippy::too_many_arguments,
        reason = "the cell, its modes, buffers, times and the outputs"
    )]
    fn record_cell(
        &self,
        work: &Work,
        in_place: bool,
        active: &[Active],
        held: &mut [Vec<Held<'c, T>>],
        mut t: Times,
        outs: &mut [Vec<RankOut>],
        tick: &dyn Fn(),
    ) -> anyhow::Result<()> {
        let (d, n) = (self.d, self.d.comms.len());
        // Calls timed per cell: with graphs, every launch replays the turn's iterations.
        let per_iter = (self.a.iters * self.a.graphs.max(1)).max(1) as f64;
        for (j, x) in active.iter().enumerate() {
            let mut wrong = vec![None; n];
            if self.check {
                d.copy_engine(x.mode == Mode::Ce)?;
                let ks = self.calls(x.mode, work, in_place, x.count);
                let h = &mut held[x.m];
                self.fill_all(&ks, h, x.lens)?;
                match (&ks[..], &mut h[..]) {
                    // The graph's data checked: one call captured, replayed once.
                    ([k], [hr]) if self.a.graphs > 0 && !k.mode.is_raw() => {
                        step_graph_turn(d, k, hr, 1, 0).map(drop)?
                    }
                    _ => d.launch(&ks, h)?,
                }
                for (r, hr) in h.iter_mut().enumerate() {
                    d.streams[r].synchronize()?;
                    wrong[r] = Some(verify(&d.comms[r], &ks[r], hr, self.w)?);
                }
            }
            for r in 0..n {
                outs[r][x.m].push(Some(Cell {
                    count: x.count,
                    total_us: t.total_us[j][r] / per_iter,
                    iter_us: std::mem::take(&mut t.iter_us[j][r]),
                    host_us: t.host_us[j] / per_iter,
                    wrong: wrong[r],
                }));
            }
            tick();
        }
        Ok(())
    }
}
