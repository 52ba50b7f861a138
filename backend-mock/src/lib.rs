//! unicomm's CPU backend: ranks are threads of one process ([`world`]) or processes of one
//! machine ([`join`], Linux: buffers in shared memory), "device" memory is host memory, and
//! every collective moves and reduces real bytes.
//!
//! It is a test double with teeth, not a stub:
//! - collectives run asynchronously on per-stream worker threads, so errors of the work
//!   surface at `synchronize`, as on a GPU;
//! - ranks check that they agree on each collective (operation, count, type, reduction,
//!   root, and registration all-or-none) and return [`Error::Mismatch`] instead of hanging or
//!   computing garbage;
//! - registration is bookkept as NCCL keeps it (deregistering twice or another
//!   communicator's handle is an error; a buffer partly covered by a registration is an
//!   error);
//! - every wait has a deadline ([`MockConfig::timeout`]); faults can be injected
//!   ([`Fault`]: a rank that fails, a rank that never arrives) so that timeout paths are
//!   tested.
//!
//! Semantics that are NCCL's, not the mock's choice: reductions (`unicomm_core::ReduceOp`),
//! in-place layouts, per-peer all-to-all counts. Where the mock is more permissive than
//! NCCL: collectives issued by one thread for several ranks without a group do not deadlock
//! (NCCL requires a group there).

mod config;
mod exec;
mod fabric;
mod memory;
mod procs;
mod reduce;
mod shm;
mod stream;

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use unicomm_core::registry::{RegKind, Registry};
use unicomm_core::{
    Capabilities, Collective, Comm, DataType, DeviceMemory, Error, Extent, Kind, Op, RawHandle,
    Result, Slice, Version,
};

use exec::{RankCtx, Span, Spec, Task, Work};
use fabric::{Exchange, LocalFabric, Signature};

pub use config::{
    ranks_from_env, Fault, FaultKind, MockConfig, DEFAULT_RANKS, DEFAULT_TIMEOUT, MAX_RANKS,
    MAX_TIMEOUT,
};
pub use memory::MockMemory;
pub use stream::MockStream;

static NEXT_WORLD: AtomicU64 = AtomicU64::new(1);

/// Registration handles are unique in the process, so another communicator's handle is
/// never mistaken for one of this one's (it is not in this registry: an error).
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(1);

const LIVE: u8 = 0;
const FINALIZED: u8 = 1;
const ABORTED: u8 = 2;

/// One rank of a mock world.
pub struct MockComm {
    ctx: Arc<RankCtx>,
    /// Ranks in different processes: allocations go to shared memory.
    shared: bool,
    world_id: u64,
    registry: Registry,
    /// Collective sequence number: ranks that issue the same collectives in the same order
    /// (NCCL's rule) meet in the same fabric slot.
    seq: AtomicU64,
    /// Operations enqueued so far (the index faults refer to).
    issued: AtomicU64,
    state: AtomicU8,
}

impl std::fmt::Debug for MockComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockComm")
            .field("world", &self.world_id)
            .field("rank", &self.ctx.rank)
            .field("world_size", &self.ctx.world)
            .finish()
    }
}

/// Creates the `n` ranks of a new world (one communicator per rank; hand each to its own
/// thread, or drive them all from one thread).
pub fn world(n: usize, config: MockConfig) -> Result<Vec<MockComm>> {
    if n == 0 || n > MAX_RANKS {
        return Err(Error::invalid(
            "n",
            format!("{n} ranks: a mock world has 1..={MAX_RANKS} (each rank is threads)"),
        ));
    }
    if config.timeout.is_zero() || config.timeout > MAX_TIMEOUT {
        return Err(Error::invalid(
            "timeout",
            format!("{:?} is outside 1 ms..=1 day", config.timeout),
        ));
    }
    let fabric: Arc<dyn Exchange> = Arc::new(LocalFabric::new(n, config.timeout));
    let world_id = NEXT_WORLD.fetch_add(1, Ordering::Relaxed);
    Ok((0..n)
        .map(|rank| MockComm {
            ctx: Arc::new(RankCtx {
                rank,
                world: n,
                fabric: fabric.clone(),
                timeout: config.timeout,
                faults: config
                    .faults
                    .iter()
                    .filter(|f| f.rank == rank)
                    .copied()
                    .collect(),
            }),
            shared: false,
            world_id,
            registry: Registry::new(),
            seq: AtomicU64::new(0),
            issued: AtomicU64::new(0),

            state: AtomicU8::new(LIVE),
        })
        .collect())
}

