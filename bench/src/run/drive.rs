//! Timing: every mode driven over the workloads, direct or in CUDA graphs, device events
//! over back-to-back iterations (nccl-tests' method).

use anyhow::{bail, Context};
use unicomm::{AnyStream, ReduceOp};

use super::data::*;
use super::modes::*;

/// One rank's figures for one workload and placement.
#[derive(Debug, Clone)]
pub(crate) struct Cell {
    /// The count passed to the call.
    pub(crate) count: usize,
    /// Microseconds per iteration, device events over all timed iterations.
    pub(crate) total_us: f64,
    /// Per iteration, microseconds between consecutive events.
    pub(crate) iter_us: Vec<f64>,
    /// Microseconds per iteration the host spent enqueueing them.
    pub(crate) host_us: f64,
    /// Wrong elements, where checked.
    pub(crate) wrong: Option<u64>,
}

/// Per rank: for each workload and placement its figures (`None`: not run).
pub(crate) type RankOut = Vec<Option<Cell>>;

pub(crate) use super::types::by_type;

/// Runs `f` on one scoped thread per communicator (collective set-up and release).
pub(crate) fn on_each<'c, R: Send>(
    comms: &'c [unicomm::Comm],
    f: impl Fn(&'c unicomm::Comm) -> anyhow::Result<R> + Sync,
) -> anyhow::Result<Vec<R>> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(move || f(c))).collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a rank panicked")))
            })
            .collect()
    })
}

/// One mode's figures on one rank: per (workload, placement) cell, and its device memory
/// beyond its buffers.
pub(crate) type ModeOut = (RankOut, Option<i64>);

/// Which thread drives which ranks: one thread per rank (`comms` holds one communicator),
/// or `--single-thread` (`comms` holds every rank; each iteration is one group of all
/// their calls, how one process drives all its GPUs without threads).
pub(crate) struct Driver<'c, 'a> {
    pub(crate) comms: &'c [unicomm::Comm],
    pub(crate) streams: &'a [AnyStream],
}

