//! How the survivors of a failed communicator meet again without it: a 128-byte id (a unique
//! id, or the mock's fabric address) from the first survivor to the others, over a channel
//! that does not need the failed communicator. Ranks in one process meet on an in-process
//! board; ranks of a launched job (one per process) over the job's rendezvous again
//! (`MASTER_ADDR:MASTER_PORT` or the rendezvous file), under a label naming the round and
//! the survivors, so neither an earlier round nor a rank with another view of who is left
//! can join.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::launcher::LaunchEnv;
use unicomm_core::{Error, Result};

/// Where a communicator's ranks meet to re-form (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejoin {
    /// Every rank is in this process: the board, under this key (the same on every rank).
    Local(u64),
    /// One rank per process of a launched job: its rendezvous, under `label`.
    Job {
        /// The job as the launcher started it (rank and size are replaced per round).
        env: LaunchEnv,
        /// What this communicator adds to the job's token (its splits and rounds).
        label: Vec<u8>,
    },
}

static NEXT_LOCAL: AtomicU64 = AtomicU64::new(1);

/// FNV-1a of `parts`: the same key on every rank for the same parent, step and arguments.
fn derive(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.iter().chain(&[0xff]) {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn ranks_bytes(ranks: &[usize]) -> Vec<u8> {
    ranks
        .iter()
        .flat_map(|&r| (r as u64).to_le_bytes())
        .collect()
}

impl Rejoin {
    /// A fresh key for a world created in this process (every rank of it shares the value).
    pub fn local() -> Self {
        Rejoin::Local(NEXT_LOCAL.fetch_add(1, Ordering::Relaxed) << 32)
    }

    /// The ranks of the job `env` describes (as `from_env` joined them).
    pub fn job(env: &LaunchEnv) -> Self {
        Rejoin::Job {
            env: env.clone(),
            label: Vec::new(),
        }
    }

    /// Where the members of a communicator derived from this one meet: `step` names how
    /// (a split and its color, a shrink and its survivors), the same on every member.
    pub fn derived(&self, step: &[u8], ranks: &[usize]) -> Self {
        let r = ranks_bytes(ranks);
        match self {
            Rejoin::Local(k) => Rejoin::Local(derive(&[&k.to_le_bytes(), step, &r])),
            Rejoin::Job { env, label } => {
                let mut label = label.clone();
                label.extend_from_slice(&derive(&[step, &r]).to_le_bytes());
                Rejoin::Job {
                    env: env.clone(),
                    label,
                }
            }
        }
    }

    /// The id every survivor gets (collective over `survivors`, ranks of the communicator
    /// this was made for, in the new communicator's order): the first survivor calls `make`,
    /// the others receive it, within `timeout`. `round` numbers the re-formings of this
    /// communicator (the same on every survivor).
    pub fn exchange(
        &self,
        round: u64,
        survivors: &[usize],
        me: usize,
        make: impl FnOnce() -> Result<[u8; 128]>,
        timeout: Duration,
    ) -> Result<[u8; 128]> {
        let Some(new_rank) = survivors.iter().position(|&r| r == me) else {
            return Err(Error::invalid(
                "exclude",
                format!("rank {me} excluded itself"),
            ));
        };
        let at = self.derived(
            &[b"round".as_slice(), &round.to_le_bytes()].concat(),
            survivors,
        );
        match at {
            Rejoin::Local(key) => board(key, new_rank, survivors.len(), make, timeout),
            Rejoin::Job { env, label } => {
                let mut token = env.token.clone();
                token.extend_from_slice(b"|rejoin|");
                token.extend_from_slice(&label);
                let env = LaunchEnv {
                    rank: new_rank,
                    world_size: survivors.len(),
                    token,
                    // The survivors' ranks are no longer placed by block.
                    forward: None,
                    ..env
                };
                super::exchange_unique_id(&env, make, timeout)
            }
        }
    }
}

/// An id being handed out on the board: the id (once made) and the survivors still to take it.
type Posted = (Option<[u8; 128]>, usize);

static BOARD: Mutex<Option<HashMap<u64, Posted>>> = Mutex::new(None);
static POSTED: Condvar = Condvar::new();

/// The in-process meeting: rank 0 of the new world posts the id, the others wait for it.
fn board(
    key: u64,
    rank: usize,
    world: usize,
    make: impl FnOnce() -> Result<[u8; 128]>,
    timeout: Duration,
) -> Result<[u8; 128]> {
    let deadline = Instant::now() + timeout;
    let id = if rank == 0 { Some(make()?) } else { None };
    let mut g = BOARD.lock().unwrap_or_else(|e| e.into_inner());
    let table = g.get_or_insert_with(HashMap::new);
    let slot = table.entry(key).or_insert((None, world));
    if let Some(id) = id {
        slot.0 = Some(id);
        POSTED.notify_all();
    }
    loop {
        let table = g.get_or_insert_with(HashMap::new);
        if let Some((Some(id), left)) = table.get_mut(&key) {
            let id = *id;
            *left -= 1;
            if *left == 0 {
                table.remove(&key);
            }
            return Ok(id);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout {
                what: format!("the first survivor's id to re-form a world of {world}"),
                after: timeout,
            });
        }
        g = POSTED
            .wait_timeout(g, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// The contract's rejoin channel (what a backend is handed to re-form after a shrink).
impl unicomm_core::Rejoin for Rejoin {
    fn derived(&self, step: &[u8], ranks: &[usize]) -> std::sync::Arc<dyn unicomm_core::Rejoin> {
        std::sync::Arc::new(Rejoin::derived(self, step, ranks))
    }

    fn exchange(
        &self,
        round: u64,
        survivors: &[usize],
        me: usize,
        make: &mut dyn FnMut() -> Result<[u8; 128]>,
        timeout: Duration,
    ) -> Result<[u8; 128]> {
        Rejoin::exchange(self, round, survivors, me, make, timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn survivors_in_one_process_get_the_first_ones_id_and_a_stranger_round_does_not() {
        let r = Rejoin::local();
        let survivors = [0, 2, 3];
        let got: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = survivors
                .iter()
                .rev()
                .map(|&me| {
                    let r = r.clone();
                    s.spawn(move || {
                        r.exchange(
                            1,
                            &survivors,
                            me,
                            || Ok([me as u8 + 7; 128]),
                            Duration::from_secs(5),
                        )
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for g in got {
            assert_eq!(g.unwrap(), [7; 128], "rank 0 of the survivors made it");
        }
        // Another view of who is left meets no one: a timeout, not another round's id.
        let e = r.exchange(1, &[0, 3], 3, || Ok([1; 128]), Duration::from_millis(50));
        assert!(matches!(e, Err(Error::Timeout { .. })), "{e:?}");
        let e = r.exchange(1, &[0, 3], 1, || Ok([1; 128]), Duration::from_millis(50));
        assert!(matches!(e, Err(Error::InvalidArgument { .. })), "{e:?}");
    }
}
