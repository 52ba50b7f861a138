//! Symmetric memory on an NCCL-API communicator and unicomm's own kernels on it (the
//! contract's layout, comm-core/src/symmetric/mod.rs; the protocols of the mock's kernels).
//!
//! One rank's allocation is device memory from the library (`ncclMemAlloc`, cuMem:
//! exportable): its data rounded up to 256 bytes, its signal pad, then for Lamport three
//! workspaces of `world` slots. Every rank's is mapped here by unicomm's own exchange (the
//! copy-engine path's: the allocation exported as a POSIX descriptor, the peers' imported),
//! for one rank per process on one host and for ranks created together in one process (the
//! local world's own exchange: a mapping keeps a peer's memory alive after its owner frees
//! it, where peer access would not); a world of one needs none.
//! The kernels (`Runtime::launch`) watch the communicator's control block
//! ([`control`]): its abort word, set at abort, and the fault they report, which the
//! stream's waits read.

#![allow(
    unsafe_code,
    reason = "launches unicomm's kernels on peers' memory through the runtime (the architecture test's UNSAFE_FILES lists it)"
)]

mod control;
mod engine;
mod exchange;
mod expert;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use unicomm_core::registry::RawHandle;
use unicomm_core::symmetric::{
    check_all_reduce, pad_gone, ExpertEngine, SymmetricOp, SymmetricParts, LAMPORT_HEADER,
    MAX_SYMMETRIC_WORLD, PAD_BYTES,
};
use unicomm_core::{DataType, Error, Result};

use crate::base::Base;
use crate::copy_engine::region::Region;
use crate::copy_engine::CopyEngine;
use crate::memory::{ApiMemory, ApiStream};
use crate::sys::kernel_args::{KernelAlgorithm, KernelParams, Launch};
use crate::sys::runtime::Runtime;
use control::ControlBlock;

/// One symmetric allocation as this rank sees it.
#[derive(Debug)]
struct Record {
    /// Each rank's data, at its address here.
    peers: Vec<usize>,
    /// Bytes of data per rank, as asked.
    bytes: usize,
    /// The data's bytes rounded up to 256: where the pad starts.
    data: usize,
    /// The Lamport workspace's element type, where there is one.
    lamport: Option<DataType>,
    /// The peers' allocations mapped here, (address, size), unmapped at release.
    maps: Vec<(usize, usize)>,
}

/// A communicator's symmetric allocations and its kernels' control block.
pub(crate) struct SymmetricMemory<R: Runtime> {
    next: AtomicUsize,
    live: Mutex<HashMap<RawHandle, Arc<Record>>>,
    control: OnceLock<Arc<ControlBlock<R>>>,
    /// The expert groups an expert library runs.
    pub(crate) engines: engine::Engines,
}

impl<R: Runtime> Default for SymmetricMemory<R> {
    fn default() -> Self {
        SymmetricMemory {
            next: AtomicUsize::new(1),
            live: Mutex::new(HashMap::new()),
            control: OnceLock::new(),
            engines: Default::default(),
        }
    }
}

/// Rounds `n` up to a multiple of 256.
fn round_up(n: usize) -> Option<usize> {
    n.checked_add(255).map(|x| x & !255)
}

/// A Lamport workspace's type as one word every rank compares (0: none).
fn lamport_code(t: Option<DataType>) -> u64 {
    match t {
        None => 0,
        Some(DataType::F32) => 1,
        Some(DataType::F16) => 2,
        Some(DataType::Bf16) => 3,
        Some(_) => 4,
    }
}

impl<R: Runtime> SymmetricMemory<R> {
    /// The control block's address for a kernel's argument (made at the first use: the
    /// device-API kernel watches it too).
    pub(crate) fn control_address(&self, base: &Base<R>) -> Result<usize> {
        Ok(self.control(base)?.address())
    }

    /// The control block, made (and registered with the communicator's abort and fault
    /// hooks) at the first allocation.
    fn control(&self, base: &Base<R>) -> Result<&Arc<ControlBlock<R>>> {
        if let Some(c) = self.control.get() {
            return Ok(c);
        }
        let lc = &base.lc;
        let c = ControlBlock::new(lc.rt.clone(), lc.dev, lc.rank, lc.deadline())?;
        let c = Arc::new(c);
        // Allocations are collective calls of one thread at a time per communicator; were
        // two to race, the second's block is dropped unused.
        let kept = self.control.get_or_init(|| c.clone());
        if Arc::ptr_eq(kept, &c) {
            lc.add_fault_hook(c)?;
        }
        Ok(kept)
    }

