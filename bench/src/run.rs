//! Running the sweep: per rank, buffers of the largest size prepared once per mode
//! (allocated, registered or put in windows), then every workload timed with device events.

use std::ffi::c_void;

use anyhow::{bail, Context};
use half::{bf16, f16};
use indicatif::{ProgressBar, ProgressStyle};
use unicomm::generic::DeviceSliceMut;
use unicomm::{AnyComm, AnyStream, Buffer, Capabilities, DataType, Element, ReduceOp};
use unicomm_nccl_api::{ApiComm, ApiStream, Runtime};

use crate::{Args, Coll, Mode, Order, Work};

/// One measurement: a workload in one mode and placement, combined over ranks.
#[derive(Debug, Clone)]
pub struct Measure {
    /// The workload.
    pub work: Work,
    /// The mode.
    pub mode: Mode,
    /// In place.
    pub in_place: bool,
    /// The count passed to the call (per rank or per peer where NCCL counts so).
    pub count: usize,
    /// Microseconds per iteration: the slowest rank's total over `iters`.
    pub time_us: f64,
    /// Per iteration, the slowest rank's microseconds.
    pub iter_us: Vec<f64>,
    /// Microseconds per iteration the host took to enqueue the timed iterations (the
    /// slowest rank's): where it nears `time_us` the device waited for the host, and the
    /// time measures the host path, not the collective (nccl-tests' figures have the same
    /// floor; it shows where it is reached).
    pub host_us: f64,
    /// Elements that differ from the reference (summed over ranks); `None`: not checked.
    pub wrong: Option<u64>,
}

/// A mode's device memory beyond its buffers (bytes, the largest rank's), where the backend
/// reports device memory.
pub type ModeMemory = (Mode, Option<i64>);

/// Why `mode` cannot run here, or `None`.
pub fn unsupported(mode: Mode, caps: &Capabilities) -> Option<String> {
    let gpu = caps.backend != "mock";
    match mode {
        Mode::Plain => None,
        m if m.is_raw() && !gpu => Some("the mock has no NCCL function table".into()),
        Mode::Registered | Mode::RawRegistered if !caps.registration => Some(format!(
            "{} {} has no registration",
            caps.backend, caps.version
        )),
        Mode::Window | Mode::RawWindow if !caps.windows => {
            Some(format!("{} {} has no windows", caps.backend, caps.version))
        }
        Mode::Auto if gpu && !(caps.registration && caps.windows) => Some(format!(
            "{} {} lacks registration or windows",
            caps.backend, caps.version
        )),
        Mode::Ce if !caps.copy_engine => Some(format!(
            "{} here has no copy-engine path (GPU ranks in one process with windows)",
            caps.backend
        )),
        _ => None,
    }
}

/// Element types with the values the check uses (small integers, exact in every type).
pub trait Val: Element {
    /// The value of a small integer.
    fn of(v: i64) -> Self;
    /// As f64.
    fn f(self) -> f64;
}
macro_rules! val {
    ($($t:ty),*) => {$(
        impl Val for $t {
            fn of(v: i64) -> Self { v as $t }
            fn f(self) -> f64 { self as f64 }
        }
    )*};
}
val!(f32, f64, i8, u8, i32, u32, i64, u64);
impl Val for f16 {
    fn of(v: i64) -> Self {
        f16::from_f64(v as f64)
    }
    fn f(self) -> f64 {
        self.to_f64()
    }
}
impl Val for bf16 {
    fn of(v: i64) -> Self {
        bf16::from_f64(v as f64)
    }
    fn f(self) -> f64 {
        self.to_f64()
    }
}

/// Rank `r`'s input element `i`: small, so every reduction is exact.
fn input(r: usize, i: usize) -> i64 {
    (r as i64 + 1) + (i % 3) as i64
}

/// The reduction over `w` ranks of `input(p, j)` (closed forms: `input` is `p + 1 + j % 3`).
fn reduced(op: ReduceOp, w: usize, j: usize) -> i64 {
    let (w, m) = (w as i64, (j % 3) as i64);
    match op {
        ReduceOp::Max => w + m,
        ReduceOp::Min => 1 + m,
        _ => w * (w + 1) / 2 + w * m,
    }
}

/// Element counts of a workload for `w` ranks: (the call's count, send elements, recv
/// elements), or `None` when the size is too small to give every rank an element.
fn shape(work: &Work, w: usize) -> Option<(usize, usize, usize)> {
    let elems = work.bytes / work.dtype.size();
    let n = if work.coll.per_rank() {
        elems / w
    } else {
        elems
    };
    if n == 0 {
        return None;
    }
    Some(match work.coll {
        Coll::AllReduce | Coll::Broadcast => (n, n, n),
        Coll::AllGather => (n, n, n * w),
        Coll::ReduceScatter => (n, n * w, n),
        Coll::AllToAll => (n, n * w, n * w),
    })
}

