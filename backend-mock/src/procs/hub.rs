//! The hub, in rank 0's process: the threaded mock's [`LocalFabric`] served to the other
//! ranks over loopback TCP, each rank's life watched on a connection of its own.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use mio::{Poll, Waker};
use unicomm_core::{Error, Result};

use super::serve::{Host, Step, WAKER};
use super::wire::*;
use crate::fabric::{Exchange, LocalFabric, Wait};

// ---------------------------------------------------------------------------------------
// The hub, in rank 0's process.

#[derive(Clone, Copy, PartialEq, Eq)]
enum Life {
    Absent,
    Live,
    Departed,
    Dead,
}

/// A rank's collectives entered (sequence numbers) and messages taken (ids), not ended.
type Open = (Vec<u64>, Vec<u64>);

pub(crate) struct Hub {
    pub(crate) fabric: LocalFabric,
    world: usize,
    pub(crate) timeout: Duration,
    secret: [u8; 32],
    lives: Mutex<Vec<Life>>,
    cv: Condvar,
    /// Per rank, the collectives whose peer memory it is accessing and the messages it is
    /// copying: released for it when its process dies (it will never end them itself).
    open: Mutex<HashMap<usize, Open>>,
    pub(crate) stop: AtomicBool,
    /// The thread watching every rank's life connection.
    watch: std::sync::OnceLock<super::life::Lives>,
}

impl Hub {
    /// Starts the hub: listens on 127.0.0.1 (a port the system picks) until rank 0's
    /// fabric is dropped.
    pub(crate) fn start(world: usize, timeout: Duration) -> Result<(Arc<Hub>, HubId)> {
        let (listener, id) = Self::bind()?;
        Ok((Self::serve_on(listener, id.secret, world, timeout)?, id))
    }

