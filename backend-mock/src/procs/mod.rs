//! The mock across processes: one rank per process on one machine, as torchrun, mpirun or
//! srun start them.
//!
//! - **Data** moves through shared memory: every allocation of such a rank is a memfd
//!   (`shm.rs`); a peer maps it for the duration of one collective and reads (or, for
//!   all-reduce, writes) it directly, exactly as threads of one process do.
//! - **Agreement** (which collective, its descriptors, the phases, the mailboxes of
//!   send/recv) is the threaded mock's own [`LocalFabric`], run by rank 0's process (the
//!   hub); the other ranks call it over loopback TCP. So the semantics, checks, deadlines
//!   and `Mismatch` errors are the threaded mock's.
//! - **Security**: the hub listens on 127.0.0.1 only, on a port the system picks; its port
//!   and a fresh 32-byte secret reach the other ranks inside the unique id, which the
//!   rendezvous authenticates and encrypts with the job's token. A connection that does not
//!   present the secret, or claims a rank twice, is dropped.
//! - **Failure**: each rank keeps one connection open for its life; when it closes without
//!   the rank having finalized (the process died or dropped its communicator), the hub
//!   poisons the world, and every rank's next or current wait fails at once with
//!   `Aborted`. When the hub's process dies, the others see their connections close.

mod client;
mod hub;
#[cfg(all(test, target_os = "linux"))]
mod hub_tests;
mod life;
mod serve;
mod wire;

pub(crate) use client::Client;
pub(crate) use hub::Hub;
pub(crate) use wire::HubId;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use unicomm_core::{Error, Result};

use crate::fabric::{Desc, Exchange, Msg};
use wire::*;

enum Link {
    Hub(Arc<Hub>),
    Client(Arc<Client>),
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Hold {
    Coll(u64),
    Msg(u64),
}

/// [`Exchange`] for a rank whose peers live in other processes.
pub(crate) struct ProcFabric {
    rank: usize,
    link: Link,
    /// Peers' allocations mapped for a collective or a received message, until it ends.
    held: Mutex<HashMap<Hold, Vec<crate::shm::PeerMap>>>,
}

fn remaining(deadline: Instant) -> u64 {
    deadline
        .saturating_duration_since(Instant::now())
        .as_millis() as u64
}

impl ProcFabric {
    pub(crate) fn hub(hub: Arc<Hub>) -> Self {
        ProcFabric {
            rank: 0,
            link: Link::Hub(hub),
            held: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn client(c: Arc<Client>) -> Self {
        ProcFabric {
            rank: c.rank,
            link: Link::Client(c),
            held: Mutex::new(HashMap::new()),
        }
    }

    fn hold(&self, h: Hold, maps: Vec<crate::shm::PeerMap>) {
        if !maps.is_empty() {
            self.held
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(h, maps);
        }
    }

    fn release(&self, h: Hold) {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&h);
    }

    /// Peers' descriptors with their addresses in this process: each peer allocation
    /// mapped here until the collective ends.
    fn localize(&self, seq: u64, mut all: Vec<Desc>) -> Result<Vec<Desc>> {
        // Ranks that disagree touch no memory (the caller returns `Mismatch`), and a peer
        // may already have left: nothing to map.
        if all.iter().any(|d| d.sig != all[0].sig) {
            return Ok(all);
        }
        let mut maps = Vec::new();
        for (k, d) in all.iter_mut().enumerate() {
            if k == self.rank {
                continue;
            }
            for (at, addr) in [(d.send_at, &mut d.send), (d.recv_at, &mut d.recv)] {
                if let Some(r) = at {
                    let m = crate::shm::PeerMap::open(&r)?;
                    *addr = m.addr(r.offset);
                    maps.push(m);
                }
            }
        }
        self.hold(Hold::Coll(seq), maps);
        Ok(all)
    }
}

impl Drop for ProcFabric {
    fn drop(&mut self) {
        if let Link::Hub(h) = &self.link {
            // Rank 0's process serves the others: replies they are owed may still be on
            // their way. Serve until every other rank finalized, died or closed (they do so
            // at once when rank 0 went without finalizing: the world is poisoned), at most
            // the mock's deadline.
            let _ = h.wait_departures(h.timeout);
            h.stop.store(true, Ordering::Relaxed);
        }
    }
}

/// Every rank's description of a collective, as the hub's reply carries them.
fn descs(r: &mut R<'_>) -> Result<Vec<Desc>> {
    let n = r.usize()?;
    if n > crate::MAX_RANKS {
        return Err(bad("world"));
    }
    (0..n).map(|_| r.desc()).collect()
}

impl Exchange for ProcFabric {
    fn gather(&self, seq: u64, rank: usize, desc: Desc, deadline: Instant) -> Result<Vec<Desc>> {
        let all = match &self.link {
            Link::Hub(h) => h.fabric.gather(seq, rank, desc, deadline)?,
            Link::Client(c) => {
                let ms = remaining(deadline);
                let mut w = W::default();
                w.u8(op::GATHER).u64(seq).u64(ms);
                w.desc(&desc);
                let reply = c.call(&w.0, Duration::from_millis(ms))?;
                let mut r = R(&reply);
                match r.u8()? {
                    0 => descs(&mut r)?,
                    // Published by the hub in shared memory (a large world): read there.
                    2 => {
                        let (at, len) = (r.remote()?, r.usize()?);
                        let map = crate::shm::PeerMap::open(&at)?;
                        let mut r = R(map.bytes(at.offset, len)?);
                        r.u8()?;
                        descs(&mut r)?
                    }
                    _ => return Err(r.error()?),
                }
            }
        };
        match self.localize(seq, all) {
            Ok(all) => Ok(all),
            Err(e) => {
                // A peer's memory is gone: its process died. Everyone stops now.
                self.poison(e.clone());
                Err(e)
            }
        }
    }

