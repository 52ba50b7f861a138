//! [`Collective`] for [`ApiComm`]: each operation of the contract, routed (`route.rs`) to
//! the path that runs it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use unicomm_core::backend::grouped;
use unicomm_core::flight::FlightRecorder;
use unicomm_core::registry::RegKind;
use unicomm_core::{
    Capabilities, Collective, CommConfig, Error, Kind, Op, RawHandle, Result, ShrinkMode, Zeros,
};

use super::route::{self, Route};
use super::ApiComm;
use crate::group;
use crate::libcomm::End;
use crate::memory::{ApiMemory, ApiStream};
use crate::policy::Taken;
use crate::sys::runtime::Runtime;

impl<R: Runtime> Collective for ApiComm<R> {
    type Stream = ApiStream<R>;
    type Memory = ApiMemory<R>;

    fn rank(&self) -> usize {
        self.base.lc.rank
    }
    fn world_size(&self) -> usize {
        self.base.lc.world
    }
    fn capabilities(&self) -> Capabilities {
        let api = &self.base.lc.api;
        Capabilities {
            backend: if api.flavor.library == "RCCL" {
                "rccl"
            } else {
                "nccl"
            },
            library_path: api.path.clone(),
            version: api.version,
            registration: api.has_registration(),
            windows: api.has_windows(),
            native_all_to_all: api.all_to_all.is_some(),
            graph_capture: self.base.lc.rt.has_graphs(),
            mem_alloc: api.has_mem_alloc(),
            copy_engine: self.ce.reachable() && api.has_windows(),
            native_split: api.fns.comm_split.is_some() && api.version >= crate::split::SPLIT_SINCE,
            native_gather_scatter: api.native_gather_scatter(),
            native_all_to_all_v: api.fns.all_to_allv.is_some(),
            fp8_reduce: self.base.library.target.fp8_reduce().is_ok(),
            pre_mul_sum: api.pre_mul_sum().is_ok(),
        }
    }

    fn create_stream(&self) -> Result<ApiStream<R>> {
        self.base.lc.create_stream()
    }

    fn create_stream_with(&self, priority: unicomm_core::StreamPriority) -> Result<ApiStream<R>> {
        self.base.lc.create_stream_with(priority)
    }

    fn alloc(&self, bytes: usize) -> Result<ApiMemory<R>> {
        let lc = &self.base.lc;
        // A suspended communicator refuses every call but its sleep mode's and its end,
        // allocation included, as the mock's does (the conformance suite's rule); memory
        // outlives an ended one (it is not the communicator's).
        lc.not_suspended()?;
        ApiMemory::alloc(&lc.api, lc.rt.clone(), (lc.dev, lc.deadline()), bytes)
    }

    fn check_memory(&self, mem: &ApiMemory<R>) -> Result<()> {
        self.base.check_memory(mem)
    }

    fn register(&self, mem: &ApiMemory<R>, offset: usize, bytes: usize) -> Result<RawHandle> {
        self.base.buffer_register(mem, (offset, bytes))
    }

    fn deregister(&self, handle: RawHandle) -> Result<()> {
        self.base.deregister_handle(handle, RegKind::Buffer)
    }

    fn register_window(
        &self,
        mem: &ApiMemory<R>,
        offset: usize,
        bytes: usize,
    ) -> Result<RawHandle> {
        let h = self
            .base
            .window_register(mem, (offset, bytes), RegKind::Window)?;
        if self.ce.enabled() {
            let addr = mem.range(offset, bytes, "bytes")?;
            if let Err(e) = self.ce.share_window(&self.base, h, (addr, bytes)) {
                let _ = self.deregister_window(h);
                return Err(e);
            }
        }
        Ok(h)
    }

    fn deregister_window(&self, handle: RawHandle) -> Result<()> {
        self.base.deregister_handle(handle, RegKind::Window)?;
        self.ce.forget_window(handle);
        Ok(())
    }

    fn register_auto(&self, mem: &ApiMemory<R>, offset: usize, bytes: usize) -> Result<RawHandle> {
        self.auto
            .register(&self.base, &self.ce, mem, (offset, bytes))
    }

    fn deregister_auto(&self, handle: RawHandle) -> Result<()> {
        self.auto.deregister(&self.base, &self.ce, handle)
    }