/// A rank's buffers in one mode.
enum Held<'c, T: Val> {
    Plain(Buffer<T>, Buffer<T>),
    Reg(unicomm::Registered<'c, T>, unicomm::Registered<'c, T>),
    Win(unicomm::Window<'c, T>, unicomm::Window<'c, T>),
    Auto(
        unicomm::AutoRegistered<'c, T>,
        unicomm::AutoRegistered<'c, T>,
    ),
}

impl<'c, T: Val> Held<'c, T> {
    fn new(c: &'c unicomm::Comm, mode: Mode, elems: usize) -> anyhow::Result<Self> {
        let (s, r) = (c.alloc::<T>(elems)?, c.alloc::<T>(elems)?);
        Ok(match mode {
            Mode::Plain | Mode::Raw => Held::Plain(s, r),
            Mode::Registered | Mode::RawRegistered => Held::Reg(c.register(s)?, c.register(r)?),
            Mode::Window | Mode::RawWindow | Mode::Ce => {
                Held::Win(c.register_window(s)?, c.register_window(r)?)
            }
            Mode::Auto => Held::Auto(c.register_auto(s)?, c.register_auto(r)?),
        })
    }
    /// The send and the receive buffer, whatever holds them.
    fn bufs(
        &mut self,
    ) -> (
        &mut dyn DeviceSliceMut<T, AnyComm>,
        &mut dyn DeviceSliceMut<T, AnyComm>,
    ) {
        match self {
            Held::Plain(s, r) => (s, r),
            Held::Reg(s, r) => (s, r),
            Held::Win(s, r) => (s, r),
            Held::Auto(s, r) => (s, r),
        }
    }
    fn release(self, c: &unicomm::Comm) -> anyhow::Result<()> {
        match self {
            Held::Plain(..) => {}
            Held::Reg(s, r) => {
                c.deregister(s)?;
                c.deregister(r)?;
            }
            Held::Win(s, r) => {
                c.deregister_window(s)?;
                c.deregister_window(r)?;
            }
            Held::Auto(s, r) => {
                c.deregister_auto(s)?;
                c.deregister_auto(r)?;
            }
        }
        Ok(())
    }
}

/// One launch of a workload on one rank.
struct Call<'a> {
    coll: Coll,
    mode: Mode,
    in_place: bool,
    count: usize,
    op: ReduceOp,
    stream: &'a AnyStream,
}

fn launch<T: Val>(c: &unicomm::Comm, k: &Call<'_>, held: &mut Held<'_, T>) -> anyhow::Result<()> {
    let w = c.world_size();
    let n = k.count;
    let (send, recv) = held.bufs();
    if k.mode.is_raw() {
        let base = recv.view().device_ptr();
        let (sp, rp) = if k.in_place {
            in_place_ptrs(k.coll, base, c.rank(), n, T::DTYPE)
        } else {
            (send.view().device_ptr(), base)
        };
        return raw(c, k, sp, rp, T::DTYPE);
    }
    let st = k.stream;
    let r = c.rank();
    let mut rv = recv.view_mut();
    match (k.coll, k.in_place) {
        (Coll::AllReduce, false) => {
            c.all_reduce(&send.view().slice(..n)?, &mut rv.slice_mut(..n)?, k.op, st)?
        }
        (Coll::AllReduce, true) => c.all_reduce_in_place(&mut rv.slice_mut(..n)?, k.op, st)?,
        (Coll::Broadcast, false) => {
            c.broadcast(&send.view().slice(..n)?, &mut rv.slice_mut(..n)?, 0, st)?
        }
        (Coll::Broadcast, true) => c.broadcast_in_place(&mut rv.slice_mut(..n)?, 0, st)?,
        (Coll::AllGather, false) => {
            c.all_gather(&send.view().slice(..n)?, &mut rv.slice_mut(..n * w)?, st)?
        }
        (Coll::AllGather, true) => c.all_gather_in_place(&mut rv.slice_mut(..n * w)?, st)?,
        (Coll::ReduceScatter, false) => c.reduce_scatter(
            &send.view().slice(..n * w)?,
            &mut rv.slice_mut(..n)?,
            k.op,
            st,
        )?,
        (Coll::ReduceScatter, true) => {
            c.reduce_scatter_in_place(&mut rv.slice_mut(..n * w)?, k.op, st)?
        }
        (Coll::AllToAll, false) => c.all_to_all(
            &send.view().slice(..n * w)?,
            &mut rv.slice_mut(..n * w)?,
            st,
        )?,
        (Coll::AllToAll, true) => bail!("all_to_all has no in-place form (rank {r})"),
    }
    Ok(())
}

