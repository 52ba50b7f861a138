//! Joining a world by a unique id, as NCCL's `ncclGetUniqueId` + `ncclCommInitRank` do: the
//! process that makes the id holds a listener on 127.0.0.1 and a fresh 32-byte secret, both
//! in the id's 128 bytes; the engine sends the id to its ranks however it likes (a file, a
//! socket, its own store); rank 0 joins in the process that made it and serves the others
//! (threads of that process or other processes of the machine), who prove the secret.

use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use unicomm_core::{Error, Result};

use crate::fabric::Exchange;
use crate::procs::{Client, Hub, HubId, ProcFabric};
use crate::{MockComm, MockConfig, MAX_RANKS};

/// Listeners of the ids made in this process, until their rank 0 joins.
static MADE: Mutex<Vec<(HubId, TcpListener)>> = Mutex::new(Vec::new());

/// A new world id (128 bytes): this process must be the one where rank 0 joins.
pub fn unique_id() -> Result<[u8; 128]> {
    let (listener, id) = Hub::bind()?;
    let bytes = id.to_bytes();
    MADE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((id, listener));
    Ok(bytes)
}

/// Joins the world of `id` as `rank` of `world`, with `config`'s deadline, faults and
/// target; rank 0 in the process that made the id, the others anywhere on this machine.
/// Buffers live in shared memory. A shrink's re-form meets only ranks of one process
/// (across processes it ends at the deadline: re-form from the launcher's rendezvous,
/// [`crate::join`], instead).
pub fn init_rank(
    id: &[u8; 128],
    rank: usize,
    world: usize,
    config: MockConfig,
) -> Result<MockComm> {
    if world == 0 || world > MAX_RANKS {
        return Err(Error::invalid(
            "world",
            format!("a world of {world}: a mock world has 1..={MAX_RANKS} ranks"),
        ));
    }
    if rank >= world {
        return Err(Error::invalid(
            "rank",
            format!("rank {rank} of {world}: a rank is below the world size (0..{world})"),
        ));
    }
    config.check()?;
    let hub = HubId::parse(id)?;
    let fabric: Arc<dyn Exchange> = if rank == 0 {
        let listener = {
            let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
            let at = made.iter().position(|(h, _)| h.secret == hub.secret);
            at.map(|i| made.swap_remove(i).1)
        };
        let listener = listener.ok_or_else(|| {
            Error::invalid(
                "rank",
                "the mock's rank 0 joins in the process that made the id, once (its hub serves the other ranks)",
            )
        })?;
        let served = Hub::serve_on(listener, hub.secret, world, config.timeout)?;
        Arc::new(ProcFabric::hub(served))
    } else {
        Arc::new(ProcFabric::client(Client::connect(
            &hub,
            (rank, world),
            config.timeout,
        )?))
    };
    // Ranks of one process re-form on its board, under a key every rank derives from the id.
    let key = u64::from_le_bytes(hub.secret[..8].try_into().unwrap_or([0; 8]));
    let rejoin = unicomm_bootstrap::Rejoin::Local(key);
    crate::process_rank(fabric, (rank, world), &config, rejoin)
}