    fn device_memory(&self) -> Result<(usize, usize)> {
        self.base.lc.rt.mem_info(self.base.lc.dev)
    }

    fn device_info(&self) -> Result<unicomm_core::DeviceInfo> {
        let lc = &self.base.lc;
        let (name, pci_bus_id) = lc.rt.device_info(lc.dev)?;
        Ok(unicomm_core::DeviceInfo {
            index: Some(lc.dev),
            name,
            pci_bus_id,
        })
    }

    #[inline]
    fn enqueue(&self, op: Op<'_, ApiMemory<R>>, stream: &ApiStream<R>) -> Result<()> {
        let what = (op.kind, op.count, op.dtype);
        let homes = lent_elsewhere(&op, stream);
        if homes {
            refuse_lent_capture(&op)?;
        }
        self.flight.enqueued(
            what,
            stream.raw() as u64,
            || self.enqueue_op(&op, stream),
            || unicomm_core::DeviceStream::record(stream).ok(),
        )?;
        if homes {
            order_homes(&self.base.lc.rt, &op, stream)?;
        }
        Ok(())
    }

    fn graph_launched(&self, stream: &ApiStream<R>) {
        stream.watched_by(&self.base.lc);
    }

    fn graphs_held(&self) {
        self.base.lc.graphs_held.store(true, Ordering::Release);
    }

    fn graphs_released(&self) {
        let lc = &self.base.lc;
        lc.graphs_held.store(false, Ordering::Release);
        if !lc.wait_late_end(lc.timeout()) {
            tracing::warn!(
                rank = lc.rank,
                "the communicator's abort, given up at its deadline, still runs after its last graph was destroyed"
            );
        }
    }

    fn flight(&self) -> Option<&Arc<FlightRecorder>> {
        Some(&self.flight)
    }
    fn group_start(&self) -> Result<()> {
        self.base.lc.api.group_start()?;
        group::enter();
        Ok(())
    }

    fn group_end(&self) -> Result<()> {
        let members = group::leave();
        let end = self.base.lc.api.group_end();
        // The outermost end launched the group: in non-blocking mode every communicator it
        // called settles before the caller may wait on a stream (NCCL's rule).
        let Some(members) = members else {
            return end;
        };
        end?;
        members
            .iter()
            .try_for_each(|m| m.settle("ncclGroupEnd (non-blocking)"))
    }

    fn poll_async_error(&self) -> Result<()> {
        let lc = &self.base.lc;
        lc.async_error()
    }

    fn set_timeout(&self, timeout: std::time::Duration) -> Result<()> {
        let t = unicomm_core::env::check_timeout("timeout", timeout)?;
        self.base.lc.set_timeout(t);
        Ok(())
    }

    fn timeout(&self) -> Option<std::time::Duration> {
        Some(self.base.lc.timeout())
    }

    fn set_copy_engine(&self, on: bool) -> Result<()> {
        self.ce.switch(on)
    }

    fn split(&self, color: Option<u32>, key: i32, config: &CommConfig) -> Result<Option<Self>> {
        self.split_child(color, key, config)
    }

    fn shrink(&self, exclude: &[usize], mode: ShrinkMode, config: &CommConfig) -> Result<Self> {
        self.shrink_child(exclude, mode, config)
    }

    fn grow_id(&self) -> Result<[u8; 128]> {
        self.grow_id_comm()
    }

    fn grow(&self, world: usize, id: Option<&[u8; 128]>, config: &CommConfig) -> Result<Self> {
        self.grow_comm(world, id, config)
    }

    fn revoke(&self) -> Result<()> {
        self.revoke_comm()
    }

    fn properties(&self) -> Result<unicomm_core::Properties> {
        self.base.lc.properties()
    }

    fn window_peer_address(&self, handle: RawHandle, peer: usize) -> Result<Option<usize>> {
        let b = &self.base;
        b.lc.live_now()?;
        b.with_window(handle, |win, _| b.lc.api.peer_device_ptr(win, 0, peer))
    }

    fn alloc_symmetric(
        &self,
        bytes: usize,
        lamport: Option<unicomm_core::DataType>,
    ) -> Result<unicomm_core::symmetric::SymmetricParts<ApiMemory<R>>> {
        self.sym.alloc(&self.base, &self.ce, bytes, lamport)
    }