/// Joins a world whose ranks are processes of this machine, one rank per process, as
/// torchrun, mpirun or srun start them (`env`; `unicomm::from_env` calls this for
/// `Vendor::Mock`). Rank 0's process serves the ranks' agreement on 127.0.0.1 (its port and
/// a fresh secret travel in the unique id, over the authenticated rendezvous within
/// `bootstrap_timeout`); buffers live in shared memory (memfd), which the kernel frees with
/// the processes, even killed ones. A rank whose process dies fails the others' waits at
/// once. Every check, deadline and fault of `config` is the threaded mock's. Linux only.
pub fn join(
    env: &unicomm_core::bootstrap::LaunchEnv,
    config: MockConfig,
    bootstrap_timeout: Duration,
) -> Result<MockComm> {
    let n = env.world_size;
    if n == 0 || n > MAX_RANKS || env.rank >= n {
        return Err(Error::invalid(
            "WORLD_SIZE",
            format!(
                "rank {} of {n}: a mock world has 1..={MAX_RANKS} ranks",
                env.rank
            ),
        ));
    }
    if config.timeout.is_zero() || config.timeout > MAX_TIMEOUT {
        return Err(Error::invalid(
            "timeout",
            format!("{:?} is outside 1 ms..=1 day", config.timeout),
        ));
    }
    if !cfg!(target_os = "linux") {
        return Err(Error::unsupported(
            "the mock across processes",
            "Linux (memfd shared memory)",
            std::env::consts::OS,
        ));
    }
    let fabric: Arc<dyn Exchange> = if env.rank == 0 {
        let (hub, id) = procs::Hub::start(n, config.timeout)?;
        unicomm_core::bootstrap::exchange_unique_id(env, || Ok(id.to_bytes()), bootstrap_timeout)?;
        Arc::new(procs::ProcFabric::hub(hub))
    } else {
        let id = unicomm_core::bootstrap::exchange_unique_id(
            env,
            || Err(Error::invalid("rank", "only rank 0 makes the id")),
            bootstrap_timeout,
        )?;
        let id = procs::HubId::parse(&id)?;
        Arc::new(procs::ProcFabric::client(procs::Client::connect(
            &id,
            env.rank,
            bootstrap_timeout,
        )?))
    };
    Ok(MockComm {
        ctx: Arc::new(RankCtx {
            rank: env.rank,
            world: n,
            fabric,
            timeout: config.timeout,
            faults: config
                .faults
                .iter()
                .filter(|f| f.rank == env.rank)
                .copied()
                .collect(),
        }),
        shared: true,
        world_id: NEXT_WORLD.fetch_add(1, Ordering::Relaxed),
        registry: Registry::new(),
        seq: AtomicU64::new(0),
        issued: AtomicU64::new(0),
        state: AtomicU8::new(LIVE),
    })
}

/// `n` typed communicators with the default configuration and `UNICOMM_MOCK_TIMEOUT_MS`.
pub fn local_comms(n: usize) -> Result<Vec<Comm<MockComm>>> {
    local_comms_with(n, MockConfig::from_env()?)
}

/// `n` typed communicators with `config`.
pub fn local_comms_with(n: usize, config: MockConfig) -> Result<Vec<Comm<MockComm>>> {
    Ok(world(n, config)?
        .into_iter()
        .map(Comm::from_backend)
        .collect())
}

/// This thread's open group: its depth, and the operations held until the group ends.
struct Group {
    depth: usize,
    pending: Vec<(Arc<stream::Inner>, Task)>,
}

thread_local! {
    static GROUP: RefCell<Group> = const { RefCell::new(Group { depth: 0, pending: Vec::new() }) };
}

fn overlap(a: &Slice<'_, MockMemory>, b: &Slice<'_, MockMemory>) -> bool {
    Arc::ptr_eq(&a.mem.inner, &b.mem.inner)
        && a.bytes != 0
        && b.bytes != 0
        && a.offset < b.offset + b.bytes
        && b.offset < a.offset + a.bytes
}

/// Out of place, or in place exactly at `recv + at` (NCCL's layouts); nothing in between.
fn placement(
    send: &Slice<'_, MockMemory>,
    recv: &Slice<'_, MockMemory>,
    at: Option<usize>,
) -> Result<()> {
    if !overlap(send, recv) {
        return Ok(());
    }
    match at {
        Some(at) if send.offset == recv.offset + at => Ok(()),
        _ => Err(Error::invalid(
            "recv",
            "overlaps send without being NCCL's in-place layout",
        )),
    }
}

impl MockComm {
    fn owner(&self) -> (u64, usize) {
        (self.world_id, self.ctx.rank)
    }

    fn live(&self) -> Result<()> {
        match self.state.load(Ordering::Acquire) {
            LIVE => match self.ctx.fabric.poisoned() {
                Some(e) => Err(e),
                None => Ok(()),
            },
            FINALIZED => Err(Error::invalid("comm", "the communicator was finalized")),
            _ => Err(Error::Aborted {
                reason: "the communicator was aborted".into(),
            }),
        }
    }

    fn span(&self, s: &Slice<'_, MockMemory>, write: bool) -> Span {
        Span {
            alloc: s.mem.inner.clone(),
            offset: s.offset,
            write,
        }
    }

    fn reg(&self, s: &Slice<'_, MockMemory>, bytes: usize) -> Result<Option<RegKind>> {
        self.registry.covering(s.address(), bytes)
    }

