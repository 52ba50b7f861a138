//! `grow` on the mock (`ncclCommGrow`'s semantics, gated as the target's NCCL 2.29.2): the
//! ranks of a world and the new ones meet on a fresh fabric, the existing ranks keeping
//! their numbers and their "device" (their streams and memory serve both communicators).
//!
//! - A world of this process (`local_comms`, `world`) grows with new ranks in this process:
//!   the id names an entry of this process's table (and the process), whose fabric the first
//!   rank to arrive makes for the size it names; an id from another process is refused.
//! - A world of processes (`join`, `init_rank`) grows as a new world of processes: the id is
//!   a hub's, served by rank 0's process, and the new ranks join it as `init_rank` would.
//!
//! Rank 0 makes the id; the other existing ranks learn it from rank 0 over the world itself
//! (NCCL's non-root ranks pass none), so that every rank joins the same world.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use unicomm_core::{CommConfig, Error, Result};

use crate::comm::{MockComm, NEXT_WORLD};
use crate::config::MockConfig;
use crate::fabric::{Exchange, LocalFabric};
use crate::MAX_RANKS;

/// The tag of a grow id of a world in one process (a hub's id never starts with it).
const LOCAL_TAG: &[u8; 8] = b"ucmgrow\0";

/// A grown world of this process until every rank took its fabric: the size the first
/// rank named, and once it arrived the fabric, its world number and the ranks still to
/// come.
struct Pending {
    made: Option<(Arc<dyn Exchange>, u64, usize, usize)>,
}

static PENDING: Mutex<Option<HashMap<u64, Pending>>> = Mutex::new(None);

/// A local grow id: the tag, this process's id and the table's key.
fn local_id(key: u64) -> [u8; 128] {
    let mut b = [0u8; 128];
    b[..8].copy_from_slice(LOCAL_TAG);
    b[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    b[12..20].copy_from_slice(&key.to_le_bytes());
    b
}

/// The key of a local grow id; `None` for another kind of id.
fn local_key(id: &[u8; 128]) -> Result<Option<u64>> {
    if &id[..8] != LOCAL_TAG {
        return Ok(None);
    }
    let pid = u32::from_le_bytes(id[8..12].try_into().unwrap_or([0; 4]));
    if pid != std::process::id() {
        return Err(Error::invalid(
            "id",
            format!("a grow id of a world of threads in process {pid}: its new ranks join in that process"),
        ));
    }
    Ok(Some(u64::from_le_bytes(
        id[12..20].try_into().unwrap_or([0; 8]),
    )))
}

/// This rank's fabric of the local grown world `key` of `world` ranks, and its number.
fn take_local(
    key: u64,
    world: usize,
    timeout: std::time::Duration,
) -> Result<(Arc<dyn Exchange>, u64)> {
    let mut table = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    let table = table.get_or_insert_with(HashMap::new);
    let Some(p) = table.get_mut(&key) else {
        return Err(Error::invalid(
            "id",
            "this grow id was used already, or never made here (one grow per id, NCCL's rule)",
        ));
    };
    let (fabric, world_id, size, left) = p.made.get_or_insert_with(|| {
        let f: Arc<dyn Exchange> = Arc::new(LocalFabric::new(world, timeout));
        (f, NEXT_WORLD.fetch_add(1, Ordering::Relaxed), world, world)
    });
    if *size != world {
        return Err(Error::invalid(
            "world",
            format!("a grown world of {world} ranks, where another rank named {size}"),
        ));
    }
    let got = (fabric.clone(), *world_id);
    *left -= 1;
    if *left == 0 {
        table.remove(&key);
    }
    Ok(got)
}

/// The world's size as NCCL bounds it here.
fn check_world(world: usize) -> Result<()> {
    if world > MAX_RANKS {
        return Err(Error::invalid(
            "world",
            format!("a world of {world}: a mock world has 1..={MAX_RANKS} ranks"),
        ));
    }
    Ok(())
}

impl MockComm {
    /// `ncclCommGetUniqueId` for a grow (see `Comm::grow_id`).
    pub(crate) fn grow_id_comm(&self) -> Result<[u8; 128]> {
        self.live()?;
        self.ctx.target.grow()?;
        if self.shared {
            return crate::id::unique_id();
        }
        let key = NEXT_WORLD.fetch_add(1, Ordering::Relaxed);
        let mut table = PENDING.lock().unwrap_or_else(|e| e.into_inner());
        table
            .get_or_insert_with(HashMap::new)
            .insert(key, Pending { made: None });
        Ok(local_id(key))
    }

    /// `ncclCommGrow` on an existing rank (see `Comm::grow`).
    pub(crate) fn grow_comm(
        &self,
        world: usize,
        id: Option<&[u8; 128]>,
        config: &CommConfig,
    ) -> Result<MockComm> {
        self.live()?;
        self.ctx.target.grow()?;
        config.check_values()?;
        check_world(world)?;
        // Rank 0's id, to every existing rank over this world (a host-side all-gather).
        let mine = id.copied().unwrap_or([0; 128]);
        let all = self.host_all_gather("grow", &mine)?;
        let mut id = [0u8; 128];
        id.copy_from_slice(&all[..128]);
        let rank = self.ctx.rank;
        let ranks: Vec<usize> = (0..world).collect();
        let timeout = self.ctx.timeout;
        let (fabric, world_id, rejoin) = match local_key(&id)? {
            Some(key) => {
                let (f, n) = take_local(key, world, timeout)?;
                (f, n, unicomm_bootstrap::Rejoin::Local(key))
            }
            None => {
                let config = MockConfig {
                    timeout,
                    target: self.ctx.target.clone(),
                    ..MockConfig::default()
                };
                let (f, rejoin) = crate::id::hub_fabric(&id, rank, world, &config)?;
                (f, NEXT_WORLD.fetch_add(1, Ordering::Relaxed), rejoin)
            }
        };
        let mut grown = self.derived(rank, world, fabric, world_id, "grow", &ranks);
        grown.rejoin = rejoin;
        Ok(grown)
    }
}

/// Joins a grown world as a new rank `rank` of `world` with the id rank 0 made
/// (`ncclCommGrow` with no communicator): in this process for a world of threads, anywhere
/// on this machine for a world of processes (as [`crate::init_rank`]). Every rank of the
/// world and every new one call their side at the same time.
pub fn init_grown(
    id: &[u8; 128],
    rank: usize,
    world: usize,
    config: MockConfig,
) -> Result<MockComm> {
    config.check()?;
    config.target.grow()?;
    check_world(world)?;
    if rank == 0 || rank >= world {
        return Err(Error::invalid(
            "rank",
            format!("a new rank {rank} of a grown world of {world}: new ranks follow the world's, 1..{world}"),
        ));
    }
    match local_key(id)? {
        Some(key) => {
            let (fabric, world_id) = take_local(key, world, config.timeout)?;
            let rejoin = unicomm_bootstrap::Rejoin::Local(key);
            crate::local_rank(fabric, rank, world, world_id, &config, rejoin)
        }
        None => crate::init_rank(id, rank, world, config),
    }
}
