//! Symmetric memory on the mock: every rank's allocation is a `memfd` segment (in threads
//! and in processes alike), each rank maps every peer's for the allocation's life, so a
//! rank's view stays valid whatever its peers free (the kernel frees a segment when its last
//! mapping goes, as CUDA frees physical memory when its last mapping is unmapped). The
//! kernels ([`kernels`]) run unicomm's algorithms on the stream's worker thread through
//! those mappings, with the GPU kernels' protocols: barriers on the signal pads, Lamport's
//! poison.
//!
//! One rank's allocation: its data (rounded up to 256 bytes), its signal pad
//! ([`PAD_BYTES`]), then, for the Lamport all-reduce, three workspaces of `world` slots of
//! the data's size each.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use unicomm_core::registry::RawHandle;
use unicomm_core::symmetric::{
    ExpertMode, SymmetricAlgorithm, SymmetricOp, SymmetricParts, LAMPORT_HEADER, PAD_BYTES,
};
use unicomm_core::{Collective, DataType, DeviceMemory, Error, ReduceOp, Result};

use crate::comm::MockComm;
use crate::fabric::{Desc, Signature};
use crate::memory::MockMemory;
use crate::stream::MockStream;
use grid::Grid;
use kernels::{Local, Run, Ty};
use protocol::{Norm, Reduce};
use table::{unknown, Record};

mod exchange;
mod expert;
mod expert_packed;
mod grid;
pub(crate) mod kernels;
mod lamport;
mod norm;
mod protocol;
pub(crate) mod table;

/// Rounds `n` up to a multiple of 256.
fn round_up(n: usize) -> Option<usize> {
    n.checked_add(255).map(|x| x & !255)
}

impl MockComm {
    /// `alloc_symmetric`: this rank's segment made and filled (pad zeroed, workspaces
    /// poisoned), the ranks' descriptions exchanged and compared (a size or a type that
    /// differs is `Mismatch` on every rank), every peer's segment mapped here.
    #[cfg(target_os = "linux")]
    pub(crate) fn alloc_symmetric_mem(
        &self,
        bytes: usize,
        lamport: Option<DataType>,
    ) -> Result<SymmetricParts<MockMemory>> {
        self.live()?;
        // The refusals of the GPU backends the mock stands for.
        self.ctx.target.symmetric_kernels()?;
        let w = self.ctx.world;
        let too_big = || Error::invalid("len", format!("{bytes} bytes per rank overflow"));
        let data = round_up(bytes.max(1)).ok_or_else(too_big)?;
        let work = match lamport {
            Some(_) => (data + LAMPORT_HEADER)
                .checked_mul(3 * w)
                .ok_or_else(too_big)?,
            None => 0,
        };
        let total = data
            .checked_add(PAD_BYTES)
            .and_then(|x| x.checked_add(work))
            .ok_or_else(too_big)?;
        let own = MockMemory::new(total, self.owner(), true)?;
        if let Some(t) = lamport {
            kernels::poison(&own, data + PAD_BYTES, work, t, self.ctx.timeout)?;
        }
        let (maps, bases) = self.exchange_symmetric(&own, bytes, lamport)?;
        let record = Record {
            _own: own.clone(),
            _maps: maps,
            bases,
            bytes,
            pad_at: data,
            lamport,
            rank: self.ctx.rank,
        };
        let peers = record.bases.clone();
        let handle = RawHandle(self.symmetric.next.fetch_add(1, Ordering::Relaxed));
        self.symmetric
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(handle, Arc::new(record));
        Ok(SymmetricParts::laid_out(own, handle, peers, data, bytes))
    }

    /// The mock's symmetric memory is memfd segments: Linux only.
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn alloc_symmetric_mem(
        &self,
        _bytes: usize,
        _lamport: Option<DataType>,
    ) -> Result<SymmetricParts<MockMemory>> {
        Err(Error::unsupported(
            "symmetric memory on the mock",
            "Linux (memfd segments)",
            std::env::consts::OS,
        ))
    }