    fn free_symmetric(&self, handle: RawHandle) -> Result<()> {
        self.sym.free(&self.base, handle)
    }

    fn symmetric(
        &self,
        op: unicomm_core::symmetric::SymmetricOp<'_, ApiMemory<R>>,
        stream: &ApiStream<R>,
    ) -> Result<()> {
        self.sym.enqueue(&self.base, op, stream)
    }

    fn one_sided(
        &self,
        op: unicomm_core::one_sided::OneSided<'_, ApiMemory<R>>,
        stream: &ApiStream<R>,
    ) -> Result<()> {
        self.one_sided_op(op, stream)
    }

    fn suspend(&self) -> Result<()> {
        self.base.lc.suspend()
    }

    fn resume(&self) -> Result<()> {
        self.base.lc.resume()
    }

    fn mem_stats(&self) -> Result<unicomm_core::MemStats> {
        self.base.lc.mem_stats()
    }

    fn finalize(&mut self) -> Result<()> {
        self.base.lc.destroy(End::Finalize)
    }

    fn abort(&self) -> Result<()> {
        self.base.lc.destroy(End::Abort)
    }
}

impl<R: Runtime> ApiComm<R> {
    /// One operation, recorded once by the caller (a lowered one's parts are not recorded
    /// again); the path it took, by name. The common call (the library's, on this
    /// communicator) runs straight through here; the copy engines' all-to-all-v and a
    /// lowering are out of line.
    #[inline]
    fn enqueue_op(&self, op: &Op<'_, ApiMemory<R>>, stream: &ApiStream<R>) -> Result<&'static str> {
        let b = &self.base;
        if stream.dev != b.lc.dev {
            return Err(crate::base::foreign_stream(stream.dev, b.lc.dev));
        }
        let route = route::decide(b, &self.ce, &self.auto, op, stream);
        if op.options.is_some() {
            options_route(b, op, &route, stream)?;
        }
        // The one match on the route: what runs elsewhere leaves here, the rest is a call
        // made below, after the ranks' comparison.
        let direct = match route {
            Ok(Route::Library) => Ok(Direct::Library(None)),
            Ok(Route::Registered(c)) => Ok(Direct::Library(Some(c))),
            // Agreed by the ranks while planned: no comparison again.
            Ok(Route::CopyEngine(plan)) if matches!(op.kind, Kind::AllToAllV) => {
                return self.copy_engine_v(plan, stream);
            }
            Ok(Route::CopyEngine(plan)) => Ok(Direct::CopyEngine(plan)),
            Ok(Route::Lowered) => return self.lowered(op, stream),
            Err(e) => Err(e),
        };
        if op.kind.is_var() && direct.is_ok() {
            b.agree.check_layout(&b.lc, op, stream)?;
        }
        stream.watched_by(&b.lc);
        // UNICOMM_CHECK_COLLECTIVES=1: the ranks compare the call and its route first; a
        // rank whose call is refused here still takes part, so its peers do not wait.
        let path = || {
            let taken = direct.as_ref().map_or(Taken::Refused, Direct::taken);
            (taken.code(), &Taken::NAMES[..])
        };
        let checked = b.agree.check_collective(&b.lc, op, path, stream);
        let direct = direct?;
        checked?;
        let name = direct.taken().name();
        match direct {
            // One call site of the library's path, so that it is inlined here.
            Direct::Library(child) => b
                .library
                .enqueue(&b.lc, &b.registry, child, op, stream.lend())
                .map(|()| name),
            Direct::CopyEngine(plan) => self.ce.run(b, plan, &stream.s).map(|()| name),
        }
    }

    /// An all-to-all-v by copy engine, its plan agreed by the ranks.
    #[inline(never)]
    fn copy_engine_v(
        &self,
        plan: crate::copy_engine::Plan,
        stream: &ApiStream<R>,
    ) -> Result<&'static str> {
        stream.watched_by(&self.base.lc);
        self.ce
            .run(&self.base, plan, &stream.s)
            .map(|()| Taken::CopyEngine.name())
    }

