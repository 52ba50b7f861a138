//! Running the sweep: per rank, buffers of the largest size prepared once per mode
//! (allocated, registered or put in windows), then every workload timed with device events.

use std::ffi::c_void;

use anyhow::{bail, Context};
use half::{bf16, f16};
use indicatif::{ProgressBar, ProgressStyle};
use unicomm::generic::DeviceSliceMut;
use unicomm::{AnyComm, AnyStream, Buffer, Capabilities, DataType, Element, ReduceOp};
use unicomm_nccl_api::{ApiComm, ApiStream, Runtime};

use crate::{Args, Coll, Mode, Work};

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
        Mode::Registered if !caps.registration => Some(format!(
            "{} {} has no registration",
            caps.backend, caps.version
        )),
        Mode::Window if !caps.windows => {
            Some(format!("{} {} has no windows", caps.backend, caps.version))
        }
        Mode::Raw if !gpu => Some("the mock has no NCCL function table".into()),
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
            Mode::Registered => Held::Reg(c.register(s)?, c.register(r)?),
            Mode::Window | Mode::Ce => Held::Win(c.register_window(s)?, c.register_window(r)?),
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
    if k.mode == Mode::Raw {
        let rp = recv.view().device_ptr();
        let sp = if k.in_place {
            in_place_src(k.coll, rp, c.rank(), n, T::DTYPE)
        } else {
            send.view().device_ptr()
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

/// NCCL's in-place input pointer: the rank's chunk for all_gather, the buffer otherwise.
fn in_place_src(coll: Coll, base: usize, rank: usize, n: usize, dt: DataType) -> usize {
    match coll {
        Coll::AllGather => base + rank * n * dt.size(),
        _ => base,
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

/// Everything one rank does in one mode: buffers, then every (workload, placement).
#[expect(
    clippy::too_many_arguments,
    reason = "the sweep's whole configuration, in one place"
)]
fn rank_mode<T: Val>(
    c: &unicomm::Comm,
    a: &Args,
    works: &[Work],
    places: &[bool],
    mode: Mode,
    cap: usize,
    st: &AnyStream,
    tick: &dyn Fn(),
) -> anyhow::Result<(RankOut, Option<i64>)> {
    let w = c.world_size();
    if mode == Mode::Ce {
        c.set_copy_engine(true)?;
    }
    let free_before = c.device_memory().ok().map(|m| m.0);
    let mut held = Held::<T>::new(c, mode, cap)?;
    let base: Vec<T> = (0..cap).map(|i| T::of(input(c.rank(), i))).collect();
    let check = a.check == 1 && matches!(a.op, ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min);
    let mut out = Vec::new();
    for work in works {
        for &in_place in places {
            let skip = (in_place && work.coll == Coll::AllToAll)
                || (mode == Mode::Ce && !matches!(work.coll, Coll::AllToAll | Coll::AllGather));
            let Some((count, send_len, recv_len)) = shape(work, w).filter(|_| !skip) else {
                out.push(None);
                tick();
                continue;
            };
            let k = Call {
                coll: work.coll,
                mode,
                in_place,
                count,
                op: a.op,
                stream: st,
            };
            fill(c, &k, &mut held, &base, send_len, recv_len)?;
            for _ in 0..a.warmup {
                launch(c, &k, &mut held)?;
            }
            let mut marks = vec![st.record()?];
            let enqueue = std::time::Instant::now();
            for _ in 0..a.iters {
                launch(c, &k, &mut held)?;
                marks.push(st.record()?);
            }
            let host_us = enqueue.elapsed().as_secs_f64() * 1e6 / a.iters.max(1) as f64;
            st.synchronize()?;
            let iter_us: Vec<f64> = marks
                .windows(2)
                .map(|m| m[0].elapsed_ms(&m[1]).map(|ms| ms * 1e3))
                .collect::<unicomm::Result<_>>()?;
            let total = marks[0].elapsed_ms(&marks[marks.len() - 1])? * 1e3 / a.iters.max(1) as f64;
            let wrong = if check {
                fill(c, &k, &mut held, &base, send_len, recv_len)?;
                launch(c, &k, &mut held)?;
                st.synchronize()?;
                Some(verify(c, &k, &mut held, w)?)
            } else {
                None
            };
            out.push(Some(Cell {
                count,
                total_us: total,
                iter_us,
                host_us,
                wrong,
            }));
            tick();
        }
    }
    // What the mode costs beyond its two buffers, after every call of the sweep (NCCL sets
    // up registrations and the second communicator lazily, at first use).
    let extra = match (free_before, c.device_memory().ok()) {
        (Some(before), Some((after, _))) => {
            Some(before as i64 - after as i64 - 2 * (cap * T::DTYPE.size()) as i64)
        }
        _ => None,
    };
    held.release(c)?;
    if mode == Mode::Ce {
        c.set_copy_engine(false)?;
    }
    Ok((out, extra))
}

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

/// `--single-thread`: one thread issues every rank's call inside one group per iteration
/// (how one process drives all its GPUs without threads); each rank's stream is timed with
/// its own events. Windows and automatic registrations are collective, so they are set up
/// and released on one thread per rank, as the conformance suite's single-thread mode does.
#[expect(
    clippy::too_many_arguments,
    reason = "the sweep's whole configuration, in one place"
)]
fn all_mode<T: Val>(
    comms: &[unicomm::Comm],
    a: &Args,
    works: &[Work],
    places: &[bool],
    mode: Mode,
    cap: usize,
    streams: &[AnyStream],
    tick: &dyn Fn(),
) -> anyhow::Result<Vec<(RankOut, Option<i64>)>> {
    let w = comms.len();
    if mode == Mode::Ce {
        bail!("the copy-engine path does not run inside a group: not with --single-thread");
    }
    let free_before: Vec<Option<usize>> = comms
        .iter()
        .map(|c| c.device_memory().ok().map(|m| m.0))
        .collect();
    let mut held: Vec<Held<'_, T>> = on_each(comms, |c| Held::<T>::new(c, mode, cap))?;
    let bases: Vec<Vec<T>> = (0..w)
        .map(|r| (0..cap).map(|i| T::of(input(r, i))).collect())
        .collect();
    let check = a.check == 1 && matches!(a.op, ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min);
    let mut outs: Vec<RankOut> = vec![Vec::new(); w];
    for work in works {
        for &in_place in places {
            let skip = in_place && work.coll == Coll::AllToAll;
            let Some((count, send_len, recv_len)) = shape(work, w).filter(|_| !skip) else {
                outs.iter_mut().for_each(|o| o.push(None));
                tick();
                continue;
            };
            let calls: Vec<Call<'_>> = streams
                .iter()
                .map(|st| Call {
                    coll: work.coll,
                    mode,
                    in_place,
                    count,
                    op: a.op,
                    stream: st,
                })
                .collect();
            let fill_all = |held: &mut [Held<'_, T>]| -> anyhow::Result<()> {
                for (r, h) in held.iter_mut().enumerate() {
                    fill(&comms[r], &calls[r], h, &bases[r], send_len, recv_len)?;
                }
                Ok(())
            };
            // One iteration: every rank's call in one group.
            let grouped = |held: &mut [Held<'_, T>]| -> anyhow::Result<()> {
                comms[0].group(|| {
                    Ok(held
                        .iter_mut()
                        .enumerate()
                        .try_for_each(|(r, h)| launch(&comms[r], &calls[r], h)))
                })??;
                Ok(())
            };
            fill_all(&mut held)?;
            for _ in 0..a.warmup {
                grouped(&mut held)?;
            }
            let mut marks: Vec<Vec<unicomm::core::Marker>> = streams
                .iter()
                .map(|st| st.record().map(|m| vec![m]))
                .collect::<unicomm::Result<_>>()?;
            let enqueue = std::time::Instant::now();
            for _ in 0..a.iters {
                grouped(&mut held)?;
                for (m, st) in marks.iter_mut().zip(streams) {
                    m.push(st.record()?);
                }
            }
            // One host thread enqueues every rank's calls.
            let host_us = enqueue.elapsed().as_secs_f64() * 1e6 / a.iters.max(1) as f64;
            for st in streams {
                st.synchronize()?;
            }
            let mut wrong = vec![None; w];
            if check {
                fill_all(&mut held)?;
                grouped(&mut held)?;
                for (r, h) in held.iter_mut().enumerate() {
                    streams[r].synchronize()?;
                    wrong[r] = Some(verify(&comms[r], &calls[r], h, w)?);
                }
            }
            for (r, m) in marks.iter().enumerate() {
                let iter_us: Vec<f64> = m
                    .windows(2)
                    .map(|p| p[0].elapsed_ms(&p[1]).map(|ms| ms * 1e3))
                    .collect::<unicomm::Result<_>>()?;
                let total = m[0].elapsed_ms(&m[m.len() - 1])? * 1e3 / a.iters.max(1) as f64;
                outs[r].push(Some(Cell {
                    count,
                    total_us: total,
                    iter_us,
                    host_us,
                    wrong: wrong[r],
                }));
            }
            tick();
        }
    }
    let extra: Vec<Option<i64>> = comms
        .iter()
        .zip(&free_before)
        .map(|(c, before)| match (before, c.device_memory().ok()) {
            (Some(b), Some((after, _))) => {
                Some(*b as i64 - after as i64 - 2 * (cap * T::DTYPE.size()) as i64)
            }
            _ => None,
        })
        .collect();
    let held: Vec<std::sync::Mutex<Option<Held<'_, T>>>> = held
        .into_iter()
        .map(|h| std::sync::Mutex::new(Some(h)))
        .collect();
    on_each(comms, |c| {
        let h = held[c.rank()]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        h.map_or(Ok(()), |h| h.release(c))
    })?;
    Ok(outs.into_iter().zip(extra).collect())
}

