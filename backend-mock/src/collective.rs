//! [`Collective`] for [`MockComm`]: each operation of the contract, checked across the
//! ranks and run on the stream's worker.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use unicomm_core::registry::RegKind;
use unicomm_core::{
    Capabilities, Collective, CommConfig, DeviceMemory, Error, Op, RawHandle, Result, ShrinkMode,
    Version, Zeros,
};

use crate::comm::*;
use crate::exec;
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
        Capabilities {
            backend: "mock",
            library_path: "built-in".into(),
            version: Version::new(
                env!("CARGO_PKG_VERSION_MAJOR").parse().unwrap_or(0),
                env!("CARGO_PKG_VERSION_MINOR").parse().unwrap_or(0),
                env!("CARGO_PKG_VERSION_PATCH").parse().unwrap_or(0),
            ),
            registration: true,
            windows: true,
            native_all_to_all: true,
            graph_capture: false,
            mem_alloc: true,
            copy_engine: false,
            native_split: true,
            native_gather_scatter: true,
            native_all_to_all_v: false,
            fp8_reduce: true,
            pre_mul_sum: true,
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
        self.check_memory(mem)?;
        memory::check_range(mem.byte_len(), offset, bytes, "bytes")?;
        // Collective, and every rank must offer the same size (the signature's count).
        self.blocking_collective("WindowRegister", bytes)?;
        let h = RawHandle(NEXT_HANDLE.fetch_add(1, Ordering::Relaxed));
        self.registry
            .insert(h, mem.address() + offset, bytes, RegKind::Window)?;
        Ok(h)
    }

    fn deregister_window(&self, handle: RawHandle) -> Result<()> {
        self.registry.check(handle, RegKind::Window)?;
        self.blocking_collective("WindowDeregister", 0)?;
        self.registry.remove(handle, RegKind::Window)
    }

    fn enqueue(&self, op: Op<'_, MockMemory>, stream: &MockStream) -> Result<()> {
        let what = (op.kind, op.count, op.dtype);
        let path = if op.kind.is_var() { "lowered" } else { "mock" };
        self.ctx.flight.enqueued(
            what,
            Arc::as_ptr(&stream.inner) as u64,
            || self.enqueue_op(op, stream).map(|()| path),
            || unicomm_core::DeviceStream::record(stream).ok(),
        )
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
            if let Err(e) = s.push(Box::new(move || exec::run_batch(tasks))) {
                result = result.and(Err(e));
            }
        }
        result
    }

    fn split(&self, color: Option<u32>, key: i32, config: &CommConfig) -> Result<Option<Self>> {
        self.split_comm(color, key, config)
    }

    fn finalize(&mut self) -> Result<()> {
        self.live()?;
        self.state.store(FINALIZED, Ordering::Release);
        // Across processes rank 0 serves the others until they finalized too.
        let joined = self.seq.load(Ordering::Relaxed);
        self.ctx
            .fabric
            .depart(self.ctx.rank, joined, self.ctx.timeout)
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.ctx.timeout)
    }

    fn abort(&self) -> Result<()> {
        self.abort_comm();
        Ok(())
    }

    fn shrink(&self, exclude: &[usize], mode: ShrinkMode, config: &CommConfig) -> Result<Self> {
        self.shrink_comm(exclude, mode, config)
    }
}

impl MockComm {
    /// One operation, as the flight recorder's caller records it once (a lowered one's
    /// parts are not recorded again).
    fn enqueue_op(&self, op: Op<'_, MockMemory>, stream: &MockStream) -> Result<()> {
        self.live()?;
        if stream.owner != self.owner() {
            return Err(Error::invalid(
                "stream",
                format!(
                    "a stream of device {} (rank {}) used on device {} (rank {})",
                    stream.owner.0, stream.owner.1, self.device.0, self.ctx.rank
                ),
            ));
        }
        if op.kind.is_var() {
            // No library has these whole (RCCL's all-to-all-v aside): the mock runs what
            // NCCL's path runs, a group of send/recv, broadcasts or reduces, keeping the
            // empty ones so that ranks that disagree on a count report `Mismatch`.
            op.check(self.ctx.rank, self.ctx.world)?;
            let ops = op.lower(self.ctx.rank, self.ctx.world, Zeros::Keep)?;
            return unicomm_core::backend::grouped(self, || {
                ops.into_iter().try_for_each(|o| self.enqueue_op(o, stream))
            });
        }
        let work = self.work(op)?;
        let task = Task {
            ctx: self.ctx.clone(),
            index: self.issued.fetch_add(1, Ordering::Relaxed),
            work,
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
            Some(task) => stream.push(Box::new(move || exec::run_batch(vec![task]))),
            None => Ok(()),
        }
    }
}