/// NCCL's in-place (input, output) pointers in the buffer at `base` (nccl.h: all_gather
/// reads the rank's chunk, reduce_scatter writes it; the others use the buffer for both).
/// `n` is the per-rank count.
fn in_place_ptrs(coll: Coll, base: usize, rank: usize, n: usize, dt: DataType) -> (usize, usize) {
    let chunk = base + rank * n * dt.size();
    match coll {
        Coll::AllGather => (chunk, base),
        Coll::ReduceScatter => (base, chunk),
        _ => (base, base),
    }
}

/// The same call through the NCCL function table, with no unicomm layer.
fn raw(c: &unicomm::Comm, k: &Call<'_>, sp: usize, rp: usize, dt: DataType) -> anyhow::Result<()> {
    match (c.backend(), k.stream) {
        (AnyComm::Nccl(a), AnyStream::Nccl(s)) => raw_api(a, s, k, sp, rp, dt),
        (AnyComm::Rccl(a), AnyStream::Rccl(s)) => raw_api(a, s, k, sp, rp, dt),
        _ => bail!("raw mode needs a GPU backend"),
    }
}

fn raw_api<R: Runtime>(
    a: &ApiComm<R>,
    s: &ApiStream<R>,
    k: &Call<'_>,
    sp: usize,
    rp: usize,
    dt: DataType,
) -> anyhow::Result<()> {
    let api = a.api();
    let (comm, st) = (a.raw_comm(), R::raw_stream(s.inner()));
    let (sp, rp) = (sp as *const c_void, rp as *mut c_void);
    let (n, t, op) = (k.count, dt.nccl(), k.op.nccl());
    let fns = &api.fns;
    // SAFETY: the buffers are this rank's live device memory holding what the call reads
    // and writes (the same ranges the unicomm modes pass, checked there); the communicator
    // and stream are this rank's, used by this thread only; the device is current (the
    // thread made unicomm calls on it before).
    let code = unsafe {
        match k.coll {
            Coll::AllReduce => (fns.all_reduce)(sp, rp, n, t, op, comm, st),
            Coll::Broadcast => (fns.broadcast)(sp, rp, n, t, 0, comm, st),
            Coll::AllGather => (fns.all_gather)(sp, rp, n, t, comm, st),
            Coll::ReduceScatter => (fns.reduce_scatter)(sp, rp, n, t, op, comm, st),
            Coll::AllToAll => match api.all_to_all {
                Some(f) => f(sp, rp, n, t, comm, st),
                None => bail!("raw all_to_all needs a native ncclAlltoAll"),
            },
        }
    };
    api.check("raw NCCL call", code, Some(comm))
        .context("raw mode")
}

/// Fills the inputs: send (or, in place, the output buffer) from `base`, this rank's
/// `input(rank, i)` for every element of the largest buffer (made once per mode).
fn fill<T: Val>(
    c: &unicomm::Comm,
    k: &Call<'_>,
    held: &mut Held<'_, T>,
    base: &[T],
    send_len: usize,
    recv_len: usize,
) -> anyhow::Result<()> {
    let r = c.rank();
    let st = k.stream;
    if k.in_place {
        let (_, recv) = held.bufs();
        let mut rv = recv.view_mut();
        if k.coll == Coll::AllGather {
            // NCCL's in-place layout: this rank's input is its chunk of the output.
            let n = k.count;
            rv.slice_mut(r * n..(r + 1) * n)?
                .copy_from_host(&base[..n], st)?;
        } else {
            let len = send_len.max(recv_len);
            rv.slice_mut(..len)?.copy_from_host(&base[..len], st)?;
        }
    } else {
        let (send, _) = held.bufs();
        send.view_mut()
            .slice_mut(..send_len)?
            .copy_from_host(&base[..send_len], st)?;
    }
    Ok(())
}

