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

/// Listeners of the ids made in this process, until their rank 0 joins, oldest first; and
/// the first bytes of the secrets of ids given up (most recent last), to name them.
static MADE: Mutex<Made> = Mutex::new((Vec::new(), Vec::new()));

/// The ids made and not joined (their listeners), and the secrets' heads of those given up.
type Made = (Vec<(HubId, TcpListener)>, Vec<[u8; 8]>);

/// The most ids a process holds open (one listening socket each) before its rank 0 joins:
/// beyond it the oldest is given up, so ids made and never joined cannot exhaust the
/// process's descriptors (NCCL's `ncclGetUniqueId` starts a listener per id too).
pub const MAX_UNJOINED_IDS: usize = 64;

/// How many given-up ids are remembered to be named as such.
const GIVEN_UP_NAMED: usize = 4096;

/// A new world id (128 bytes): this process must be the one where rank 0 joins. At most
/// [`MAX_UNJOINED_IDS`] are held before their rank 0 joins: the oldest beyond that is given
/// up (its listener closed; its rank 0 is refused, naming why).
pub fn unique_id() -> Result<[u8; 128]> {
    let (listener, id) = Hub::bind()?;
    let bytes = id.to_bytes();
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    made.0.push((id, listener));
    while made.0.len() > MAX_UNJOINED_IDS {
        let (old, _) = made.0.remove(0);
        let mut head = [0u8; 8];
        head.copy_from_slice(&old.secret[..8]);
        made.1.push(head);
        if made.1.len() > GIVEN_UP_NAMED {
            made.1.remove(0);
        }
    }
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
    let (fabric, rejoin) = hub_fabric(id, rank, world, &config)?;
    crate::process_rank(fabric, rank, world, &config, rejoin)
}

/// The fabric of the world of `id` for `rank` of `world` (rank 0 serves the hub this
/// process made for the id; the others connect), and the key its ranks re-form under.
pub(crate) fn hub_fabric(
    id: &[u8; 128],
    rank: usize,
    world: usize,
    config: &MockConfig,
) -> Result<(Arc<dyn Exchange>, unicomm_bootstrap::Rejoin)> {
    let hub = HubId::parse(id)?;
    let fabric: Arc<dyn Exchange> = if rank == 0 {
        let (listener, given_up) = {
            let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
            let at = made.0.iter().position(|(h, _)| h.secret == hub.secret);
            let given_up = made.1.iter().any(|h| h[..] == hub.secret[..8]);
            (at.map(|i| made.0.remove(i).1), given_up)
        };
        let listener = listener.ok_or_else(|| {
            Error::invalid(
                "rank",
                match given_up {
                    true => format!("this id was given up: more than {MAX_UNJOINED_IDS} ids were made in this process after it before its rank 0 joined"),
                    false => "the mock's rank 0 joins in the process that made the id, once (its hub serves the other ranks)".into(),
                },
            )
        })?;
        let served = Hub::serve_on(listener, hub.secret, world, config.timeout)?;
        Arc::new(ProcFabric::hub(served))
    } else {
        let client = Client::connect(&hub, rank, world, config.timeout);
        Arc::new(ProcFabric::client(
            client.map_err(|e| unserved(&hub, e, config))?,
        ))
    };
    // Ranks of one process re-form on its board, under a key every rank derives from the id.
    let key = u64::from_le_bytes(hub.secret[..8].try_into().unwrap_or([0; 8]));
    let rejoin = unicomm_bootstrap::Rejoin::Local(key);
    Ok((fabric, rejoin))
}

/// A rank that could not join an id this process made and whose rank 0 has not joined
/// here: the hub was never served, whatever the connection saw (a rank 0 that joined in
/// another process was refused there). Named as such, not as an unreachable hub.
fn unserved(hub: &HubId, e: Error, config: &MockConfig) -> Error {
    let made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    if made.0.iter().any(|(h, _)| h.secret == hub.secret) {
        return Error::Timeout {
            what: "this id's rank 0 to join: the id was made in this process, whose rank 0 serves the other ranks (a rank 0 joining in another process is refused there)".into(),
            after: config.timeout,
        };
    }
    match made.1.iter().any(|h| h[..] == hub.secret[..8]) {
        true => Error::invalid(
            "id",
            format!("this id was given up before its rank 0 joined: more than {MAX_UNJOINED_IDS} ids were made in this process after it"),
        ),
        false => e,
    }
}