    /// Every rank's description of its allocation, compared (the same size and Lamport
    /// type everywhere), every peer's segment mapped here, and a barrier: no rank returns
    /// (and may free its part) before every rank mapped it.
    #[cfg(target_os = "linux")]
    #[allow(clippy::type_complexity, reason = "the mappings and the addresses")]
    fn exchange_symmetric(
        &self,
        own: &MockMemory,
        bytes: usize,
        lamport: Option<DataType>,
    ) -> Result<(Vec<Option<crate::shm::PeerMap>>, Vec<usize>)> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let desc = Desc {
            sig: Signature {
                kind: "SymmetricAlloc",
                count: bytes,
                dtype: lamport,
                op: None,
                root: None,
                send_reg: None,
                recv_reg: None,
            },
            send: own.address(),
            recv: 0,
            send_at: own.inner.remote(0),
            recv_at: None,
        };
        let fabric = &*self.ctx.fabric;
        let deadline = std::time::Instant::now() + self.ctx.timeout;
        let (me, own_at) = (self.ctx.rank, own.address());
        let r = fabric
            .gather(seq, me, desc, deadline)
            .and_then(|all| crate::agree::agree(&all).map(|()| all))
            .and_then(|all| map_peers(&all, me, own_at))
            .and_then(|mapped| fabric.phase(seq, me, 1, deadline).map(|()| mapped));
        fabric.leave(seq, r.is_err(), deadline);
        r
    }

    /// Releases this rank's view (the pending kernels hold theirs).
    pub(crate) fn free_symmetric_mem(&self, handle: RawHandle) -> Result<()> {
        self.symmetric
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&handle)
            .map(drop)
            .ok_or_else(|| unknown(handle))
    }
}

/// Every peer's segment mapped here, and every rank's base address here.
#[cfg(target_os = "linux")]
#[allow(clippy::type_complexity, reason = "the mappings and the addresses")]
fn map_peers(
    all: &[Desc],
    me: usize,
    own: usize,
) -> Result<(Vec<Option<crate::shm::PeerMap>>, Vec<usize>)> {
    let mut maps = Vec::with_capacity(all.len());
    let mut bases = Vec::with_capacity(all.len());
    for (p, d) in all.iter().enumerate() {
        if p == me {
            maps.push(None);
            bases.push(own);
            continue;
        }
        let remote = d.send_at.ok_or_else(|| {
            Error::invalid(
                "symmetric",
                format!("rank {p}'s allocation is not shared memory"),
            )
        })?;
        let m = crate::shm::PeerMap::open(&remote)?;
        bases.push(m.addr(remote.offset));
        maps.push(Some(m));
    }
    Ok((maps, bases))
}

impl MockComm {
    /// One symmetric operation as a job of `stream` (recorded for a graph's replays while it
    /// captures), checked first: the allocation is this communicator's, the count inside it,
    /// the Lamport workspace of this type, the buffers this rank's and large enough.
    pub(crate) fn symmetric_enqueue(
        &self,
        op: SymmetricOp<'_, MockMemory>,
        stream: &MockStream,
    ) -> Result<()> {
        self.live()?;
        self.check_stream(stream)?;
        if crate::comm::GROUP.with(|g| g.borrow().depth > 0) {
            return Err(unicomm_core::symmetric::refused_in_group());
        }
        let sig = op.signature().words();
        match op {
            SymmetricOp::Barrier { handle } => {
                let rec = self.symmetric.get(handle)?;
                self.push_kernel(rec, sig, stream, 1, |run, _| protocol::agree(run))
            }
            SymmetricOp::Dispatch(_) | SymmetricOp::Combine(_) => {
                self.expert_enqueue(op, sig, stream)
            }
            SymmetricOp::AllToAllV(a) => {
                let rec = self.symmetric.get(a.handle)?;
                let x = self.exchange_of(&rec, a)?;
                let kernel = move |run: &Run, _: &Grid| exchange::all_to_all_v(run, &x);
                self.push_kernel(rec, sig, stream, 1, kernel)
            }
            SymmetricOp::AllReduce {
                handle,
                count,
                dtype,
                op,
                algorithm,
                out,
                norm,
            } => {
                let rec = self.symmetric.get(handle)?;
                let k = self.reduce_of(&rec, (count, dtype, op, algorithm), out, norm)?;
                let grid = blocks(&k);
                self.push_kernel(rec, sig, stream, grid, move |run, grid| {
                    let sums = sums(run, &k, grid)?;
                    let t = run.ctx.timeout;
                    match &k.norm {
                        None => kernels::write(&k.out, k.ty, &sums, t),
                        Some(n) => norm::add_and_norm(k.ty, &sums, n, &k.out, t),
                    }
                })
            }
        }
    }