    /// A collective the library has no call for: its parts (empty ones left out), in one
    /// group of this communicator.
    #[inline(never)]
    fn lowered(&self, op: &Op<'_, ApiMemory<R>>, stream: &ApiStream<R>) -> Result<&'static str> {
        let b = &self.base;
        b.agree.check_layout(&b.lc, op, stream)?;
        let ops = op.lower(b.lc.rank, b.lc.world, Zeros::Skip)?;
        grouped(self, || {
            ops.into_iter()
                .try_for_each(|o| self.enqueue_op(&o, stream).map(drop))
        })
        .map(|()| Taken::Lowered.name())
    }
}

/// A call made after the ranks' comparison: the library's (on this communicator, or on the
/// automatic registrations' second one) or the copy engines' by a plan.
enum Direct {
    Library(Option<crate::libcomm::Child>),
    CopyEngine(crate::copy_engine::Plan),
}

impl Direct {
    /// What the route it came from is called.
    #[inline]
    fn taken(&self) -> Taken {
        match self {
            Direct::Library(None) => Taken::Library,
            Direct::Library(Some(_)) => Taken::Registered,
            Direct::CopyEngine(_) => Taken::CopyEngine,
        }
    }
}

/// A call with per-call options: refused where they would not reach NCCL's kernels (a
/// kind NCCL has no `nccl*Config` for, a release before it, unicomm's copy-engine path),
/// never run without them.
#[cold]
#[inline(never)]
fn options_route<R: Runtime>(
    b: &crate::base::Base<R>,
    op: &Op<'_, ApiMemory<R>>,
    route: &Result<Route>,
    stream: &ApiStream<R>,
) -> Result<()> {
    b.library.target.call_options(op.kind)?;
    if op
        .options
        .as_ref()
        .is_some_and(|o| o.launch_marker.is_some())
        && (crate::group::in_group() || b.lc.rt.capturing(stream.inner())?)
    {
        return Err(unicomm_core::LaunchMarker::refused_here());
    }
    if let Ok(Route::CopyEngine(_)) = route {
        return Err(Error::invalid(
            "options",
            format!(
                "per-call options configure NCCL's kernels, and this {} takes unicomm's copy-engine path (set_copy_engine(false) around it, or no options)",
                op.name()
            ),
        ));
    }
    Ok(())
}

/// Whether a side of `op` is memory lent from a stream other than `stream` (a cudarc slice
/// used on another stream): two loads where nothing is lent.
#[inline]
fn lent_elsewhere<R: Runtime>(op: &Op<'_, ApiMemory<R>>, stream: &ApiStream<R>) -> bool {
    let foreign = |s: &Option<unicomm_core::Slice<'_, ApiMemory<R>>>| {
        s.as_ref()
            .and_then(|s| s.mem.home.as_ref())
            .is_some_and(|h| R::raw_stream(h) != R::raw_stream(&stream.s))
    };
    foreign(&op.send) || foreign(&op.recv)
}

/// Lent memory is captured only on its lender's stream: a replay on another stream could
/// outlive the lender's stream-ordered free once the graph is leaked, and a capture cannot
/// order a stream outside it.
#[cold]
#[inline(never)]
fn refuse_lent_capture<R: Runtime>(op: &Op<'_, ApiMemory<R>>) -> Result<()> {
    if !unicomm_core::graph::capturing() {
        return Ok(());
    }
    Err(Error::invalid(
        "stream",
        format!(
            "a {} captured on a stream other than the one its lent memory belongs to (a cudarc slice's stream): capture it on that stream (stream_from_cudarc(slice.stream()))",
            op.name()
        ),
    ))
}

/// Makes each lent side's home stream wait for the collective just enqueued on `stream`,
/// so the lender's stream-ordered free follows it whatever the caller leaks.
#[cold]
#[inline(never)]
fn order_homes<R: Runtime>(
    rt: &Arc<R>,
    op: &Op<'_, ApiMemory<R>>,
    stream: &ApiStream<R>,
) -> Result<()> {
    let done = rt.record(&stream.s)?;
    let mut waited = None;
    for side in [&op.send, &op.recv].into_iter().flatten() {
        if let Some(home) = side.mem.home.as_ref() {
            let raw = R::raw_stream(home);
            // In place, both sides are one lender's: one wait.
            if raw != R::raw_stream(&stream.s) && waited != Some(raw) {
                rt.wait_event(side.mem.dev, home, &done)?;
                waited = Some(raw);
            }
        }
    }
    Ok(())
}