/// `all_mode` for the element type, its result (or error) given to every rank.
#[expect(
    clippy::too_many_arguments,
    reason = "the sweep's whole configuration, in one place"
)]
fn single(
    comms: &[unicomm::Comm],
    a: &Args,
    works: &[Work],
    places: &[bool],
    mode: Mode,
    cap: usize,
    dtype: DataType,
    tick: &dyn Fn(),
) -> Vec<anyhow::Result<(RankOut, Option<i64>)>> {
    let run = || -> anyhow::Result<Vec<(RankOut, Option<i64>)>> {
        let streams: Vec<AnyStream> = comms
            .iter()
            .map(|c| c.create_stream())
            .collect::<unicomm::Result<_>>()?;
        let st = &streams[..];
        by_type!(dtype, T => all_mode::<T>(comms, a, works, places, mode, cap, st, tick))
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
}

/// One rank per process: every rank's figures made the world's, through the communicator
/// (an all-reduce of the times with max, of the wrong counts with sum), so every process
/// holds what one process driving all ranks would: per cell the slowest rank's time, the
/// slowest rank's time per iteration, the wrong elements of all ranks.
fn combine(
    c: &unicomm::Comm,
    mine: Vec<(RankOut, Option<i64>)>,
) -> anyhow::Result<Vec<(RankOut, Option<i64>)>> {
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
    let st = c.create_stream()?;
    let reduce = |v: &[f64], op: ReduceOp| -> anyhow::Result<Vec<f64>> {
        let mut b = c.alloc::<f64>(v.len().max(1))?;
        let mut pad = v.to_vec();
        pad.resize(v.len().max(1), 0.0);
        b.copy_from_host(&pad, &st)?;
        c.all_reduce_in_place(&mut b, op, &st)?;
        let mut r = b.copy_to_host(&st)?;
        r.truncate(v.len());
        Ok(r)
    };
    let times = reduce(&times, ReduceOp::Max)?;
    let wrongs = reduce(&wrongs, ReduceOp::Sum)?;
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

/// The largest buffer any workload needs per rank, in elements.
fn capacity(works: &[Work], w: usize) -> usize {
    works
        .iter()
        .filter_map(|wk| shape(wk, w).map(|(_, s, r)| s.max(r)))
        .max()
        .unwrap_or(1)
        .max(1)
}

/// Runs every mode over every workload and placement; one thread per rank.
/// `done` is called with the results so far after every mode (so a run cut short keeps
/// what it measured).
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
    let cap = capacity(works, w);
    // One rank per process (under a launcher): every process measures its own rank; the
    // ranks' figures are combined (slowest time) through the communicator after each mode.
    let per_process = comms.len() < w;
    if per_process && a.single_thread {
        bail!("--single-thread drives every rank from one process; under a launcher each process has one");
    }
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
    let mut memory = Vec::new();
    for &mode in modes {
        bar.set_message(mode.name());
        let per_rank: Vec<anyhow::Result<(RankOut, Option<i64>)>> = if a.single_thread {
            single(comms, a, works, places, mode, cap, dtype, &|| bar.inc(1))
        } else {
            std::thread::scope(|s| {
                let hs: Vec<_> = comms
                    .iter()
                    .map(|c| {
                        let bar = &bar;
                        s.spawn(move || -> anyhow::Result<(RankOut, Option<i64>)> {
                            let st = c.create_stream()?;
                            let tick = || {
                                if c.rank() == 0 {
                                    bar.inc(1)
                                }
                            };
                            let r = by_type!(dtype, T => rank_mode::<T>(c, a, works, places, mode, cap, &st, &tick));
                            if r.is_err() {
                                // Peers must not wait for this rank (docs: one rank fails).
                                let _ = c.abort();
                            }
                            r
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
        let per_rank: anyhow::Result<Vec<(RankOut, Option<i64>)>> = per_rank
            .into_iter()
            .enumerate()
            .map(|(r, o)| o.with_context(|| format!("rank {r}, mode {}", mode.name())))
            .collect();
        let per_rank = match per_rank.and_then(|p| {
            if per_process {
                combine(&comms[0], p)
            } else {
                Ok(p)
            }
        }) {
            Ok(p) => p,
            Err(e) => {
                // The failing rank aborted its communicator: no later mode can run. What
                // was measured so far is kept and reported.
                bar.finish_and_clear();
                return Ok((results, memory, Some(e)));
            }
        };
        // The largest rank's cost.
        memory.push((mode, per_rank.iter().filter_map(|p| p.1).max()));
        let per_rank: Vec<RankOut> = per_rank.into_iter().map(|p| p.0).collect();
        let mut i = 0;
        for work in works {
            for &in_place in places {
                let cells: Vec<_> = per_rank.iter().map(|ro| ro[i].clone()).collect();
                i += 1;
                let Some(count) = cells.first().and_then(|c| c.as_ref()).map(|c| c.count) else {
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
                results.push(Measure {
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
        done(&results);
    }
    bar.finish_and_clear();
    Ok((results, memory, None))
}