/// Elements of this rank's output that differ from the reference.
fn verify<T: Val>(
    c: &unicomm::Comm,
    k: &Call<'_>,
    held: &mut Held<'_, T>,
    w: usize,
) -> anyhow::Result<u64> {
    let (r, n, op) = (c.rank(), k.count, k.op);
    let (_, recv) = held.bufs();
    let (lo, len) = match (k.coll, k.in_place) {
        (Coll::ReduceScatter, true) => (r * n, n),
        (Coll::AllGather | Coll::AllToAll, _) => (0, n * w),
        _ => (0, n),
    };
    let out = recv.view().slice(lo..lo + len)?.copy_to_host(k.stream)?;
    let want = |j: usize| -> i64 {
        match k.coll {
            Coll::AllReduce => reduced(op, w, j),
            Coll::Broadcast => input(0, j),
            Coll::AllGather => input(j / n, j % n),
            Coll::ReduceScatter => reduced(op, w, r * n + j),
            Coll::AllToAll => input(j / n, r * n + j % n),
        }
    };
    Ok(out
        .iter()
        .enumerate()
        .filter(|(j, x)| x.f() != T::of(want(*j)).f())
        .count() as u64)
}

/// One rank's figures for one workload and placement.
#[derive(Debug, Clone)]
struct Cell {
    /// The count passed to the call.
    count: usize,
    /// Microseconds per iteration, device events over all timed iterations.
    total_us: f64,
    /// Per iteration, microseconds between consecutive events.
    iter_us: Vec<f64>,
    /// Microseconds per iteration the host spent enqueueing them.
    host_us: f64,
    /// Wrong elements, where checked.
    wrong: Option<u64>,
}

/// Per rank: for each workload and placement its figures (`None`: not run).
type RankOut = Vec<Option<Cell>>;

/// `$body` with `$t` the element type of `$dtype` (the sweep is generic over it).
macro_rules! by_type {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DataType::F32 => {
                type $t = f32;
                $body
            }
            DataType::F64 => {
                type $t = f64;
                $body
            }
            DataType::F16 => {
                type $t = f16;
                $body
            }
            DataType::Bf16 => {
                type $t = bf16;
                $body
            }
            DataType::I8 => {
                type $t = i8;
                $body
            }
            DataType::U8 => {
                type $t = u8;
                $body
            }
            DataType::I32 => {
                type $t = i32;
                $body
            }
            DataType::U32 => {
                type $t = u32;
                $body
            }
            DataType::I64 => {
                type $t = i64;
                $body
            }
            DataType::U64 => {
                type $t = u64;
                $body
            }
        }
    };
}

/// Runs `f` on one scoped thread per communicator (collective set-up and release).
fn on_each<'c, R: Send>(
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
type ModeOut = (RankOut, Option<i64>);

/// Which thread drives which ranks: one thread per rank (`comms` holds one communicator),
/// or `--single-thread` (`comms` holds every rank; each iteration is one group of all
/// their calls, how one process drives all its GPUs without threads).
struct Driver<'c, 'a> {
    comms: &'c [unicomm::Comm],
    streams: &'a [AnyStream],
}

impl<'c> Driver<'c, '_> {
    /// One iteration of `calls` (one per rank driven here).
    fn launch<T: Val>(&self, calls: &[Call<'_>], held: &mut [Held<'c, T>]) -> anyhow::Result<()> {
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
    fn mark(&self) -> anyhow::Result<Vec<Vec<unicomm::core::Marker>>> {
        Ok(self
            .streams
            .iter()
            .map(|st| st.record().map(|mk| vec![mk]))
            .collect::<unicomm::Result<_>>()?)
    }

    /// Sets the copy-engine path on or off on every rank driven here.
    fn copy_engine(&self, on: bool) -> anyhow::Result<()> {
        for c in self.comms {
            c.set_copy_engine(on)?;
        }
        Ok(())
    }
}

