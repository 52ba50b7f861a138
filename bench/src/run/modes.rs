//! The modes: what each mode does to a rank's buffers (plain, registered, windows, auto,
//! the copy engines, NCCL called by hand), and one call of a workload in it.

#![allow(unsafe_code, reason = "raw NCCL calls for the benchmark's baselines")]

use std::ffi::c_void;

use std::sync::Arc;

use anyhow::{bail, Context};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use unicomm::generic::DeviceSliceMut;
use unicomm::{AnyComm, AnyStream, Buffer, Capabilities, DataType, ReduceOp};
use unicomm_nccl_api::sys::codes::NcclCode;
use unicomm_nccl_api::{ApiComm, ApiStream, Runtime};

use super::data::*;
use crate::{Coll, Mode, Work};

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
        m if m.on_symmetric_memory() && caps.backend == "rccl" => {
            Some("unicomm's symmetric kernels are not built for HIP yet".into())
        }
        Mode::DeviceApi
            if caps.backend != "nccl" || caps.version < unicomm::Version::new(2, 32, 3) =>
        {
            Some(format!(
                "unicomm's device-API kernel needs NCCL >= 2.32.3 (the headers it was built against); here {} {}",
                caps.backend, caps.version
            ))
        }
        Mode::Ce if !caps.copy_engine => Some(format!(
            "{} here has no copy-engine path (GPU ranks in one process with windows)",
            caps.backend
        )),
        _ => None,
    }
}

/// A rank's buffers in one mode.
pub(crate) enum Held<'c, T: Val> {
    Plain(Buffer<T>, Buffer<T>),
    Reg(unicomm::Registered<'c, T>, unicomm::Registered<'c, T>),
    Win(unicomm::Window<'c, T>, unicomm::Window<'c, T>),
    Auto(
        unicomm::AutoRegistered<'c, T>,
        unicomm::AutoRegistered<'c, T>,
    ),
    /// The input in symmetric memory (with the Lamport workspace), the output plain.
    Sym(unicomm::Symmetric<'c, T>, Buffer<T>),
    /// The fused modes' buffers.
    Fused(Box<super::fused::Fused<'c, T>>),
    /// A device communicator (NCCL's device API) and both buffers in windows.
    Dev(
        unicomm::DeviceComm<'c>,
        unicomm::Window<'c, T>,
        unicomm::Window<'c, T>,
    ),
}

impl<'c, T: Val> Held<'c, T> {
    pub(crate) fn new(c: &'c unicomm::Comm, mode: Mode, elems: usize) -> anyhow::Result<Self> {
        let two = || -> anyhow::Result<(Buffer<T>, Buffer<T>)> {
            Ok((c.alloc::<T>(elems)?, c.alloc::<T>(elems)?))
        };
        Ok(match mode {
            Mode::Plain | Mode::Raw => {
                let (s, r) = two()?;
                Held::Plain(s, r)
            }
            Mode::Registered | Mode::RawRegistered => {
                let (s, r) = two()?;
                Held::Reg(c.register(s)?, c.register(r)?)
            }
            Mode::Window | Mode::RawWindow | Mode::Ce => {
                let (s, r) = two()?;
                Held::Win(c.register_window(s)?, c.register_window(r)?)
            }
            Mode::Auto => {
                let (s, r) = two()?;
                Held::Auto(c.register_auto(s)?, c.register_auto(r)?)
            }
            Mode::OneShot | Mode::TwoShot | Mode::Lamport => {
                Held::Sym(c.alloc_symmetric_lamport(elems)?, c.alloc::<T>(elems)?)
            }
            Mode::Fused | Mode::FusedFp8 => Held::Fused(Box::new(super::fused::Fused::new(
                c,
                elems,
                mode == Mode::FusedFp8,
            )?)),
            Mode::DeviceApi => {
                let (s, r) = two()?;
                let dc = c.device_comm(&unicomm::nccl::device_kernel_requirements(8))?;
                Held::Dev(dc, c.register_window(s)?, c.register_window(r)?)
            }
        })
    }
    /// The send and the receive buffer, whatever holds them.
    pub(crate) fn bufs(
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
            Held::Sym(s, r) => (s, r),
            // The residual is the output checked: one call from a cleared residual leaves
            // the all-reduce there.
            Held::Fused(f) => (&mut f.x, &mut f.residual),
            Held::Dev(_, s, r) => (s, r),
        }
    }
    pub(crate) fn release(self, c: &unicomm::Comm) -> anyhow::Result<()> {
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
            Held::Sym(s, _) => c.free_symmetric(s)?,
            Held::Fused(f) => (*f).release(c)?,
            Held::Dev(dc, s, r) => {
                c.deregister_window(s)?;
                c.deregister_window(r)?;
                drop(dc);
            }
        }
        Ok(())
    }
}