    /// An expert dispatch or combine, its operands checked (this rank's memory) and taken.
    fn expert_enqueue(
        &self,
        op: SymmetricOp<'_, MockMemory>,
        sig: [u32; unicomm_core::symmetric::SIGNATURE_WORDS],
        stream: &MockStream,
    ) -> Result<()> {
        match op {
            SymmetricOp::Dispatch(d) => {
                let g = expert::Group::new(|h| self.symmetric.get(h), &d.group)?;
                for sl in [&d.tokens, &d.ids, &d.out, &d.counts] {
                    self.check_memory(sl.mem)?;
                }
                let fp8 = match d.fp8 {
                    None => None,
                    Some(q) => {
                        self.check_memory(q.scales.mem)?;
                        self.check_memory(q.out_scales.mem)?;
                        Some(expert::Fp8Job {
                            slots: self.symmetric.get(q.slots)?,
                            per: q.per_token,
                            scales: local(&q.scales),
                            out_scales: local(&q.out_scales),
                        })
                    }
                };
                let job = expert::DispatchJob {
                    n: d.n,
                    tokens: local(&d.tokens),
                    ids: local(&d.ids),
                    out: local(&d.out),
                    counts: local(&d.counts),
                    fp8,
                };
                self.push_expert(g, sig, stream, move |run, g| match g.mode {
                    ExpertMode::HighThroughput { max_recv } => {
                        expert_packed::dispatch(run, g, &job, max_recv)
                    }
                    _ => expert::dispatch(run, g, &job),
                })
            }
            SymmetricOp::Combine(c) => {
                let g = expert::Group::new(|h| self.symmetric.get(h), &c.group)?;
                for sl in [&c.expert_out, &c.ids, &c.weights, &c.out] {
                    self.check_memory(sl.mem)?;
                }
                let job = expert::CombineJob {
                    n: c.n,
                    expert_out: local(&c.expert_out),
                    ids: local(&c.ids),
                    weights: local(&c.weights),
                    out: local(&c.out),
                };
                self.push_expert(g, sig, stream, move |run, g| match g.mode {
                    ExpertMode::HighThroughput { .. } => expert_packed::combine(run, g, &job),
                    _ => expert::combine(run, g, &job),
                })
            }
            _ => Err(Error::invalid("op", "not an expert operation")),
        }
    }

    /// An expert dispatch or combine as a job of `stream`, its barriers on the receive
    /// slots' pads.
    fn push_expert(
        &self,
        g: expert::Group,
        sig: [u32; unicomm_core::symmetric::SIGNATURE_WORDS],
        stream: &MockStream,
        kernel: impl Fn(&Run, &expert::Group) -> Result<()> + Send + Sync + 'static,
    ) -> Result<()> {
        let rec = g.recv.clone();
        self.push_kernel(rec, sig, stream, 1, move |run, _| kernel(run, &g))
    }

    /// One of unicomm's kernels as a job of `stream` (recorded for a graph's replays while
    /// it captures) on a grid of `blocks` (the GPU kernels' own), its barriers on `rec`'s
    /// pads; a failure that explains a stuck job dumps the flight recorder.
    fn push_kernel(
        &self,
        rec: Arc<Record>,
        sig: [u32; unicomm_core::symmetric::SIGNATURE_WORDS],
        stream: &MockStream,
        blocks: usize,
        kernel: impl Fn(&Run, &Grid) -> Result<()> + Send + Sync + 'static,
    ) -> Result<()> {
        let (ctx, kernel) = (self.ctx.clone(), Arc::new(kernel));
        stream.push_replayable(Arc::new(move || {
            let (rec, ctx, kernel) = (rec.clone(), ctx.clone(), kernel.clone());
            Box::new(move || {
                let run = Run {
                    deadline: std::time::Instant::now() + ctx.timeout,
                    rec,
                    ctx,
                    sig,
                };
                let grid = Grid::at(&run, blocks);
                let ran = kernel(&run, &grid);
                grid.end(&run);
                ended(&run, ran)
            })
        }))
    }