/// Everything the ranks driven by one thread do for a set of modes: each mode's buffers
/// (allocated, registered or windows; window and automatic registration are collective, so
/// with several ranks here they are made on one thread per rank), then every (workload,
/// placement) timed in every mode in turn. Interleaving the modes per workload (`modes`
/// holding several) means a slow phase of the host (a shared machine's, seconds long) hits
/// every mode of the workloads it overlaps, not one mode at every size, so the modes'
/// ratios stay comparable; `modes` of one runs one mode at every size, as nccl-tests does.
/// Result: per rank driven here, per mode in `modes`.
fn drive_modes<T: Val>(
    d: &Driver<'_, '_>,
    a: &Args,
    works: &[Work],
    places: &[bool],
    modes: &[Mode],
    cap: usize,
    tick: &dyn Fn(),
) -> anyhow::Result<Vec<Vec<ModeOut>>> {
    let comms = d.comms;
    let (n, w) = (comms.len(), comms[0].world_size());
    if n > 1 && modes.contains(&Mode::Ce) {
        bail!("the copy-engine path does not run inside a group: not with --single-thread");
    }
    let bases: Vec<Vec<T>> = comms
        .iter()
        .map(|c| (0..cap).map(|i| T::of(input(c.rank(), i))).collect())
        .collect();
    let check = a.check == 1 && matches!(a.op, ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min);
    // A cell's (count, send elements, receive elements), or `None` where it does not run:
    // all_to_all has no in-place form, the copy engines move only all_to_all/all_gather.
    let plan = |mode: Mode, work: &Work, in_place: bool| {
        let skip = (in_place && work.coll == Coll::AllToAll)
            || (mode == Mode::Ce && !matches!(work.coll, Coll::AllToAll | Coll::AllGather));
        shape(work, w).filter(|_| !skip)
    };
    let calls = |mode: Mode, work: &Work, in_place: bool, count: usize| -> Vec<Call<'_>> {
        d.streams
            .iter()
            .map(|stream| Call {
                coll: work.coll,
                mode,
                in_place,
                count,
                op: a.op,
                stream,
            })
            .collect()
    };
    // Set-up, one mode after the other: its buffers, then one call of each of its cells
    // (NCCL sets registrations and the second communicator up lazily, at first use), so
    // each mode's device memory is its own.
    let mut held: Vec<Vec<Held<'_, T>>> = Vec::new();
    let mut extra: Vec<Vec<Option<i64>>> = Vec::new();
    for &mode in modes {
        d.copy_engine(mode == Mode::Ce)?;
        let before: Vec<Option<usize>> = comms
            .iter()
            .map(|c| c.device_memory().ok().map(|m| m.0))
            .collect();
        let mut h = if n == 1 {
            vec![Held::<T>::new(&comms[0], mode, cap)?]
        } else {
            on_each(comms, |c| Held::<T>::new(c, mode, cap))?
        };
        for work in works {
            for &in_place in places {
                if let Some((count, ..)) = plan(mode, work, in_place) {
                    d.launch(&calls(mode, work, in_place, count), &mut h)?;
                }
            }
        }
        for st in d.streams {
            st.synchronize()?;
        }
        extra.push(
            comms
                .iter()
                .zip(&before)
                .map(|(c, b)| match (b, c.device_memory().ok()) {
                    (Some(b), Some((after, _))) => {
                        Some(*b as i64 - after as i64 - 2 * (cap * T::DTYPE.size()) as i64)
                    }
                    _ => None,
                })
                .collect(),
        );
        held.push(h);
    }
    let mut outs: Vec<Vec<RankOut>> = vec![vec![Vec::new(); modes.len()]; n];
    let rounds = match a.order {
        Order::Size => a.rounds.max(1),
        Order::Mode => 1,
    };
    for work in works {
        for &in_place in places {
            // The modes that run this cell: (index, mode, count, send, receive elements).
            let mut active = Vec::new();
            for (m, &mode) in modes.iter().enumerate() {
                match plan(mode, work, in_place) {
                    Some((count, s, r)) => active.push((m, mode, count, s, r)),
                    None => {
                        outs.iter_mut().for_each(|o| o[m].push(None));
                        tick();
                    }
                }
            }
            // Per active mode and rank: per-iteration times, total device time; host time.
            let mut iter_us: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); n]; active.len()];
            let mut total_us: Vec<Vec<f64>> = vec![vec![0.0; n]; active.len()];
            let mut host_us: Vec<f64> = vec![0.0; active.len()];
            for &(m, mode, count, send_len, recv_len) in &active {
                d.copy_engine(mode == Mode::Ce)?;
                let ks = calls(mode, work, in_place, count);
                for (r, hr) in held[m].iter_mut().enumerate() {
                    fill(&comms[r], &ks[r], hr, &bases[r], send_len, recv_len)?;
                }
            }
            // The iterations in `rounds` turns of every mode, so that a slow phase of the
            // host lands on one turn of one mode, not on all of its iterations.
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
                for (j, &(m, mode, count, ..)) in active.iter().enumerate() {
                    d.copy_engine(mode == Mode::Ce)?;
                    let ks = calls(mode, work, in_place, count);
                    let h = &mut held[m];
                    for _ in 0..warmup {
                        d.launch(&ks, h)?;
                    }
                    let t = if a.graphs > 0 {
                        graph_turn(d, &ks, h, iters, a.graphs)?
                    } else {
                        direct_turn(d, &ks, h, iters)?
                    };
                    host_us[j] += t.host_us;
                    for r in 0..n {
                        iter_us[j][r].extend_from_slice(&t.iter_us[r]);
                        total_us[j][r] += t.total_us[r];
                    }
                }
            }
            // Calls timed per cell: with graphs, every launch replays the turn's iterations.
            let per_iter = (a.iters * a.graphs.max(1)).max(1) as f64;
            for (j, &(m, mode, count, send_len, recv_len)) in active.iter().enumerate() {
                let mut wrong = vec![None; n];
                if check {
                    d.copy_engine(mode == Mode::Ce)?;
                    let ks = calls(mode, work, in_place, count);
                    let h = &mut held[m];
                    for (r, hr) in h.iter_mut().enumerate() {
                        fill(&comms[r], &ks[r], hr, &bases[r], send_len, recv_len)?;
                    }
                    d.launch(&ks, h)?;
                    for (r, hr) in h.iter_mut().enumerate() {
                        d.streams[r].synchronize()?;
                        wrong[r] = Some(verify(&comms[r], &ks[r], hr, w)?);
                    }
                }
                for r in 0..n {
                    outs[r][m].push(Some(Cell {
                        count,
                        total_us: total_us[j][r] / per_iter,
                        iter_us: std::mem::take(&mut iter_us[j][r]),
                        host_us: host_us[j] / per_iter,
                        wrong: wrong[r],
                    }));
                }
                tick();
            }
        }
    }
    d.copy_engine(false)?;
    // Released collectively, mode by mode.
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
    Ok((0..n)
        .map(|r| outs[r].drain(..).zip(extra.iter().map(|e| e[r])).collect())
        .collect())
}