/// One launch of a workload on one rank.
pub(crate) struct Call<'a> {
    pub(crate) coll: Coll,
    pub(crate) mode: Mode,
    pub(crate) in_place: bool,
    pub(crate) count: usize,
    pub(crate) op: ReduceOp,
    pub(crate) stream: &'a AnyStream,
    /// The per-peer counts of an all_to_all_v.
    pub(crate) a2av: Option<std::sync::Arc<super::vcounts::A2av>>,
    /// The rows' length of the fused modes (the decode preset's hidden size).
    pub(crate) hidden: Option<usize>,
}

pub(crate) fn launch<T: Val>(
    c: &unicomm::Comm,
    k: &Call<'_>,
    held: &mut Held<'_, T>,
) -> anyhow::Result<()> {
    let w = c.world_size();
    let n = k.count;
    if let (Some(algorithm), Held::Sym(sym, out)) = (k.mode.symmetric(), &mut *held) {
        let how = unicomm::SymmetricOptions::new(k.op, algorithm);
        return Ok(c.all_reduce_symmetric(sym, n, &mut out.slice_mut(..n)?, how, k.stream)?);
    }
    if let Held::Fused(f) = held {
        return f.launch(c, n, k.hidden, k.stream);
    }
    if let Held::Dev(dc, s, r) = held {
        return Ok(c.all_reduce_device(dc, s, r, n, k.op, k.stream)?);
    }
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
    let (st, r) = (k.stream, c.rank());
    let (sn, rn) = lens(k, r, w)?;
    let s = send.view().slice(..sn)?;
    let rv = &mut recv.view_mut().into_slice_mut(..rn)?;
    // `premulsum`: the scalar 1 of this run's type.
    let op = match k.op {
        ReduceOp::PreMulSum(_) => ReduceOp::pre_mul_sum(T::of(1)),
        op => op,
    };
    // The forms `lens` refused (in place, for those measured out of place only) are gone.
    match (k.coll, k.in_place) {
        (Coll::AllReduce, false) => c.all_reduce(&s, rv, op, st)?,
        (Coll::AllReduce, true) => c.all_reduce_in_place(rv, op, st)?,
        (Coll::Broadcast, false) => c.broadcast(&s, rv, 0, st)?,
        (Coll::Broadcast, true) => c.broadcast_in_place(rv, 0, st)?,
        (Coll::AllGather, false) => c.all_gather(&s, rv, st)?,
        (Coll::AllGather, true) => c.all_gather_in_place(rv, st)?,
        (Coll::ReduceScatter, false) => c.reduce_scatter(&s, rv, op, st)?,
        (Coll::ReduceScatter, true) => c.reduce_scatter_in_place(rv, op, st)?,
        (Coll::AllToAll, _) => c.all_to_all(&s, rv, st)?,
        (Coll::Gather, _) => c.gather(&s, rv, 0, st)?,
        (Coll::Scatter, _) => c.scatter(&s, rv, 0, st)?,
        (Coll::AllToAllV, _) => {
            let v = k.a2av.as_ref().context("all_to_all_v without its counts")?;
            let (sc, rc) = (v.send(r), v.recv(r));
            let (sd, rd) = (unicomm::packed_displs(&sc)?, unicomm::packed_displs(&rc)?);
            let counts = |counts, displs| unicomm::Counts { counts, displs };
            c.all_to_all_v(&s, counts(&sc, &sd), rv, counts(&rc, &rd), st)?
        }
    }
    Ok(())
}