    /// The all-to-all's operands, checked: the splits' allocation this communicator's
    /// (`3 x world` i64), the input's size, the output this rank's and large enough.
    fn exchange_of(
        &self,
        rec: &Record,
        a: unicomm_core::symmetric::AllToAllV<'_, MockMemory>,
    ) -> Result<exchange::Exchange> {
        let splits = self.symmetric.get(a.splits)?;
        let w = rec.bases.len();
        if splits.bytes < 3 * w * 8 {
            return Err(Error::invalid(
                "splits",
                format!("{} bytes, not 3 x {w} i64", splits.bytes),
            ));
        }
        if a.capacity.checked_mul(a.dtype.size()) != Some(rec.bytes) {
            return Err(Error::invalid(
                "capacity",
                format!(
                    "{} elements of an allocation of {} bytes",
                    a.capacity, rec.bytes
                ),
            ));
        }
        a.out.holds(a.capacity, a.dtype, "out")?;
        self.check_memory(a.out.mem)?;
        Ok(exchange::Exchange {
            splits,
            size: a.dtype.size(),
            capacity: a.capacity,
            out: local(&a.out),
        })
    }

    /// An all-reduce's kernel, checked: the count inside the allocation, the Lamport
    /// workspace of this type, the output (and the norm's buffers) this rank's and large
    /// enough.
    fn reduce_of(
        &self,
        rec: &Record,
        (count, dtype, op, algorithm): (usize, DataType, ReduceOp, SymmetricAlgorithm),
        out: unicomm_core::Slice<'_, MockMemory>,
        norm: Option<unicomm_core::symmetric::RmsNorm<'_, MockMemory>>,
    ) -> Result<Reduce> {
        let ty = Ty::of(dtype)?;
        unicomm_core::symmetric::check_all_reduce(
            rec.bytes,
            rec.lamport,
            count,
            dtype,
            algorithm,
            &out,
            norm.as_ref(),
        )?;
        self.check_memory(out.mem)?;
        let norm = match norm {
            None => None,
            Some(n) => Some(self.norm_of(n)?),
        };
        let k = Reduce {
            count,
            ty,
            op,
            algorithm,
            out: local(&out),
            norm,
        };
        Ok(k)
    }

    fn norm_of(&self, n: unicomm_core::symmetric::RmsNorm<'_, MockMemory>) -> Result<Norm> {
        self.check_memory(n.residual.mem)?;
        self.check_memory(n.weight.mem)?;
        if let Some(q) = &n.fp8 {
            self.check_memory(q.out.mem)?;
            self.check_memory(q.scale.mem)?;
        }
        Ok(Norm {
            residual: local(&n.residual),
            weight: local(&n.weight),
            hidden: n.hidden,
            eps: n.eps,
            fp8: n.fp8.map(|q| (local(&q.out), local(&q.scale))),
        })
    }
}

/// A kernel's outcome, a failure that explains a stuck or divergent job (the deadline, a
/// disagreement, an abort) dumping the flight recorder, as a collective's does.
fn ended(run: &Run, ran: Result<()>) -> Result<()> {
    if let Err(e) = &ran {
        run.ctx.flight.dump_if_explains(e);
    }
    ran
}

/// One all-reduce on this rank: its result, as bits (written, or normed, by the caller).
fn sums(run: &Run, k: &Reduce, grid: &Grid) -> Result<Vec<u32>> {
    match k.algorithm {
        SymmetricAlgorithm::OneShot => protocol::one_shot(run, k, grid),
        SymmetricAlgorithm::TwoShot => protocol::two_shot(run, k, grid),
        SymmetricAlgorithm::Lamport => lamport::lamport(run, k),
    }
}

/// The grid the GPU kernels run for `k` (before the CUDA launcher's clamp to what a device
/// holds).
fn blocks(k: &Reduce) -> usize {
    let hidden = k.norm.as_ref().map(|n| n.hidden);
    let dtype = k.ty.dtype();
    unicomm_nccl_api::sys::kernel_args::symmetric_blocks(k.algorithm, k.count, dtype, hidden)
        as usize
}

fn local(s: &unicomm_core::Slice<'_, MockMemory>) -> Local {
    Local {
        alloc: s.mem.inner.clone(),
        offset: s.offset,
    }
}