impl<'c> Driver<'c, '_> {
    /// One iteration of `calls` (one per rank driven here).
    pub(crate) fn launch<T: Val>(
        &self,
        calls: &[Call<'_>],
        held: &mut [Held<'c, T>],
    ) -> anyhow::Result<()> {
        if let ([c], [k], [h]) = (self.comms, calls, &mut *held) {
            return launch(c, k, h);
        }
        self.comms[0].group(|| {
            Ok(held
                .iter_mut()
                .zip(calls)
                .zip(self.comms)
                .try_for_each(|((h, k), c)| launch(c, k, h)))
        })??;
        Ok(())
    }

    /// An event on every stream here, each the first of its turn's list.
    pub(crate) fn mark(&self) -> anyhow::Result<Vec<Vec<unicomm::core::Marker>>> {
        Ok(self
            .streams
            .iter()
            .map(|st| st.record().map(|mk| vec![mk]))
            .collect::<unicomm::Result<_>>()?)
    }

    /// Sets the copy-engine path on or off on every rank driven here.
    pub(crate) fn copy_engine(&self, on: bool) -> anyhow::Result<()> {
        for c in self.comms {
            c.set_copy_engine(on)?;
        }
        Ok(())
    }
}

/// Every mode's buffers released, mode by mode (window and automatic registrations
/// collectively: with several ranks here, on one thread per rank).
pub(crate) fn release_held<T: Val>(
    comms: &[unicomm::Comm],
    held: Vec<Vec<Held<'_, T>>>,
) -> anyhow::Result<()> {
    let n = comms.len();
    for h in held.into_iter().rev() {
        if n == 1 {
            for hr in h {
                hr.release(&comms[0])?;
            }
        } else {
            let slots: Vec<std::sync::Mutex<Option<Held<'_, T>>>> = h
                .into_iter()
                .map(|x| std::sync::Mutex::new(Some(x)))
                .collect();
            on_each(comms, |c| {
                let taken = slots[c.rank()]
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
                taken.map_or(Ok(()), |x| x.release(c))
            })?;
        }
    }
    Ok(())
}

/// `v` reduced over every rank with `op` through the communicator (one rank per process).
pub(crate) fn reduce_host(c: &unicomm::Comm, v: &[f64], op: ReduceOp) -> anyhow::Result<Vec<f64>> {
    let st = c.create_stream()?;
    let mut b = c.alloc::<f64>(v.len().max(1))?;
    let mut pad = v.to_vec();
    pad.resize(v.len().max(1), 0.0);
    b.copy_from_host(&pad, &st)?;
    c.all_reduce_in_place(&mut b, op, &st)?;
    let mut r = b.copy_to_host(&st)?;
    r.truncate(v.len());
    Ok(r)
}

/// One turn's figures, per rank driven here: per-iteration samples and total device time
/// (microseconds), and the host's enqueue time.
pub(crate) struct Turn {
    /// Per rank, microseconds between consecutive events.
    pub(crate) iter_us: Vec<Vec<f64>>,
    /// Per rank, microseconds of device time over the turn.
    pub(crate) total_us: Vec<f64>,
    /// Microseconds the host spent enqueueing the turn.
    pub(crate) host_us: f64,
}

/// `iters` calls back to back, an event after each (nccl-tests' default).
pub(crate) fn direct_turn<'c, T: Val>(
    d: &Driver<'c, '_>,
    ks: &[Call<'_>],
    h: &mut [Held<'c, T>],
    iters: usize,
) -> anyhow::Result<Turn> {
    let mut marks = d.mark()?;
    let enqueue = std::time::Instant::now();
    for _ in 0..iters {
        d.launch(ks, h)?;
        for (mk, st) in marks.iter_mut().zip(d.streams) {
            mk.push(st.record()?);
        }
    }
    // The host's time to enqueue them (one thread for the ranks here).
    let host_us = enqueue.elapsed().as_secs_f64() * 1e6;
    settle(d, &marks, 1.0, host_us)
}

/// Waits for the turn's work and reads its events: per rank, the time between consecutive
/// events divided by `per` (the calls each interval holds) and the whole turn's time.
pub(crate) fn settle(
    d: &Driver<'_, '_>,
    marks: &[Vec<unicomm::core::Marker>],
    per: f64,
    host_us: f64,
) -> anyhow::Result<Turn> {
    for st in d.streams {
        st.synchronize()?;
    }
    let mut t = Turn {
        iter_us: Vec::new(),
        total_us: Vec::new(),
        host_us,
    };
    for mk in marks {
        t.iter_us.push(
            mk.windows(2)
                .map(|p| p[0].elapsed_ms(&p[1]).map(|ms| ms * 1e3 / per))
                .collect::<unicomm::Result<_>>()?,
        );
        t.total_us.push(mk[0].elapsed_ms(&mk[mk.len() - 1])? * 1e3);
    }
    Ok(t)
}

/// The CUDA stream under a stream of the CUDA backend.
pub(crate) fn cuda_stream(
    st: &AnyStream,
) -> anyhow::Result<std::sync::Arc<cudarc::driver::CudaStream>> {
    match st {
        AnyStream::Nccl(s) => Ok(s.inner().0.clone()),
        _ => bail!("-G (CUDA graphs) needs the CUDA backend"),
    }
}

/// `iters` calls captured into one CUDA graph per rank (its stream), the graph launched
/// `launches` times back to back with an event after each (nccl-tests' `-G`): the device's
/// time without the host's per-call cost. Per-iteration samples are per launch, divided by
/// the calls it replays.
pub(crate) fn graph_turn<'c, T: Val>(
    d: &Driver<'c, '_>,
    ks: &[Call<'_>],
    h: &mut [Held<'c, T>],
    iters: usize,
    launches: usize,
) -> anyhow::Result<Turn> {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let cus: Vec<_> = d
        .streams
        .iter()
        .map(cuda_stream)
        .collect::<anyhow::Result<_>>()?;
    let mut capturing = Vec::new();
    let mut captured = || -> anyhow::Result<()> {
        for cu in &cus {
            cu.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(|e| anyhow::anyhow!("cuStreamBeginCapture: {e:?}"))?;
            capturing.push(cu.clone());
        }
        for _ in 0..iters {
            d.launch(ks, h)?;
        }
        Ok(())
    };
    let ok = captured();
    // Every capture begun is ended, failed or not, so the streams leave capture mode.
    let mut graphs = Vec::new();
    for cu in &capturing {
        let g = cu
            .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
        graphs.push(g);
    }
    ok.context("capturing the iterations into a CUDA graph")?;
    let graphs: Vec<cudarc::driver::CudaGraph> = graphs
        .into_iter()
        .map(|g| match g {
            Ok(Some(g)) => Ok(g),
            Ok(None) => bail!("the captured graph is empty"),
            Err(e) => bail!("cuStreamEndCapture: {e:?}"),
        })
        .collect::<anyhow::Result<_>>()?;
    for g in &graphs {
        // One launch before timing: the first uploads the graph.
        g.launch()
            .map_err(|e| anyhow::anyhow!("cuGraphLaunch: {e:?}"))?;
    }
    let mut marks = d.mark()?;
    let enqueue = std::time::Instant::now();
    for _ in 0..launches {
        for ((g, mk), st) in graphs.iter().zip(marks.iter_mut()).zip(d.streams) {
            g.launch()
                .map_err(|e| anyhow::anyhow!("cuGraphLaunch: {e:?}"))?;
            mk.push(st.record()?);
        }
    }
    let host_us = enqueue.elapsed().as_secs_f64() * 1e6;
    settle(d, &marks, iters.max(1) as f64, host_us)
}