/// The elements a call reads from its send buffer and writes in its receive buffer (the
/// in-place forms use the receive buffer alone); the forms measured out of place only are
/// refused in place.
pub(crate) fn lens(k: &Call<'_>, rank: usize, w: usize) -> anyhow::Result<(usize, usize)> {
    let n = k.count;
    Ok(match (k.coll, k.in_place) {
        (Coll::AllReduce | Coll::Broadcast, _) => (n, n),
        (Coll::AllGather, false) | (Coll::Gather, false) => (n, n * w),
        (Coll::AllGather | Coll::ReduceScatter, true) => (0, n * w),
        (Coll::ReduceScatter, false) | (Coll::Scatter, false) => (n * w, n),
        (Coll::AllToAll, false) => (n * w, n * w),
        (Coll::AllToAllV, false) => {
            let v = k.a2av.as_ref().context("all_to_all_v without its counts")?;
            (v.send(rank).iter().sum(), v.recv(rank).iter().sum())
        }
        (c, true) => bail!("{} is measured out of place only (rank {rank})", c.name()),
    })
}

/// NCCL's in-place (input, output) pointers in the buffer at `base` (nccl.h: all_gather
/// reads the rank's chunk, reduce_scatter writes it; the others use the buffer for both).
/// `n` is the per-rank count.
pub(crate) fn in_place_ptrs(
    coll: Coll,
    base: usize,
    rank: usize,
    n: usize,
    dt: DataType,
) -> (usize, usize) {
    let chunk = base + rank * n * dt.size();
    match coll {
        Coll::AllGather => (chunk, base),
        Coll::ReduceScatter => (base, chunk),
        _ => (base, base),
    }
}

/// The same call through the NCCL function table, with no unicomm layer.
pub(crate) fn raw(
    c: &unicomm::Comm,
    k: &Call<'_>,
    sp: usize,
    rp: usize,
    dt: DataType,
) -> anyhow::Result<()> {
    match (c.backend(), k.stream) {
        (AnyComm::Nccl(a), AnyStream::Nccl(s)) => raw_api(a, s, k, sp, rp, dt),
        (AnyComm::Rccl(a), AnyStream::Rccl(s)) => raw_api(a, s, k, sp, rp, dt),
        _ => bail!("raw mode needs a GPU backend"),
    }
}

pub(crate) fn raw_api<R: Runtime>(
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
    let op = k.op.nccl().ok_or_else(|| {
        anyhow::anyhow!(
            "the raw-NCCL baseline takes built-in reductions, not {}",
            k.op
        )
    })?;
    let (n, t) = (k.count, dt.nccl());
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
            Coll::Gather | Coll::Scatter | Coll::AllToAllV => {
                bail!("{} has no raw-NCCL baseline here", k.coll.name())
            }
        }
    };
    api.check("raw NCCL call", code, Some(comm))
        .context("raw mode")
}

/// Fills the inputs: send (or, in place, the output buffer) from `base`, this rank's
/// `input(rank, i)` for every element of the largest buffer (made once per mode); out of
/// place, the output is cleared.
pub(crate) fn fill<T: Val>(
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
        let (send, recv) = held.bufs();
        send.view_mut()
            .slice_mut(..send_len)?
            .copy_from_host(&base[..send_len], st)?;
        // The output cleared (nccl-tests' InitData), so a call that wrote nothing fails
        // the check instead of passing on an earlier call's result.
        recv.view_mut()
            .slice_mut(..recv_len)?
            .copy_from_host(&vec![T::of(0); recv_len], st)?;
    }
    Ok(())
}

