//! [`Collective`] for [`ApiComm`]: each operation of the contract, routed (`route.rs`) to
//! the path that runs it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use unicomm_core::flight::FlightRecorder;
use unicomm_core::registry::RegKind;
use unicomm_core::{
    Capabilities, Collective, CommConfig, Op, RawHandle, Result, ShrinkMode, What, Work,
    DEVICE_PATH,
};

use super::enqueue::{lent_elsewhere, order_homes, refuse_lent_capture};
use super::ApiComm;
use crate::copy_engine::region::Region;
use crate::group;
use crate::libcomm::End;
use crate::memory::{ApiMemory, ApiStream};
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
            // Unicomm's expert kernels, where its symmetric kernels load.
            device_counts: self.base.lc.rt.has_kernels()
                && self.base.library.target.symmetric_kernels().is_ok(),
            // The same kernels' high-throughput layout.
            packed_dispatch: self.base.lc.rt.has_kernels()
                && self.base.library.target.symmetric_kernels().is_ok(),
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
        ApiMemory::alloc(&lc.api, lc.rt.clone(), lc.dev, lc.deadline(), bytes)
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
            if let Err(e) = self.ce.share_window(&self.base, h, Region { addr, bytes }) {
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
        self.auto.register(&self.base, &self.ce, mem, offset, bytes)
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

    #[inline(always)]
    fn enqueue(&self, work: Work<'_, ApiMemory<R>>, stream: &ApiStream<R>) -> Result<()> {
        // Each other kind out of line by its own payload: an out-of-line function given
        // the whole `Work` would receive the collective's address too.
        match work {
            Work::Collective(op) => self.enqueue_collective(op, stream),
            Work::Symmetric(op) => self.recorded(op.what(), op.path(), stream, || {
                self.sym.enqueue(&self.base, *op, stream)
            }),
            Work::OneSided(op) => self.recorded(op.what(), "library", stream, || {
                self.one_sided_op(*op, stream)
            }),
            Work::Device(op) => self.recorded(op.what(), DEVICE_PATH, stream, || {
                // The kernel watches the control block's abort word (set before NCCL's
                // abort).
                let control = self.sym.control_address(&self.base)?;
                self.dev.launch(&self.base, control, *op, stream)
            }),
        }
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

    fn create_device_comm(
        &self,
        reqs: &unicomm_core::DeviceCommRequirements,
    ) -> Result<unicomm_core::device_api::DeviceCommParts> {
        self.dev.create(&self.base, reqs)
    }

    fn destroy_device_comm(&self, handle: RawHandle) -> Result<()> {
        self.dev.destroy(&self.base, handle)
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

    fn open_expert_engine(
        &self,
        group: &unicomm_core::symmetric::ExpertGroupParts,
    ) -> Result<RawHandle> {
        self.sym.engines.open(&self.base, group)
    }

    fn close_expert_engine(&self, handle: RawHandle) -> Result<()> {
        self.sym.engines.close(&self.base, handle)
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
    /// A collective: routed once, recorded once.
    #[inline]
    fn enqueue_collective(&self, op: &Op<'_, ApiMemory<R>>, stream: &ApiStream<R>) -> Result<()> {
        let what = op.what();
        let homes = lent_elsewhere(op, stream);
        if homes {
            refuse_lent_capture(op)?;
        }
        self.flight.enqueued(
            what,
            stream.raw() as u64,
            || self.enqueue_op(op, stream),
            || unicomm_core::DeviceStream::record(stream).ok(),
        )?;
        if homes {
            order_homes(&self.base.lc.rt, op, stream)?;
        }
        Ok(())
    }

    /// Work that is not a collective, recorded once as a collective is: unicomm's symmetric
    /// kernels, the one-sided calls, the device-API kernel (out of line: rare on the path
    /// of every call).
    #[cold]
    #[inline(never)]
    fn recorded(
        &self,
        what: What,
        path: &'static str,
        stream: &ApiStream<R>,
        run: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        self.flight.enqueued(
            what,
            stream.raw() as u64,
            || run().map(|()| path),
            || unicomm_core::DeviceStream::record(stream).ok(),
        )
    }
}