    fn phase(&self, seq: u64, rank: usize, phase: u32, deadline: Instant) -> Result<()> {
        match &self.link {
            Link::Hub(h) => h.fabric.phase(seq, rank, phase, deadline),
            Link::Client(c) => {
                let ms = remaining(deadline);
                let mut w = W::default();
                w.u8(op::PHASE).u64(seq).u64(phase as u64).u64(ms);
                c.call_result(&w, Duration::from_millis(ms))
            }
        }
    }

    fn enter(&self, seq: u64) -> Result<()> {
        match &self.link {
            Link::Hub(h) => h.fabric.enter(seq),
            Link::Client(c) => {
                let mut w = W::default();
                w.u8(op::ENTER).u64(seq);
                c.call_result(&w, Duration::from_secs(1))
            }
        }
    }

    fn exit(&self, seq: u64) {
        match &self.link {
            Link::Hub(h) => h.fabric.exit(seq),
            Link::Client(c) => {
                let mut w = W::default();
                w.u8(op::EXIT).u64(seq);
                let _ = c.call_result(&w, Duration::from_secs(1));
            }
        }
    }

    fn leave(&self, seq: u64, failed: bool, deadline: Instant) {
        match &self.link {
            Link::Hub(h) => h.fabric.leave(seq, failed, deadline),
            Link::Client(c) => {
                // The hub waits until the deadline; the answer is awaited a little longer.
                let ms = deadline
                    .saturating_duration_since(Instant::now())
                    .as_millis() as u64;
                let mut w = W::default();
                w.u8(op::LEAVE).u64(seq).u8(u8::from(failed)).u64(ms);
                let _ = c.call_result(&w, Duration::from_millis(ms) + Duration::from_secs(1));
            }
        }
        self.release(Hold::Coll(seq));
    }

    fn post(&self, src: usize, dst: usize, msg: Msg) -> Result<()> {
        match &self.link {
            Link::Hub(h) => h.fabric.post(src, dst, msg),
            Link::Client(c) => {
                let mut w = W::default();
                w.u8(op::POST).u64(dst as u64);
                w.msg(&msg);
                c.call_result(&w, Duration::from_secs(1))
            }
        }
    }

