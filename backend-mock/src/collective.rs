//! [`Collective`] for [`MockComm`]: each operation of the contract, checked across the
//! ranks and run on the stream's worker.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use unicomm_core::registry::RegKind;
use unicomm_core::state::Life;
use unicomm_core::{
    Capabilities, Collective, CommConfig, DeviceMemory, Error, Op, RawHandle, Result, ShrinkMode,
    Version, Work, Zeros,
};

use crate::comm::*;
use crate::exec::Task;
use crate::memory;
use crate::memory::MockMemory;
use crate::stream::{self, MockStream};

impl Collective for MockComm {
    type Stream = MockStream;
    type Memory = MockMemory;

    fn rank(&self) -> usize {
        self.ctx.rank
    }

    fn world_size(&self) -> usize {
        self.ctx.world
    }

    fn device_info(&self) -> Result<unicomm_core::DeviceInfo> {
        Ok(unicomm_core::DeviceInfo {
            index: None,
            name: "host memory (mock)".into(),
            pci_bus_id: None,
        })
    }

    fn capabilities(&self) -> Capabilities {
        let t = &self.ctx.target;
        Capabilities {
            backend: "mock",
            library_path: "built-in".into(),
            version: Version::new(
                env!("CARGO_PKG_VERSION_MAJOR").parse().unwrap_or(0),
                env!("CARGO_PKG_VERSION_MINOR").parse().unwrap_or(0),
                env!("CARGO_PKG_VERSION_PATCH").parse().unwrap_or(0),
            ),
            // What the target has (the mock runs all of it either way).
            registration: t.registration().is_ok(),
            windows: t.windows().is_ok(),
            native_all_to_all: true,
            graph_capture: true,
            mem_alloc: t.mem_alloc(),
            copy_engine: false,
            native_split: t.native_split(),
            native_gather_scatter: t.native_gather_scatter(),
            native_all_to_all_v: t.native_all_to_all_v(),
            fp8_reduce: t.fp8_reduce().is_ok(),
            pre_mul_sum: t.pre_mul_sum().is_ok(),
            device_counts: t.symmetric_kernels().is_ok(),
            packed_dispatch: t.symmetric_kernels().is_ok(),
        }
    }

    fn create_stream(&self) -> Result<MockStream> {
        self.live()?;
        // Longer than an operation's own deadline, so that a stuck operation reports its own
        // timeout (naming the ranks that never arrived) before the stream gives up on it.
        MockStream::new(
            self.owner(),
            self.ctx.timeout * 2 + Duration::from_millis(100),
        )
    }

    /// Every priority is accepted and none has an effect: the mock's streams are threads.
    fn create_stream_with(&self, _priority: unicomm_core::StreamPriority) -> Result<MockStream> {
        self.create_stream()
    }

    fn alloc(&self, bytes: usize) -> Result<MockMemory> {
        self.live()?;
        MockMemory::new(bytes, self.owner(), self.shared)
    }

    fn check_memory(&self, mem: &MockMemory) -> Result<()> {
        if mem.inner.owner == self.owner() {
            Ok(())
        } else {
            Err(foreign_memory(mem, self.owner()))
        }
    }

    fn register(&self, mem: &MockMemory, offset: usize, bytes: usize) -> Result<RawHandle> {
        self.live()?;
        self.ctx.target.registration()?;
        self.check_memory(mem)?;
        memory::check_range(mem.byte_len(), offset, bytes, "bytes")?;
        let h = RawHandle(NEXT_HANDLE.fetch_add(1, Ordering::Relaxed));
        self.registry
            .insert(h, mem.address() + offset, bytes, RegKind::Buffer)?;
        Ok(h)
    }

    fn deregister(&self, handle: RawHandle) -> Result<()> {
        self.registry.remove(handle, RegKind::Buffer)
    }

    fn register_window(&self, mem: &MockMemory, offset: usize, bytes: usize) -> Result<RawHandle> {
        self.ctx.target.windows()?;
        self.window(mem, offset, bytes, RegKind::Window)
    }

