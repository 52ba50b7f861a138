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

#![deny(unsafe_code)]

mod agree;
mod collective;
mod comm;
mod config;
mod exec;
mod fabric;
mod grow;
mod host;
mod id;
mod lock;
mod marker;
mod memory;
mod one_sided;
mod procs;
mod reduce;
mod replay;
mod shm;
mod shrink;
mod sleep;
mod split;
mod stream;
mod symmetric;
mod windows;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use unicomm_core::flight::FlightRecorder;

use unicomm_core::registry::Registry;
use unicomm_core::{Comm, Error, Result};

use exec::RankCtx;
use fabric::{Exchange, LocalFabric};

pub use comm::MockComm;
pub use config::{
    ranks_from_env, Fault, FaultKind, MockConfig, Target, DEFAULT_RANKS, DEFAULT_TIMEOUT,
    MAX_RANKS, MAX_TIMEOUT,
};
pub use grow::init_grown;
pub use host::host_scope;
pub use id::{init_rank, unique_id, MAX_UNJOINED_IDS};
pub use memory::{HostScope, MockMemory};
pub use stream::MockStream;

use comm::{NEXT_DEVICE, NEXT_WORLD};
use unicomm_core::state::{AtomicLife, Life};

/// Creates the `n` ranks of a new world (one communicator per rank; hand each to its own
/// thread, or drive them all from one thread).
pub fn world(n: usize, config: MockConfig) -> Result<Vec<MockComm>> {
    if n == 0 || n > MAX_RANKS {
        return Err(Error::invalid(
            "n",
            format!("{n} ranks: a mock world has 1..={MAX_RANKS} (each rank is threads)"),
        ));
    }
    config.check()?;
    let fabric: Arc<dyn Exchange> = Arc::new(LocalFabric::new(n, config.timeout));
    let world_id = NEXT_WORLD.fetch_add(1, Ordering::Relaxed);
    let rejoin = unicomm_bootstrap::Rejoin::local();
    (0..n)
        .map(|rank| local_rank(fabric.clone(), rank, n, world_id, &config, rejoin.clone()))
        .collect()
}

/// Rank `rank` of `n` on a fabric of this process (buffers in its memory).
pub(crate) fn local_rank(
    fabric: Arc<dyn Exchange>,
    rank: usize,
    n: usize,
    world_id: u64,
    config: &MockConfig,
    rejoin: unicomm_bootstrap::Rejoin,
) -> Result<MockComm> {
    rank_on(fabric, rank, n, world_id, false, config, rejoin)
}

/// Rank `rank` of a world on `fabric`: its buffers in shared memory where `shared`.
fn rank_on(
    fabric: Arc<dyn Exchange>,
    rank: usize,
    n: usize,
    world_id: u64,
    shared: bool,
    config: &MockConfig,
    rejoin: unicomm_bootstrap::Rejoin,
) -> Result<MockComm> {
    Ok(MockComm {
        ctx: Arc::new(RankCtx {
            rank,
            world: n,
            fabric,
            timeout: config.timeout,
            faults: config
                .faults
                .iter()
                .filter(|f| f.rank == rank)
                .copied()
                .collect(),
            flight: FlightRecorder::from_env("world", rank, n)?,
            target: config.target.clone(),
        }),
        shared,
        world_id,
        device: (NEXT_DEVICE.fetch_add(1, Ordering::Relaxed), rank),
        registry: Registry::new(),
        seq: Arc::new(AtomicU64::new(0)),
        issued: Arc::new(AtomicU64::new(0)),
        state: AtomicLife::new(Life::Live),
        rejoin,
        shrinks: AtomicU64::new(0),
        windows: crate::windows::windows(),
        symmetric: crate::symmetric::table::Table::default(),
    })
}

/// Joins a world whose ranks are processes of this machine, one rank per process, as
/// torchrun, mpirun or srun start them (`env`; `unicomm::from_env` calls this for
/// `Vendor::Mock`). Rank 0's process serves the ranks' agreement on 127.0.0.1 (its port and
/// a fresh secret travel in the unique id, over the authenticated rendezvous within
/// `bootstrap_timeout`); buffers live in shared memory (memfd), which the kernel frees with
/// the processes, even killed ones. A rank whose process dies fails the others' waits at
/// once. Every check, deadline and fault of `config` is the threaded mock's. Linux only.
pub fn join(
    env: &unicomm_bootstrap::LaunchEnv,
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
    config.check()?;
    if !cfg!(target_os = "linux") {
        return Err(Error::unsupported(
            "the mock across processes",
            "Linux (memfd shared memory)",
            std::env::consts::OS,
        ));
    }
    let fabric: Arc<dyn Exchange> = if env.rank == 0 {
        let (hub, id) = procs::Hub::start(n, config.timeout)?;
        unicomm_bootstrap::exchange_unique_id(env, || Ok(id.to_bytes()), bootstrap_timeout)?;
        Arc::new(procs::ProcFabric::hub(hub))
    } else {
        let id = unicomm_bootstrap::exchange_unique_id(
            env,
            || Err(Error::invalid("rank", "only rank 0 makes the id")),
            bootstrap_timeout,
        )?;
        let id = procs::HubId::parse(&id)?;
        Arc::new(procs::ProcFabric::client(procs::Client::connect(
            &id,
            env.rank,
            n,
            bootstrap_timeout,
        )?))
    };
    process_rank(
        fabric,
        env.rank,
        n,
        &config,
        unicomm_bootstrap::Rejoin::job(env),
    )
}

/// Rank `rank` of `n` on a fabric that spans processes (buffers in shared memory).
pub(crate) fn process_rank(
    fabric: Arc<dyn Exchange>,
    rank: usize,
    n: usize,
    config: &MockConfig,
    rejoin: unicomm_bootstrap::Rejoin,
) -> Result<MockComm> {
    let world_id = NEXT_WORLD.fetch_add(1, Ordering::Relaxed);
    rank_on(fabric, rank, n, world_id, true, config, rejoin)
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