    /// `alloc_symmetric` (collective): the size and the Lamport type compared on every
    /// rank, the control block, this rank's part allocated and filled, every rank's mapped.
    pub(crate) fn alloc(
        &self,
        base: &Base<R>,
        ce: &CopyEngine<R>,
        bytes: usize,
        lamport: Option<DataType>,
    ) -> Result<SymmetricParts<ApiMemory<R>>> {
        let lc = &base.lc;
        base.not_in_group("alloc_symmetric")?;
        lc.not_suspended()?;
        let w = lc.world;
        if w > MAX_SYMMETRIC_WORLD {
            return Err(Error::unsupported(
                "symmetric memory",
                format!("at most {MAX_SYMMETRIC_WORLD} ranks"),
                format!("a world of {w}"),
            ));
        }
        agree_shape(base, bytes, lamport)?;
        if w > 1 && !ce.exchanges_memory() {
            return Err(Error::unsupported(
                "symmetric memory across ranks",
                "unicomm's memory exchange: one rank per process on one host joined by unique id (init_rank), or ranks created together in one process; Linux",
                "a communicator without it",
            ));
        }
        self.control(base)?;
        let too_big = || Error::invalid("len", format!("{bytes} bytes per rank overflow"));
        let data = round_up(bytes.max(1)).ok_or_else(too_big)?;
        let work = match lamport {
            Some(_) => (data + LAMPORT_HEADER)
                .checked_mul(3 * w)
                .ok_or_else(too_big)?,
            None => 0,
        };
        let total = data.checked_add(PAD_BYTES + work).ok_or_else(too_big)?;
        let own = ApiMemory::alloc(&lc.api, lc.rt.clone(), lc.dev, lc.deadline(), total)?;
        fill(base, &own, data, lamport)?;
        let (peers, maps) = match w {
            1 => (vec![own.ptr], Vec::new()),
            _ => match ce.swap_memory(base, Region { addr: own.ptr, bytes: total })? {
                Some((parts, maps)) => (parts.iter().map(|p| p.addr).collect(), maps),
                None => {
                    return Err(Error::unsupported(
                        "symmetric memory across ranks",
                        "every rank's allocation exported and mapped by every rank",
                        "a rank that could not export or map one (memory not from ncclMemAlloc, or no cuMem)",
                    ))
                }
            },
        };
        let record = Record {
            peers: peers.clone(),
            bytes,
            data,
            lamport,
            maps,
        };
        let handle = RawHandle(self.next.fetch_add(1, Ordering::Relaxed));
        self.table().insert(handle, Arc::new(record));
        Ok(SymmetricParts::laid_out(own, handle, peers, data, bytes))
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<RawHandle, Arc<Record>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, handle: RawHandle) -> Result<Arc<Record>> {
        self.table()
            .get(&handle)
            .cloned()
            .ok_or_else(|| unknown(handle))
    }

    /// `free_symmetric`: local, not waiting; the peers' mappings go once the device is
    /// idle (on a helper thread within the deadline).
    pub(crate) fn free(&self, base: &Base<R>, handle: RawHandle) -> Result<()> {
        let rec = self
            .table()
            .remove(&handle)
            .ok_or_else(|| unknown(handle))?;
        if rec.maps.is_empty() {
            return Ok(());
        }
        let (rt, dev, maps) = (base.lc.rt.clone(), base.lc.dev, rec.maps.clone());
        // This rank's departure word in every peer's pad, once its device is idle (its
        // kernels on the allocation have all ended), before the mappings go.
        let me = base.lc.rank;
        let words: Vec<usize> = (rec.peers.iter().enumerate())
            .filter(|&(q, _)| q != me)
            .map(|(_, &p)| p + rec.data + pad_gone(me))
            .collect();
        let unmap = move || -> Result<()> {
            rt.synchronize_device(dev)?;
            let s = rt.create_stream(dev)?;
            for at in words {
                // SAFETY: a `u32` of a peer's pad, inside its part mapped here (the
                // mappings go below, after this stream's copies ended).
                unsafe { rt.htod(dev, at, &1u32.to_le_bytes(), &s) }?;
            }
            rt.synchronize(&s)?;
            for (addr, size) in maps {
                // SAFETY: mappings of `import_memory`, taken out of the table (unmapped
                // once, here), after the device's work (synchronized above).
                unsafe { rt.unmap_imported(dev, addr, size) }?;
            }
            Ok(())
        };
        let what = format!("the peers' symmetric memory mapped on device {dev}");
        crate::wait::released(what, base.lc.timeout(), unmap);
        Ok(())
    }