/// `v` reduced over every rank with `op` through the communicator (one rank per process).
fn reduce_host(c: &unicomm::Comm, v: &[f64], op: ReduceOp) -> anyhow::Result<Vec<f64>> {
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
struct Turn {
    iter_us: Vec<Vec<f64>>,
    total_us: Vec<f64>,
    host_us: f64,
}

/// `iters` calls back to back, an event after each (nccl-tests' default).
fn direct_turn<'c, T: Val>(
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
fn settle(
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
fn cuda_stream(st: &AnyStream) -> anyhow::Result<std::sync::Arc<cudarc::driver::CudaStream>> {
    match st {
        AnyStream::Nccl(s) => Ok(s.inner().0.clone()),
        _ => bail!("-G (CUDA graphs) needs the CUDA backend"),
    }
}

/// `iters` calls captured into one CUDA graph per rank (its stream), the graph launched
/// `launches` times back to back with an event after each (nccl-tests' `-G`): the device's
/// time without the host's per-call cost. Per-iteration samples are per launch, divided by
/// the calls it replays.
fn graph_turn<'c, T: Val>(
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

/// One rank's device as the header and the JSON report it (nccl-tests' `devices` entries).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceRow {
    /// The rank.
    pub rank: usize,
    /// Its process.
    pub pid: u32,
    /// Its host.
    pub hostname: String,
    /// The device index in that process (`None`: not a GPU).
    pub device: Option<usize>,
    /// The PCI bus id.
    pub device_hex: Option<String>,
    /// The device's name.
    pub device_info: String,
}

/// Bytes per rank of a device row sent to rank 0 (one rank per process).
const ROW_BYTES: usize = 512;

impl DeviceRow {
    fn mine(c: &unicomm::Comm) -> Self {
        let d = c.device_info().unwrap_or_else(|e| unicomm::DeviceInfo {
            index: None,
            name: format!("unknown ({e})"),
            pci_bus_id: None,
        });
        DeviceRow {
            rank: c.rank(),
            pid: std::process::id(),
            hostname: hostname(),
            device: d.index,
            device_hex: d.pci_bus_id,
            device_info: d.name,
        }
    }

    /// Tab-separated fields, cut to fit [`ROW_BYTES`] (the name last, cut at a character).
    fn encode(&self) -> Vec<u8> {
        let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
        let mut s = format!(
            "{}\t{}\t{}\t{}\t{}",
            self.pid,
            self.hostname.replace(['\t', '\0'], " "),
            self.device.map_or("-".into(), |d| d.to_string()),
            opt(&self.device_hex),
            self.device_info.replace(['\t', '\0'], " ")
        );
        while s.len() >= ROW_BYTES {
            s.pop();
        }
        let mut b = s.into_bytes();
        b.resize(ROW_BYTES, 0);
        b
    }

    fn decode(rank: usize, b: &[u8]) -> Self {
        let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
        let s = String::from_utf8_lossy(&b[..end]).into_owned();
        let mut f = s.splitn(5, '\t');
        let mut next = || f.next().unwrap_or("").to_string();
        let (pid, hostname, device, hex, name) = (next(), next(), next(), next(), next());
        DeviceRow {
            rank,
            pid: pid.parse().unwrap_or(0),
            hostname,
            device: device.parse().ok(),
            device_hex: (hex != "-").then_some(hex),
            device_info: name,
        }
    }
}

/// This host's name (Linux: the kernel's; else `HOSTNAME`), or `unknown`.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// Every rank's device, in rank order: read here for the ranks of this process; with one
/// rank per process gathered through the communicator (collective).
pub fn devices(comms: &[unicomm::Comm]) -> anyhow::Result<Vec<DeviceRow>> {
    let Some(c) = comms.first() else {
        return Ok(Vec::new());
    };
    let w = c.world_size();
    if comms.len() == w {
        return Ok(comms.iter().map(DeviceRow::mine).collect());
    }
    let st = c.create_stream()?;
    let mut send = c.alloc::<u8>(ROW_BYTES)?;
    send.copy_from_host(&DeviceRow::mine(c).encode(), &st)?;
    let mut all = c.alloc::<u8>(ROW_BYTES * w)?;
    c.all_gather(&send, &mut all, &st)?;
    let bytes = all.copy_to_host(&st)?;
    Ok(bytes
        .chunks(ROW_BYTES)
        .enumerate()
        .map(|(r, b)| DeviceRow::decode(r, b))
        .collect())
}

/// One rank per process: every rank's figures made the world's, through the communicator
/// (an all-reduce of the times with max, of the wrong counts with sum), so every process
/// holds what one process driving all ranks would: per cell the slowest rank's time, the
/// slowest rank's time per iteration, the wrong elements of all ranks.
fn combine(c: &unicomm::Comm, mine: Vec<ModeOut>) -> anyhow::Result<Vec<ModeOut>> {
    let mut times = Vec::new();
    let mut wrongs = Vec::new();
    for (out, extra) in &mine {
        times.push(extra.map_or(f64::MIN, |e| e as f64));
        for cell in out.iter().flatten() {
            times.push(cell.total_us);
            times.push(cell.host_us);
            times.extend_from_slice(&cell.iter_us);
            wrongs.push(cell.wrong.map_or(0.0, |w| w as f64));
        }
    }
    let times = reduce_host(c, &times, ReduceOp::Max)?;
    let wrongs = reduce_host(c, &wrongs, ReduceOp::Sum)?;
    let (mut t, mut w) = (times.into_iter(), wrongs.into_iter());
    let next = |it: &mut std::vec::IntoIter<f64>| {
        it.next()
            .context("combining the ranks' figures: ranks disagree on the sweep")
    };
    let mut all = Vec::new();
    for (out, _) in mine {
        let extra = next(&mut t)?;
        let extra = (extra > f64::MIN).then_some(extra as i64);
        let mut cells = Vec::new();
        for cell in out {
            cells.push(match cell {
                None => None,
                Some(cell) => {
                    let total_us = next(&mut t)?;
                    let host_us = next(&mut t)?;
                    let iter_us = cell
                        .iter_us
                        .iter()
                        .map(|_| next(&mut t))
                        .collect::<anyhow::Result<Vec<f64>>>()?;
                    let wsum = next(&mut w)?;
                    Some(Cell {
                        count: cell.count,
                        total_us,
                        iter_us,
                        host_us,
                        wrong: cell.wrong.map(|_| wsum as u64),
                    })
                }
            });
        }
        all.push((cells, extra));
    }
    Ok(all)
}

/// Whether `need` bytes per rank (every mode's two buffers) fit at once: within 3/4 of
/// each rank's free device memory where the backend reports it (the rest for the library's
/// own: auto's second communicator, NCCL's buffers), else (the mock: host memory, every rank
/// of this process) within [`HOST_BUDGET`] in all.
fn room(comms: &[unicomm::Comm], need: usize) -> Result<(), String> {
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
const HOST_BUDGET: usize = 4 << 30;

/// The largest buffer any workload needs per rank, in elements.
fn capacity(works: &[Work], w: usize) -> usize {
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
    // The units: (workloads, modes) run together.
    let units: Vec<(Vec<Work>, Vec<Mode>)> = match a.order {
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
    };
    let steps = (modes.len() * works.len() * places.len()) as u64;
    let bar = if comms.first().is_some_and(|c| c.rank() == 0) {
        ProgressBar::new(steps)
    } else {
        ProgressBar::hidden() // the other processes of a launched run
    };
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut results = Vec::new();
    // Per mode, the largest rank's cost in any unit.
    let mut memory: Vec<ModeMemory> = Vec::new();
    for (unit_works, unit_modes) in &units {
        let cap = capacity(unit_works, w);
        let names: Vec<&str> = unit_modes.iter().map(|m| m.name()).collect();
        bar.set_message(match a.order {
            Order::Mode => names.join(","),
            Order::Size => unit_works
                .first()
                .map_or("", |wk| wk.coll.name())
                .to_string(),
        });
        let tick = || bar.inc(1);
        let per_rank: Vec<anyhow::Result<Vec<ModeOut>>> = if a.single_thread {
            let run = || -> anyhow::Result<Vec<Vec<ModeOut>>> {
                let streams: Vec<AnyStream> = comms
                    .iter()
                    .map(|c| c.create_stream())
                    .collect::<unicomm::Result<_>>()?;
                let d = Driver {
                    comms,
                    streams: &streams,
                };
                by_type!(dtype, T => drive_modes::<T>(&d, a, unit_works, places, unit_modes, cap, &tick))
            };
            match run() {
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
            }
        } else {
            std::thread::scope(|s| {
                let hs: Vec<_> = comms
                    .iter()
                    .map(|c| {
                        let tick = &tick;
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
                            let r = by_type!(dtype, T => drive_modes::<T>(&d, a, unit_works, places, unit_modes, cap, &rank0));
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
        };
        let per_rank: anyhow::Result<Vec<Vec<ModeOut>>> = per_rank
            .into_iter()
            .zip(comms.iter())
            .map(|(o, c)| {
                // The communicator's rank, not its index here (one per process: always 0).
                let r = c.rank();
                o.with_context(|| format!("rank {r}, modes {}", names.join(",")))
            })
            .collect();
        let per_rank = match per_rank.and_then(|p| {
            if per_process {
                p.into_iter()
                    .map(|mine| combine(&comms[0], mine))
                    .collect::<anyhow::Result<Vec<_>>>()
            } else {
                Ok(p)
            }
        }) {
            Ok(p) => p,
            Err(e) => {
                // The failing rank aborted its communicator: nothing later can run. What
                // was measured so far is kept and reported.
                bar.finish_and_clear();
                return Ok((results, memory, Some(e)));
            }
        };
        let mut unit: Vec<Measure> = Vec::new();
        for (m, &mode) in unit_modes.iter().enumerate() {
            let cost = per_rank.iter().filter_map(|p| p[m].1).max();
            match memory.iter_mut().find(|(mm, _)| *mm == mode) {
                Some(slot) => slot.1 = slot.1.max(cost),
                None => memory.push((mode, cost)),
            }
            let mut i = 0;
            for work in unit_works {
                for &in_place in places {
                    let cells: Vec<Option<Cell>> =
                        per_rank.iter().map(|p| p[m].0[i].clone()).collect();
                    i += 1;
                    let Some(count) = cells.first().and_then(|c| c.as_ref()).map(|c| c.count)
                    else {
                        continue;
                    };
                    let cells: Vec<Cell> = cells.into_iter().flatten().collect();
                    let time_us = cells.iter().map(|c| c.total_us).fold(0.0, f64::max);
                    let host_us = cells.iter().map(|c| c.host_us).fold(0.0, f64::max);
                    let iters = cells.iter().map(|c| c.iter_us.len()).min().unwrap_or(0);
                    let iter_us = (0..iters)
                        .map(|k| cells.iter().map(|c| c.iter_us[k]).fold(0.0, f64::max))
                        .collect();
                    let wrong = cells.iter().map(|c| c.wrong).sum::<Option<u64>>();
                    unit.push(Measure {
                        work: *work,
                        mode,
                        in_place,
                        count,
                        time_us,
                        iter_us,
                        host_us,
                        wrong,
                    });
                }
            }
        }
        results.extend(unit);
        done(&results);
    }
    bar.finish_and_clear();
    Ok((results, memory, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_in_place_pointers_are_nccls() {
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
    fn device_rows_round_trip_through_their_bytes() {
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
    fn room_counts_every_rank_of_the_process_on_the_mock() {
        let comms = unicomm::local_comms_n(unicomm::Vendor::Mock, Some(2)).expect("mock");
        assert!(room(&comms, HOST_BUDGET / 2).is_ok());
        let why = room(&comms, HOST_BUDGET / 2 + 1).expect_err("over the budget");
        assert!(why.contains("host memory"), "{why}");
        assert!(room(&comms, usize::MAX).is_err(), "no overflow");
    }
}