    fn register_auto(&self, mem: &MockMemory, offset: usize, bytes: usize) -> Result<RawHandle> {
        // As the NCCL-API backends: a buffer registration on a second communicator beside
        // a window where the library has windows, so the floor is registration's.
        let t = &self.ctx.target;
        t.since(
            "automatic registration (ncclCommRegister)",
            t.flavor.registration_since,
        )?;
        self.window(mem, offset, bytes, RegKind::Auto)
    }

    fn deregister_auto(&self, handle: RawHandle) -> Result<()> {
        self.unwindow(handle, RegKind::Auto)
    }

    fn deregister_window(&self, handle: RawHandle) -> Result<()> {
        self.unwindow(handle, RegKind::Window)
    }

    fn enqueue(&self, work: Work<'_, MockMemory>, stream: &MockStream) -> Result<()> {
        let what = work.what();
        let stream_id = Arc::as_ptr(&stream.inner) as u64;
        let mark = || unicomm_core::DeviceStream::record(stream).ok();
        // The routes' one vocabulary: the mock's own call is the library's it stands for.
        use unicomm_nccl_api::policy::Taken;
        match work {
            Work::Collective(op) => {
                let path = match op.kind.is_var() {
                    true => Taken::Lowered,
                    false => Taken::Library,
                }
                .name();
                let run = || self.enqueue_op(*op, stream).map(|()| path);
                self.ctx.flight.enqueued(what, stream_id, run, mark)
            }
            work => {
                let run = || self.enqueue_other(work, stream);
                self.ctx.flight.enqueued(what, stream_id, run, mark)
            }
        }
    }

    fn alloc_symmetric(
        &self,
        bytes: usize,
        lamport: Option<unicomm_core::DataType>,
    ) -> Result<unicomm_core::symmetric::SymmetricParts<MockMemory>> {
        self.alloc_symmetric_mem(bytes, lamport)
    }

    fn free_symmetric(&self, handle: RawHandle) -> Result<()> {
        self.free_symmetric_mem(handle)
    }

    fn flight(&self) -> Option<&Arc<unicomm_core::flight::FlightRecorder>> {
        Some(&self.ctx.flight)
    }

    fn group_start(&self) -> Result<()> {
        GROUP.with(|g| g.borrow_mut().depth += 1);
        Ok(())
    }

    fn group_end(&self) -> Result<()> {
        let pending = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            if g.depth == 0 {
                return Err(Error::invalid(
                    "group_end",
                    "no group is open on this thread",
                ));
            }
            g.depth -= 1;
            Ok(if g.depth == 0 {
                std::mem::take(&mut g.pending)
            } else {
                Vec::new()
            })
        })?;
        // One batch per stream, in the order the streams were first used.
        let mut batches: Vec<(Arc<stream::Inner>, Vec<Task>)> = Vec::new();
        for (s, t) in pending {
            match batches.iter_mut().find(|(b, _)| Arc::ptr_eq(b, &s)) {
                Some((_, v)) => v.push(t),
                None => batches.push((s, vec![t])),
            }
        }
        let mut result = Ok(());
        for (s, tasks) in batches {
            if let Err(e) = crate::replay::enqueue_batch(&s, tasks) {
                result = result.and(Err(e));
            }
        }
        result
    }

    fn split(&self, color: Option<u32>, key: i32, config: &CommConfig) -> Result<Option<Self>> {
        self.ctx.target.check_config(config)?;
        self.split_comm(color, key, config)
    }

    fn finalize(&mut self) -> Result<()> {
        // A suspended communicator is finalized as a live one.
        let _ = self.state.compare_exchange(Life::Suspended, Life::Live);
        self.live()?;
        self.state.store(Life::Finalized);
        // Across processes rank 0 serves the others until they finalized too.
        let joined = self.seq.load(Ordering::Relaxed);
        self.ctx
            .fabric
            .depart(self.ctx.rank, joined, self.ctx.timeout)
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.ctx.timeout)
    }

    fn properties(&self) -> Result<unicomm_core::Properties> {
        self.properties_comm()
    }

    fn suspend(&self) -> Result<()> {
        self.suspend_comm()
    }

    fn resume(&self) -> Result<()> {
        self.resume_comm()
    }

    fn mem_stats(&self) -> Result<unicomm_core::MemStats> {
        self.mem_stats_comm()
    }

    fn abort(&self) -> Result<()> {
        self.abort_comm();
        Ok(())
    }

    fn shrink(&self, exclude: &[usize], mode: ShrinkMode, config: &CommConfig) -> Result<Self> {
        self.ctx.target.check_config(config)?;
        self.shrink_comm(exclude, mode, config)
    }

    fn grow_id(&self) -> Result<[u8; 128]> {
        self.grow_id_comm()
    }

    fn grow(&self, world: usize, id: Option<&[u8; 128]>, config: &CommConfig) -> Result<Self> {
        self.ctx.target.check_config(config)?;
        self.grow_comm(world, id, config)
    }
}