    /// One operation of unicomm's kernels on `stream`, checked first (the allocation is
    /// this communicator's, the count inside it, the Lamport workspace of this type, the
    /// buffers this rank's and large enough), launched with the stream watched.
    pub(crate) fn enqueue(
        &self,
        base: &Base<R>,
        op: SymmetricOp<'_, ApiMemory<R>>,
        stream: &ApiStream<R>,
    ) -> Result<()> {
        let lc = &base.lc;
        base.ready_for_kernel(stream)?;
        match op {
            SymmetricOp::Dispatch(ref d) if d.group.engine != ExpertEngine::Kernels => {
                return self.engines.dispatch(base, d, stream)
            }
            SymmetricOp::Combine(ref c) if c.group.engine != ExpertEngine::Kernels => {
                return self.engines.combine(base, c, stream)
            }
            _ => {}
        }
        let handle = match op {
            SymmetricOp::Barrier { handle } | SymmetricOp::AllReduce { handle, .. } => handle,
            SymmetricOp::Dispatch(ref d) => d.group.recv,
            SymmetricOp::Combine(ref c) => c.group.recv,
            SymmetricOp::AllToAllV(ref a) => a.handle,
        };
        let rec = self.get(handle)?;
        // Made before the first allocation was recorded.
        let control = self.control.get().ok_or_else(|| unknown(handle))?.address();
        let sig = op.signature().words();
        let (dtype, mut params) = match op {
            SymmetricOp::Barrier { .. } => (
                DataType::F32,
                params_of(base, &rec, control, KernelAlgorithm::Barrier),
            ),
            SymmetricOp::AllReduce { .. } => all_reduce_params(base, &rec, control, op)?,
            SymmetricOp::Dispatch(d) => self.dispatch_params(base, control, &d)?,
            SymmetricOp::Combine(c) => self.combine_params(base, control, &c)?,
            // Its bytes moved as they are: any function serves.
            SymmetricOp::AllToAllV(a) => {
                (DataType::F32, self.all_to_all_v_params(base, control, &a)?)
            }
        };
        params.sig = sig;
        stream.watched_by(lc);
        // SAFETY: every address is this rank's checked memory, the peers' mapped data and
        // pads (kept mapped while the record lives, and after its release until the device
        // is idle), or the control block (freed once the device is idle); the sizes were
        // checked against the allocations above.
        unsafe {
            lc.rt
                .launch(lc.dev, dtype, Launch::Symmetric(&params), stream.inner())
        }
    }
}

/// The size and the Lamport type of every rank's allocation compared: `Mismatch` on every
/// rank where they differ (the maximum of each word and of its complement).
fn agree_shape<R: Runtime>(base: &Base<R>, bytes: usize, lamport: Option<DataType>) -> Result<()> {
    let (b, t) = (bytes as u64, lamport_code(lamport));
    let m = base.all_max(&[b, !b, t, !t])?;
    if (m[0], !m[1]) != (b, b) {
        return Err(Error::Mismatch {
            what: "bytes",
            detail: format!(
                "a symmetric allocation of {bytes} bytes on rank {}: the ranks' sizes range from {} to {}",
                base.lc.rank, !m[1], m[0]
            ),
        });
    }
    if (m[2], !m[3]) != (t, t) {
        return Err(Error::Mismatch {
            what: "dtype",
            detail: format!(
                "a symmetric allocation's Lamport workspace of {lamport:?} on rank {}: the ranks differ",
                base.lc.rank
            ),
        });
    }
    Ok(())
}