/// Elements of this rank's output that differ from the reference.
pub(crate) fn verify<T: Val>(
    c: &unicomm::Comm,
    k: &Call<'_>,
    held: &mut Held<'_, T>,
    w: usize,
) -> anyhow::Result<u64> {
    let (r, n, op) = (c.rank(), k.count, k.op);
    let (_, recv) = held.bufs();
    // all_to_all_v: where each received element came from (peer, its send index).
    let mut from: Vec<(usize, usize)> = Vec::new();
    if let Some(v) = &k.a2av {
        let rc = v.recv(r);
        for (p, &cnt) in rc.iter().enumerate() {
            let sd = unicomm::packed_displs(&v.send(p))?;
            from.extend((0..cnt).map(|j| (p, sd[r] + j)));
        }
    }
    let (lo, len) = match (k.coll, k.in_place) {
        (Coll::ReduceScatter, true) => (r * n, n),
        (Coll::AllGather | Coll::AllToAll, _) => (0, n * w),
        (Coll::Gather, _) if r == 0 => (0, n * w),
        // Off the root a gather writes nothing to check.
        (Coll::Gather, _) => (0, 0),
        (Coll::AllToAllV, _) => (0, from.len()),
        _ => (0, n),
    };
    let out = recv.view().slice(lo..lo + len)?.copy_to_host(k.stream)?;
    let want = |j: usize| -> i64 {
        match k.coll {
            Coll::AllReduce => reduced(op, w, j),
            Coll::Broadcast => input(0, j),
            Coll::AllGather | Coll::Gather => input(j / n, j % n),
            Coll::ReduceScatter => reduced(op, w, r * n + j),
            Coll::AllToAll => input(j / n, r * n + j % n),
            Coll::Scatter => input(0, r * n + j),
            Coll::AllToAllV => input(from[j].0, from[j].1),
        }
    };
    Ok(out
        .iter()
        .enumerate()
        .filter(|(j, x)| x.f() != T::of(want(*j)).f())
        .count() as u64)
}

/// `op` (one operation on the capturing stream) `iters` times in a graph.
pub(crate) fn captured(
    cs: &Arc<CudaStream>,
    iters: usize,
    mut op: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<CudaGraph> {
    cs.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(|e| anyhow::anyhow!("cuStreamBeginCapture: {e:?}"))?;
    let ran = (0..iters).try_for_each(|_| op());
    // The capture is ended whatever the operations did, so the stream leaves capture mode.
    let g =
        cs.end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    ran?;
    match g {
        Ok(Some(g)) => Ok(g),
        Ok(None) => bail!("the captured graph is empty"),
        Err(e) => bail!("cuStreamEndCapture: {e:?}"),
    }
}

/// `iters` device-to-device copies of `bytes` (at least 1, at most either buffer) from `src`
/// to `dst`, captured into one graph on `cs`: the floor's copy. The addresses are taken
/// before the capture (cudarc's event waits inside it would invalidate it); the graph must
/// be launched only while both buffers live (`floors` holds them until its graphs are gone).
pub(crate) fn copy_graph(
    cs: &Arc<CudaStream>,
    iters: usize,
    src: &CudaSlice<u8>,
    dst: &mut CudaSlice<u8>,
    bytes: usize,
) -> anyhow::Result<CudaGraph> {
    let bytes = bytes.max(1).min(src.len()).min(dst.len());
    let (from, _read) = src.device_ptr(cs);
    let (to, _written) = dst.device_ptr_mut(cs);
    captured(cs, iters, || {
        // SAFETY: both ranges lie inside live allocations of `cs`'s context (`bytes` is at
        // most either length); the copy runs at the graph's launches, while the caller
        // holds the buffers.
        unsafe { cudarc::driver::result::memcpy_dtod_async(to, from, bytes, cs.cu_stream()) }
            .map_err(|e| anyhow::anyhow!("cuMemcpyDtoDAsync: {e:?}"))
    })
}