    fn take(&self, src: usize, dst: usize, deadline: Instant, after: Duration) -> Result<Msg> {
        let mut m = match &self.link {
            Link::Hub(h) => h.fabric.take(src, dst, deadline, after)?,
            Link::Client(c) => take_from_hub(c, src, deadline, after, false)?,
        };
        if let Some(at) = m.at.filter(|_| src != dst) {
            match crate::shm::PeerMap::open(&at) {
                Ok(map) => {
                    m.addr = map.addr(at.offset);
                    self.hold(Hold::Msg(m.id), vec![map]);
                }
                Err(e) => {
                    self.complete(m.id, Some(e.clone()));
                    return Err(e);
                }
            }
        }
        Ok(m)
    }

    fn take_one_sided(&self, src: usize, dst: usize, deadline: Instant) -> Result<Msg> {
        // The bytes travel in the message: nothing of the sender's to map.
        match &self.link {
            Link::Hub(h) => h.fabric.take_one_sided(src, dst, deadline),
            Link::Client(c) => take_from_hub(c, src, deadline, Duration::ZERO, true),
        }
    }

    fn complete(&self, id: u64, refused: Option<Error>) {
        match &self.link {
            Link::Hub(h) => h.fabric.complete(id, refused),
            Link::Client(c) => {
                let mut w = W::default();
                w.u8(op::COMPLETE).u64(id);
                w.opt(refused.as_ref(), |w, e| w.error(e));
                let _ = c.call_result(&w, Duration::from_secs(1));
            }
        }
        self.release(Hold::Msg(id));
    }

    fn wait_sent(&self, id: u64, dst: usize, deadline: Instant, after: Duration) -> Result<()> {
        match &self.link {
            Link::Hub(h) => h.fabric.wait_sent(id, dst, deadline, after),
            Link::Client(c) => {
                let ms = remaining(deadline);
                let mut w = W::default();
                w.u8(op::WAIT_SENT)
                    .u64(id)
                    .u64(dst as u64)
                    .u64(ms)
                    .u64(after.as_millis() as u64);
                c.call_result(&w, Duration::from_millis(ms))
            }
        }
    }

    fn poison(&self, e: Error) {
        match &self.link {
            Link::Hub(h) => h.fabric.poison(e),
            Link::Client(c) => {
                c.poison
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e.clone());
                let mut w = W::default();
                w.u8(op::POISON).error(&e);
                let _ = c.call_result(&w, Duration::from_secs(1));
            }
        }
    }

    fn depart(&self, rank: usize, joined: u64, timeout: Duration) -> Result<()> {
        match &self.link {
            Link::Hub(h) => {
                let short = h.fabric.depart(rank, joined, timeout);
                h.wait_departures(timeout).and(short)
            }
            Link::Client(c) => {
                let mut w = W::default();
                w.u8(op::DEPART).u64(joined);
                let short = c.call_result(&w, Duration::from_secs(1));
                c.bye();
                short
            }
        }
    }

    fn poisoned(&self) -> Option<Error> {
        match &self.link {
            Link::Hub(h) => h.fabric.poisoned(),
            Link::Client(c) => c.poison.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }
}

/// A client's take of the next message from `src` (a send, or a one-sided message) at the
/// hub.
fn take_from_hub(
    c: &Client,
    src: usize,
    deadline: Instant,
    after: Duration,
    one_sided: bool,
) -> Result<Msg> {
    let ms = remaining(deadline);
    let mut w = W::default();
    w.u8(op::TAKE)
        .u64(src as u64)
        .u64(ms)
        .u64(after.as_millis() as u64)
        .u8(u8::from(one_sided));
    let reply = c.call(&w.0, Duration::from_millis(ms))?;
    let mut r = R(&reply);
    match r.u8()? {
        0 => r.msg(),
        _ => Err(r.error()?),
    }
}