/// This rank's pad zeroed and its Lamport workspaces filled with the type's poison
/// (negative zero), before any peer can reach it; its data left as the library gives it
/// (an expert group's slots of a prefill are gigabytes: never staged through the host).
fn fill<R: Runtime>(
    base: &Base<R>,
    own: &ApiMemory<R>,
    data: usize,
    lamport: Option<DataType>,
) -> Result<()> {
    let mut bytes = vec![0u8; own.bytes - data];
    let poison: &[u8] = match lamport {
        None => &[],
        Some(DataType::F32) => &[0, 0, 0, 0x80],
        Some(_) => &[0, 0x80],
    };
    if !poison.is_empty() {
        for chunk in bytes[PAD_BYTES..].chunks_exact_mut(poison.len()) {
            chunk.copy_from_slice(poison);
        }
    }
    let st = base.lc.create_stream()?;
    // SAFETY: `own` holds `own.bytes` device bytes of this rank's device, allocated above
    // (`data` of them before the pad).
    unsafe {
        base.lc
            .rt
            .htod(base.lc.dev, own.ptr + data, &bytes, st.inner())
    }
}

/// A launch's argument without an operation's operands: every rank's data and pad.
fn params_of<R: Runtime>(
    base: &Base<R>,
    rec: &Record,
    control: usize,
    algorithm: KernelAlgorithm,
) -> KernelParams {
    let mut peers = [0u64; MAX_SYMMETRIC_WORLD];
    let mut pads = [0u64; MAX_SYMMETRIC_WORLD];
    for (r, &p) in rec.peers.iter().enumerate() {
        peers[r] = p as u64;
        pads[r] = (p + rec.data) as u64;
    }
    KernelParams {
        peers,
        pads,
        out: 0,
        residual: 0,
        weight: 0,
        out8: 0,
        scale: 0,
        control: control as u64,
        timeout_ns: u64::try_from(base.lc.timeout().as_nanos()).unwrap_or(u64::MAX),
        count: 0,
        hidden: 0,
        lamport: (rec.data + PAD_BYTES) as u64,
        slot: (LAMPORT_HEADER + rec.data) as u64,
        rank: base.lc.rank as u32,
        world: base.lc.world as u32,
        algorithm: algorithm as u32,
        op: 0,
        norm: 0,
        eps: 0.0,
        sig: [0; unicomm_core::symmetric::SIGNATURE_WORDS],
        x: crate::sys::kernel_args::ExpertArgs::default(),
        typed: 0,
        workspace: u32::from(rec.lamport.is_some()),
        // One GPU holds every rank: GPU-scope fences order what the peers see.
        local: u32::from(base.lc.world == 1),
        blocks: 1,
    }
}

/// An all-reduce's launch, checked as the mock checks it.
fn all_reduce_params<R: Runtime>(
    base: &Base<R>,
    rec: &Record,
    control: usize,
    op: SymmetricOp<'_, ApiMemory<R>>,
) -> Result<(DataType, KernelParams)> {
    let SymmetricOp::AllReduce {
        count,
        dtype,
        op,
        algorithm,
        out,
        norm,
        ..
    } = op
    else {
        return Err(Error::invalid("op", "not an all-reduce"));
    };
    unicomm_core::symmetric::check_symmetric_type(dtype)?;
    unicomm_core::symmetric::check_symmetric_op(op)?;
    let (bytes, lamport) = (rec.bytes, rec.lamport);
    check_all_reduce(bytes, lamport, count, dtype, algorithm, &out, norm.as_ref())?;
    base.check_memory(out.mem)?;
    let mut p = params_of(base, rec, control, algorithm.into());
    p.out = out.address() as u64;
    p.count = count as u64;
    p.typed = u32::from(rec.lamport == Some(dtype));
    p.op = crate::sys::kernel_args::op_code(op);
    if let Some(n) = norm {
        base.check_memory(n.residual.mem)?;
        base.check_memory(n.weight.mem)?;
        p.residual = n.residual.address() as u64;
        p.weight = n.weight.address() as u64;
        if let Some(q) = &n.fp8 {
            base.check_memory(q.out.mem)?;
            base.check_memory(q.scale.mem)?;
            p.out8 = q.out.address() as u64;
            p.scale = q.scale.address() as u64;
        }
        p.hidden = n.hidden as u64;
        p.norm = 1;
        p.eps = n.eps;
    }
    let hidden = norm.map(|n| n.hidden);
    p.blocks = crate::sys::kernel_args::symmetric_blocks(algorithm, count, dtype, hidden);
    Ok((dtype, p))
}

fn unknown(handle: RawHandle) -> Error {
    Error::invalid(
        "handle",
        format!("{handle:?} is not a live symmetric allocation of this communicator"),
    )
}