impl MockComm {
    /// The work that is not a collective, and the path it took: the symmetric kernels by
    /// their algorithm, the one-sided calls as the library's; the device-API kernel needs
    /// NCCL's device API, which the mock does not have.
    fn enqueue_other(
        &self,
        work: Work<'_, MockMemory>,
        stream: &MockStream,
    ) -> Result<&'static str> {
        let path = work.path();
        match work {
            Work::Symmetric(op) => self.symmetric_enqueue(*op, stream),
            Work::OneSided(op) => self.one_sided_op(*op, stream),
            other => Err(other.unsupported(self.capabilities().backend)),
        }
        .map(|()| path)
    }

    /// A window's registration (collective: every rank offers the same size, the
    /// signature's count).
    fn window(
        &self,
        mem: &MockMemory,
        offset: usize,
        bytes: usize,
        kind: RegKind,
    ) -> Result<RawHandle> {
        self.check_memory(mem)?;
        memory::check_range(mem.byte_len(), offset, bytes, "bytes")?;
        self.blocking_collective("WindowRegister", bytes)?;
        let h = RawHandle(NEXT_HANDLE.fetch_add(1, Ordering::Relaxed));
        self.registry
            .insert(h, mem.address() + offset, bytes, kind)?;
        let part = crate::windows::Part {
            alloc: mem.inner.clone(),
            offset,
        };
        self.windows.add(h, part, bytes);
        Ok(h)
    }

    /// Ends a window or an automatic registration (collective, as it began).
    fn unwindow(&self, handle: RawHandle, kind: RegKind) -> Result<()> {
        self.registry.check(handle, kind)?;
        self.blocking_collective("WindowDeregister", 0)?;
        self.windows.remove(handle);
        self.registry.remove(handle, kind)
    }

    /// One operation, as the flight recorder's caller records it once (a lowered one's
    /// parts are not recorded again).
    fn enqueue_op(&self, op: Op<'_, MockMemory>, stream: &MockStream) -> Result<()> {
        self.live()?;
        self.check_stream(stream)?;
        // What the target refuses, refused here in its words (fp8 reductions, NCCL's
        // one-rank path, scaled sums before 2.11).
        self.ctx
            .target
            .check_op(self.ctx.world, op.kind, op.dtype)?;
        if let Some(unicomm_core::ReduceOp::PreMulSum(_)) = op.kind.reduction() {
            self.ctx.target.pre_mul_sum()?;
        }
        if op.options.is_some() {
            // Per-call options as the target takes them; the mock has no CTAs or algorithms
            // to apply them to (the results are the same either way).
            self.ctx.target.call_options(op.kind)?;
        }
        if op.kind == unicomm_core::Kind::AllGather {
            // Checked before the window test's arithmetic (a caller's count can overflow it;
            // `work` checks every other kind).
            op.check(self.ctx.rank, self.ctx.world)?;
            let (send, recv) = op.pair()?;
            // NCCL-API's one rule, asked of what the call runs through: a window, not an
            // automatic registration (NCCL-API's built-in policy never routes an all-gather
            // through the window: registered, then the copy engines).
            self.ctx.target.window_all_gather(
                self.ctx.rank,
                self.ctx.world,
                send.address(),
                recv.address(),
                op.count * op.dtype.size(),
                |at, bytes| {
                    let k = self.registry.covering(at, bytes)?;
                    Ok(k.filter(|&k| k == RegKind::Window))
                },
            )?;
        }
        if op.kind.is_var() {
            // No library has these whole (RCCL's all-to-all-v aside): the mock runs what
            // NCCL's path runs, a group of send/recv, broadcasts or reduces, keeping the
            // empty ones so that ranks that disagree on a count report `Mismatch`.
            op.check(self.ctx.rank, self.ctx.world)?;
            // Not while capturing (as NCCL's check): the agreement reads the gathered
            // layouts on the host, which a replay cannot do; the warm-up pass before the
            // capture agreed on the same counts.
            if self.ctx.world > 1
                && GROUP.with(|g| g.borrow().depth == 0)
                && !stream.inner.capturing()
            {
                self.agree_layout(&op, stream)?;
            }
            let ops = op.lower(self.ctx.rank, self.ctx.world, Zeros::Keep)?;
            return unicomm_core::backend::grouped(self, || {
                ops.into_iter().try_for_each(|o| self.enqueue_op(o, stream))
            });
        }
        if let Some(m) = op.options.as_ref().and_then(|o| o.launch_marker.as_ref()) {
            self.mark_launch(m, stream)?;
        }
        self.enqueue_task(op, false, stream)
    }

    /// Arms a call's launch marker and reaches it when the stream's worker begins the call
    /// (the job right before it). Refused in a group and in a capture, as on NCCL.
    #[cold]
    fn mark_launch(&self, m: &unicomm_core::LaunchMarker, stream: &MockStream) -> Result<()> {
        if GROUP.with(|g| g.borrow().depth > 0) || stream.inner.capturing() {
            return Err(unicomm_core::LaunchMarker::refused_here());
        }
        let mark = crate::marker::MockMarker::of(m.marker())?;
        let point = mark.arm();
        stream.push(Box::new(move || {
            mark.reach(point);
            Ok(())
        }))
    }

    /// The mock's own collective (the ranks' agreement on a layout), outside the count of
    /// the rank's operations that injected faults name; never inside a group.
    pub(crate) fn enqueue_internal(
        &self,
        op: Op<'_, MockMemory>,
        stream: &MockStream,
    ) -> Result<()> {
        self.enqueue_task(op, true, stream)
    }

    fn enqueue_task(
        &self,
        op: Op<'_, MockMemory>,
        internal: bool,
        stream: &MockStream,
    ) -> Result<()> {
        let work = self.work(op)?;
        self.enqueue_work(work, internal, stream)
    }

    /// One task of `work` on `stream`, or held by this thread's open group.
    pub(crate) fn enqueue_work(
        &self,
        work: crate::exec::Work,
        internal: bool,
        stream: &MockStream,
    ) -> Result<()> {
        let index = match internal {
            true => u64::MAX,
            false => self.issued.fetch_add(1, Ordering::Relaxed),
        };
        let task = Task {
            ctx: self.ctx.clone(),
            index,
            work,
            counters: (self.seq.clone(), self.issued.clone()),
        };
        let grouped = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            if g.depth > 0 {
                g.pending.push((stream.inner.clone(), task));
                None
            } else {
                Some(task)
            }
        });
        match grouped {
            Some(task) => crate::replay::enqueue_batch(&stream.inner, vec![task]),
            None => Ok(()),
        }
    }
}