    /// The hub's listener on 127.0.0.1 (an unused port) and its id with a fresh secret,
    /// before the world's size is known ([`Hub::serve`] starts it then).
    pub(crate) fn bind() -> Result<(TcpListener, HubId)> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| Error::Bootstrap {
            reason: format!("no randomness for the mock's hub: {e}"),
        })?;
        let listener = listen().map_err(|e| Error::Bootstrap {
            reason: format!("the mock's hub cannot listen on 127.0.0.1: {e}"),
        })?;
        let port = listener
            .local_addr()
            .map_err(|e| Error::Bootstrap {
                reason: format!("the mock's hub: {e}"),
            })?
            .port();
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::Bootstrap {
                reason: format!("the mock's hub: {e}"),
            })?;
        Ok((listener, HubId { port, secret }))
    }

    /// Serves a world of `world` ranks on `listener` (from [`Hub::bind`]), rank 0 in this
    /// process.
    pub(crate) fn serve_on(
        listener: TcpListener,
        secret: [u8; 32],
        world: usize,
        timeout: Duration,
    ) -> Result<Arc<Hub>> {
        // Two connections per rank: past the usual soft limit of 1,024 files near 500 ranks.
        #[cfg(unix)]
        unicomm_bootstrap::raise_open_files_limit();
        let mut lives = vec![Life::Absent; world];
        lives[0] = Life::Live;
        let hub = Arc::new(Hub {
            fabric: LocalFabric::new(world, timeout),
            world,
            timeout,
            secret,
            lives: Mutex::new(lives),
            cv: Condvar::new(),
            open: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            watch: std::sync::OnceLock::new(),
        });
        let weak = Arc::downgrade(&hub);
        let _ = hub.watch.set(super::life::Lives::start(weak.clone())?);
        let fail = |e: std::io::Error| Error::Bootstrap {
            reason: format!("the mock's hub thread: {e}"),
        };
        // The exchange wakes the loop when it changes (rank 0's own calls included).
        let poll = Poll::new().map_err(fail)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(fail)?);
        hub.fabric.on_change(Box::new(move || {
            let _ = waker.wake();
        }));
        std::thread::Builder::new()
            .name("unicomm-mock-hub".into())
            .spawn(move || super::serve::run(poll, listener, weak))
            .map_err(fail)?;
        Ok(hub)
    }

    fn lives(&self) -> std::sync::MutexGuard<'_, Vec<Life>> {
        self.lives.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `rank`'s life connection ended: `true` when it was live (no goodbye: it died).
    fn end_life(&self, rank: usize) -> bool {
        let mut lives = self.lives();
        let died = lives[rank] == Life::Live;
        if died {
            lives[rank] = Life::Dead;
        }
        drop(lives);
        self.cv.notify_all();
        died
    }

    /// A rank's process is gone without finalizing: its open accesses end, the world is
    /// poisoned so that every rank's wait fails now.
    fn died(&self, rank: usize) {
        let (entered, taking) = self
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&rank)
            .unwrap_or_default();
        self.fabric.poison(Error::lost(
            vec![rank],
            format!(
                "rank {rank}'s process exited (or dropped its communicator) without finalizing"
            ),
        ));
        for seq in entered {
            self.fabric.exit(seq);
        }
        for id in taking {
            self.fabric.complete(
                id,
                Some(Error::lost(
                    vec![rank],
                    format!("rank {rank}'s process exited while receiving"),
                )),
            );
        }
    }

    /// Rank 0 finalizes: the hub serves until every other rank finalized or died, at most
    /// `timeout`.
    pub(crate) fn wait_departures(&self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let mut lives = self.lives();
        loop {
            // A rank that never joined a poisoned world will not (it would only be told the
            // poison): not waited for.
            let absent_due = self.fabric.poisoned().is_none();
            let waiting: Vec<usize> = (1..self.world)
                .filter(|&r| lives[r] == Life::Live || (absent_due && lives[r] == Life::Absent))
                .collect();
            if waiting.is_empty() {
                return Ok(());
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(Error::Timeout {
                    what: format!(
                        "rank 0's finalize: rank(s) {waiting:?} never finalized (rank 0's process serves the mock's exchange until they do)"
                    ),
                    after: start.elapsed(),
                });
            }
            lives = self
                .cv
                .wait_timeout(lives, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn track(&self, rank: usize, seq_or_id: u64, entered: bool, add: bool) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let e = open.entry(rank).or_default();
        let v = if entered { &mut e.0 } else { &mut e.1 };
        if add {
            v.push(seq_or_id);
        } else if let Some(i) = v.iter().position(|&x| x == seq_or_id) {
            v.swap_remove(i);
        }
    }
}

impl Host for Hub {
    fn fabric(&self) -> &LocalFabric {
        &self.fabric
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Starts one request of `rank`: answered at once, or the wait for its peers (the
    /// hub's loop checks it as the exchange changes). `Err` for a malformed request.
    fn begin(&self, rank: usize, req: &[u8]) -> Result<Step> {
        let mut r = R(req);
        let f = &self.fabric;
        let mut w = W::default();
        let within = |ms: u64| Instant::now() + Duration::from_millis(ms.min(86_400_000));
        match r.u8()? {
            op::GATHER => {
                let (seq, ms, desc) = (r.u64()?, r.u64()?, r.desc()?);
                match f.start_gather(seq, rank, desc) {
                    Ok(wait) => return Ok(Step::Wait(wait, within(ms))),
                    Err(e) => {
                        w.u8(1).error(&e);
                    }
                }
            }
            op::PHASE => {
                let (seq, phase, ms) = (r.u64()?, r.u64()?, r.u64()?);
                let phase = u32::try_from(phase).map_err(|_| bad("phase"))?;
                return Ok(Step::Wait(f.start_phase(seq, rank, phase), within(ms)));
            }
            op::ENTER => {
                let seq = r.u64()?;
                let res = f.enter(seq);
                if res.is_ok() {
                    self.track(rank, seq, true, true);
                }
                w.result(&res);
            }
            op::EXIT => {
                let seq = r.u64()?;
                self.track(rank, seq, true, false);
                f.exit(seq);
                w.result(&Ok(()));
            }
            op::LEAVE => {
                let (seq, failed, ms) = (r.u64()?, r.u8()? != 0, r.u64()?);
                if let Some(wait) = f.start_leave(seq, failed) {
                    return Ok(Step::Wait(wait, within(ms)));
                }
                w.result(&Ok(()));
            }
            op::POST => {
                let (dst, msg) = (r.usize()?, r.msg()?);
                w.result(&f.post(rank, dst, msg));
            }
            op::TAKE => {
                let (src, ms, _after) = (r.usize()?, r.u64()?, r.u64()?);
                let one_sided = r.u8()? == 1;
                let wait = Wait::Take {
                    src,
                    dst: rank,
                    one_sided,
                };
                return Ok(Step::Wait(wait, within(ms)));
            }
            op::COMPLETE => {
                let id = r.u64()?;
                let refused = r.opt(R::error)?;
                self.track(rank, id, false, false);
                f.complete(id, refused);
                w.result(&Ok(()));
            }
            op::WAIT_SENT => {
                let (id, dst, ms, _after) = (r.u64()?, r.usize()?, r.u64()?, r.u64()?);
                return Ok(Step::Wait(Wait::Sent { id, dst }, within(ms)));
            }
            op::DEPART => {
                let joined = r.u64()?;
                w.result(&f.depart(rank, joined, self.timeout));
            }
            op::POISON => {
                f.poison(r.error()?);
                w.result(&Ok(()));
            }
            _ => return Err(bad("request")),
        }
        Ok(Step::Reply(w.0))
    }

    fn took(&self, rank: usize, id: u64) {
        self.track(rank, id, false, true);
    }

    /// The rank and kind of an authenticated hello (the job's secret, a rank of the world
    /// other than 0, told the same world size); a refusal for a hello that proved the
    /// secret but not the rest; `Err(None)` for a stranger's, dropped unanswered.
    fn authenticate(&self, hello: &[u8]) -> std::result::Result<(usize, u8), Option<Refusal>> {
        let mut r = R(hello);
        let (Ok(secret), Ok(rank), Ok(kind), Ok(world)) =
            (r.take(32).map(<[u8]>::to_vec), r.usize(), r.u8(), r.usize())
        else {
            tracing::warn!("unicomm mock hub: a malformed hello was dropped");
            return Err(None);
        };
        if !secret_ok(&secret, &self.secret) {
            tracing::warn!("unicomm mock hub: a connection without the job's secret was dropped");
            return Err(None);
        }
        if world != self.world {
            tracing::warn!(
                rank,
                world,
                "unicomm mock hub: a rank told another world size was refused"
            );
            // The world cannot complete: its ranks fail at their next wait, naming why.
            self.fabric.poison(Error::invalid(
                "world",
                format!("rank {rank} was told a world of {world} ranks and rank 0 one of {}: every rank must be given the same world size", self.world),
            ));
            return Err(Some(Refusal::World));
        }
        if rank == 0 || rank >= self.world {
            tracing::warn!(
                rank,
                "unicomm mock hub: a rank outside the world was refused"
            );
            return Err(Some(Refusal::Rank));
        }
        Ok((rank, kind))
    }

    fn world(&self) -> usize {
        self.world
    }

    /// `rank`'s life connection arrived: `false` if it had one already (the second is
    /// dropped).
    fn join(&self, rank: usize) -> bool {
        {
            let mut lives = self.lives();
            if lives[rank] != Life::Absent {
                tracing::warn!(
                    "unicomm mock hub: rank {rank} joined twice; the second was dropped"
                );
                return false;
            }
            lives[rank] = Life::Live;
        }
        self.cv.notify_all();
        true
    }

    fn live(&self, rank: usize) -> bool {
        self.lives()[rank] == Life::Live
    }

    /// Hands `rank`'s acknowledged life connection to the watcher.
    fn watch_life(&self, rank: usize, s: TcpStream) {
        match self.watch.get() {
            Some(w) => w.add(rank, s),
            None => Host::life_ended(self, rank),
        }
    }

    /// `rank`'s life connection ended (a death unless it said goodbye).
    fn life_ended(&self, rank: usize) {
        super::life::Watcher::ended(self, rank)
    }
}

impl super::life::Watcher for Hub {
    fn departed(&self, rank: usize) {
        self.lives()[rank] = Life::Departed;
        self.cv.notify_all();
    }

    fn ended(&self, rank: usize) {
        if self.end_life(rank) {
            self.died(rank);
        }
    }

    fn poisoned(&self) -> Option<Error> {
        self.fabric.poisoned()
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// 127.0.0.1 on a port the system picks, with a queue for a thousand ranks' connections
/// (std's `bind` fixes it at 128; the kernel caps it at `net.core.somaxconn`).
fn listen() -> std::io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    s.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())?;
    s.listen(4096)?;
    Ok(s.into())
}

// ---------------------------------------------------------------------------------------
// A rank in another process.