    /// Lowers one operation to the mock's work: checked against its shape and this rank's
    /// memory, with NCCL's in-place layouts, registration looked up now (as NCCL does at
    /// the call), and the next sequence number for collectives.
    fn work(&self, op: Op<'_, MockMemory>) -> Result<Work> {
        let (w, rank) = (self.ctx.world, self.ctx.rank);
        op.check(w)?;
        for s in op.send.iter().chain(op.recv.iter()) {
            if s.mem.inner.owner != self.owner() {
                return Err(foreign_memory(s.mem, self.owner()));
            }
        }
        let (count, dtype) = (op.count, op.dtype);
        match (op.kind, op.send, op.recv) {
            (Kind::Send { peer }, Some(buf), _) => {
                return Ok(Work::Send {
                    span: self.span(&buf, false),
                    count,
                    dtype,
                    peer,
                })
            }
            (Kind::Recv { peer }, _, Some(buf)) => {
                return Ok(Work::Recv {
                    span: self.span(&buf, true),
                    count,
                    dtype,
                    peer,
                })
            }
            _ => {}
        }
        let b = count * dtype.size();
        if let (Some(s), Some(r)) = (&op.send, &op.recv) {
            // Out of place, or in place exactly as NCCL lays it out.
            match op.kind {
                Kind::AllGather => placement(s, r, Some(rank * b))?,
                Kind::ReduceScatter { .. } => placement(r, s, Some(rank * b))?,
                Kind::AllToAll => placement(s, r, None)?,
                _ => placement(s, r, Some(0))?,
            }
        }
        // `op.check` proved these products fit the ranges, so they do not overflow.
        let (se, re) = op.kind.extents();
        let bytes = |e: Extent| e.elems(count, w).unwrap_or(0) * dtype.size();
        let send_reg = op
            .send
            .map(|s| self.reg(&s, bytes(se)))
            .transpose()?
            .flatten();
        let recv_reg = op
            .recv
            .map(|r| self.reg(&r, bytes(re)))
            .transpose()?
            .flatten();
        let same = matches!((&op.send, &op.recv), (Some(s), Some(r)) if Arc::ptr_eq(&s.mem.inner, &r.mem.inner));
        let barrier = op.kind == Kind::Barrier;
        Ok(Work::Coll {
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            sig: Signature {
                kind: op.kind.name(),
                count,
                dtype: (!barrier).then_some(dtype),
                op: op.kind.reduction(),
                root: op.kind.rank_arg().map(|(r, _)| r),
                send_reg,
                recv_reg,
            },
            spec: Spec {
                kind: op.kind,
                count,
                dtype,
            },
            // An in-place op locks its one allocation once, for writing.
            send: op.send.map(|s| self.span(&s, same)),
            recv: op.recv.map(|r| self.span(&r, true)),
        })
    }

    /// A collective the host waits for (window registration is one in NCCL).
    fn blocking_collective(&self, kind: &'static str, bytes: usize) -> Result<()> {
        self.live()?;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let sig = Signature {
            kind,
            count: bytes,
            dtype: None,
            op: None,
            root: None,
            send_reg: None,
            recv_reg: None,
        };
        exec::run_coll(
            &self.ctx,
            seq,
            &sig,
            Spec {
                kind: Kind::Barrier,
                count: 0,
                dtype: DataType::U8,
            },
            None,
            None,
        )
    }
}

fn foreign_memory(mem: &MockMemory, me: (u64, usize)) -> Error {
    let (world, rank) = mem.inner.owner;
    Error::invalid(
        "buffer",
        format!(
            "memory of rank {rank} of mock world {world}, used by rank {} of world {}",
            me.1, me.0
        ),
    )
}

impl Drop for MockComm {
    fn drop(&mut self) {
        // A rank that goes away without finalizing (it panicked, or its owner dropped it)
        // tells its peers at once instead of leaving them to their deadline.
        if self.state.load(Ordering::Acquire) == LIVE {
            self.ctx.fabric.poison(Error::Aborted {
                reason: format!(
                    "rank {} dropped its communicator without finalizing{}",
                    self.ctx.rank,
                    if std::thread::panicking() {
                        " (it panicked)"
                    } else {
                        ""
                    }
                ),
            });
        }
    }
}

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
        self.live()?;
        if stream.owner != self.owner() {
            return Err(Error::invalid(
                "stream",
                format!(
                    "a stream of rank {} used by rank {}",
                    stream.owner.1, self.ctx.rank
                ),
            ));
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

    fn finalize(&mut self) -> Result<()> {
        self.live()?;
        self.state.store(FINALIZED, Ordering::Release);
        // Across processes rank 0 serves the others until they finalized too.
        self.ctx.fabric.depart(self.ctx.timeout)
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.ctx.timeout)
    }

    fn abort(&self) -> Result<()> {
        self.state.store(ABORTED, Ordering::Release);
        // Peers blocked in a collective with this rank learn of it now, not at their deadline.
        self.ctx.fabric.poison(Error::Aborted {
            reason: format!("rank {} aborted the communicator", self.ctx.rank),
        });
        Ok(())
    }
}
