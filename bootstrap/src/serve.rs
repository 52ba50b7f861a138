//! The serving side of the rendezvous (rank 0 on its TCP port; with forwarding, each host's
//! first rank on the host's local socket): one thread (the caller's) drives every handshake
//! on an event loop (`mio`), so the server holds no thread per rank; listen queues sized to
//! the world (`stream::listen`); over [`MAX_HANDSHAKES`] under way it stops accepting and
//! the kernel queues the rest, so no connection is closed for being early.

use std::io::ErrorKind;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};

use super::auth::{io, nonce, Key, FIRST_LEN};
use super::deadline::Deadline;
use super::drops::DropLog;
use super::file::missing;
use super::launcher::LaunchEnv;
use super::stream::{Listener, Stream, MAX_QUEUES};
use unicomm_core::{Error, Result};

mod answer;
mod conn;

/// How long one connection may take on the server before it is dropped (so one silent or
/// dripping client cannot hold a slot for long); never past the deadline.
pub(crate) const PER_CONNECTION: Duration = Duration::from_secs(2);

/// The most handshakes rank 0 holds at once, each a socket and under 400 bytes for at most
/// [`PER_CONNECTION`]: what a stranger can make rank 0 hold. Beyond them rank 0 leaves
/// connections in the kernel's listen queue until a slot frees.
pub(crate) const MAX_HANDSHAKES: usize = 256;

/// The most connections rank 0 holds that were answered and owe their acknowledgement. They
/// take no handshake slot (a replayed hello, answered but never acknowledged, would
/// otherwise hold one until the rendezvous' deadline, and 256 of them lock every real rank
/// out); past this many the oldest is read once more and dropped: what a stranger with a
/// captured hello can make rank 0 hold is this many sockets.
pub(crate) const MAX_ACKING: usize = 1024;

/// The listeners' tokens count down from the top; the connections' are their slots.
const LISTENERS: usize = usize::MAX - MAX_QUEUES;

/// Listener `k`'s token.
fn listener_token(k: usize) -> Token {
    Token(usize::MAX - k)
}

/// What rank 0's rendezvous did, logged in one line at its end.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Connections accepted.
    pub(crate) accepted: u64,
    /// Ranks served the id.
    pub(crate) served: u64,
    /// Connections dropped: malformed, unauthenticated, refused, too slow, broken.
    pub(crate) dropped: u64,
    /// The most handshakes under way at once.
    pub(crate) peak: usize,
    /// Accept calls that found their queue empty (one per queue each time it drains: a
    /// queue is tried again on its next arrival, not whenever a slot frees).
    pub(crate) empty_accepts: u64,
    /// Write calls that sent bytes to connections that ended (one per connection answered:
    /// rank 0 writes one answer per handshake, and a small answer goes out in one write).
    pub(crate) writes: u64,
}

/// What a connection's answer ends with: the rank it answered with the ids and the
/// acknowledgement due from it, or why it served none.
type Outcome = std::result::Result<(usize, [u8; 32]), String>;

struct Conn {
    s: Stream,
    /// `None` while reading the rank's hello and proof; then the answer's outcome, known
    /// while the answer (`out`) is written, after which the connection closes.
    answered: Option<Outcome>,
    /// After the ids: the rank and the acknowledgement it must send to count as joined.
    acking: Option<(usize, [u8; 32])>,
    inbuf: [u8; FIRST_LEN],
    got: usize,
    out: Vec<u8>,
    sent: usize,
    deadline: Instant,
    generation: u64,
    /// Counted among the connections owing an acknowledgement.
    counted: bool,
}

/// Where a connection stands after some progress.
enum Step {
    Waiting,
    /// A rank served.
    Served,
    /// Ended without serving a rank, and why.
    Dropped(String),
}

struct Server<'a> {
    env: &'a LaunchEnv,
    key: Key,
    /// The ids handed out (128 bytes each).
    ids: Vec<u8>,
    served: Vec<bool>,
    /// Rank 0's nonces: a MAC of a counter under a random key drawn once (as unpredictable
    /// as drawing each, without a system call per handshake).
    nonces: (Key, u64),
    /// What this rendezvous did so far.
    tally: Tally,
    /// A rank that proved the job's token was told another world size: the job is
    /// misconfigured, and rank 0 fails at once (after the rank's refusal is written).
    misconfigured: Option<String>,
}

/// Serves `ids` (128 bytes each) on `listeners` (at `addr`, as messages name it) to every
/// rank of `env` that `serves` says this server serves, until all of them joined or
/// `deadline` (rank 0 serves every other rank; with forwarding, its host's ranks and each
/// other host's first, which serves the rest of its host).
pub(crate) fn serve(
    env: &LaunchEnv,
    (addr, listeners): (String, Vec<Listener>),
    ids: &[u8],
    serves: impl Fn(usize) -> bool,
    Deadline {
        start,
        at: deadline,
        timeout,
    }: Deadline,
) -> Result<Tally> {
    // The ranks served elsewhere (and this rank) count as served from the start.
    let served: Vec<bool> = (0..env.world_size).map(|r| !serves(r)).collect();
    let mut joined = served.iter().filter(|&&s| s).count();
    let mut srv = Server {
        env,
        key: Key::new(&env.token),
        ids: ids.to_vec(),
        served,
        nonces: (Key::new(&nonce()?), 0),
        tally: Tally::default(),
        misconfigured: None,
    };
    let mut lp = Loop::new(listeners)?;
    let mut log = DropLog::new(addr.clone());
    while joined < env.world_size {
        let now = Instant::now();
        if now >= deadline {
            log.flush();
            return Err(Error::Timeout {
                what: format!(
                    "rank(s) {} to join the rendezvous on {addr} (waited {:.1?})",
                    missing(&srv.served),
                    start.elapsed()
                ),
                after: timeout,
            });
        }
        let wake = lp.next_expiry().map_or(deadline, |d| d.min(deadline));
        let moved = lp.turn(&mut srv, wake)?;
        srv.tally.peak = srv.tally.peak.max(lp.live());
        let expired = lp.expired(Instant::now());
        for (slot, step) in moved.into_iter().chain(expired) {
            match step {
                Step::Waiting => continue,
                Step::Served => {
                    joined += 1;
                    srv.tally.served += 1;
                }
                Step::Dropped(why) => {
                    srv.tally.dropped += 1;
                    log.note(why);
                    if let Some(why) = srv.misconfigured.take() {
                        log.flush();
                        return Err(Error::invalid("WORLD_SIZE", why));
                    }
                }
            }
            lp.close(slot);
        }
    }
    log.flush();
    Ok(srv.tally)
}

/// The connections under way, in slots reused as they end.
struct Loop {
    poll: Poll,
    events: Events,
    listeners: Vec<Listener>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    /// (deadline, slot, generation) in the order accepted, so in deadline order: the
    /// oldest live handshake is the next to expire. Entries of ended ones are skipped.
    expiry: std::collections::VecDeque<(Instant, usize, u64)>,
    generation: u64,
    /// Which listeners may have connections waiting (left for a free slot, or signalled).
    pending: Vec<bool>,
    /// When to try accepting again after a failure for want of resources.
    retry: Option<Instant>,
    /// The connections that owe an acknowledgement, (slot, generation) in the order their
    /// answers went out, and how many are live.
    ackers: std::collections::VecDeque<(usize, u64)>,
    acking: usize,
}

impl Loop {
    fn new(mut listeners: Vec<Listener>) -> Result<Loop> {
        let poll = Poll::new().map_err(|e| io("rendezvous event loop", e))?;
        for (k, l) in listeners.iter_mut().enumerate() {
            poll.registry()
                .register(l, listener_token(k), Interest::READABLE)
                .map_err(|e| io("rendezvous event loop", e))?;
        }
        Ok(Loop {
            poll,
            events: Events::with_capacity(1024),
            pending: vec![true; listeners.len()],
            listeners,
            conns: Vec::new(),
            free: Vec::new(),
            expiry: Default::default(),
            generation: 0,
            retry: None,
            ackers: Default::default(),
            acking: 0,
        })
    }

    /// A listener that may have connections waiting.
    fn pending(&self) -> Option<usize> {
        self.pending.iter().position(|&p| p)
    }

    fn live(&self) -> usize {
        self.conns.len() - self.free.len()
    }

    /// The handshakes that hold a slot: the live connections but those owing an
    /// acknowledgement.
    fn handshaking(&self) -> usize {
        self.live() - self.acking
    }

    /// Counts connection `i` among those owing an acknowledgement once its answer went out;
    /// past [`MAX_ACKING`] of them, the oldest is read once more and dropped.
    fn track(&mut self, i: usize, srv: &mut Server<'_>) -> Vec<(usize, Step)> {
        let mut out = Vec::new();
        if let Some(Some(c)) = self.conns.get_mut(i) {
            if c.acking.is_some() && !c.counted {
                c.counted = true;
                self.acking += 1;
                self.ackers.push_back((i, c.generation));
            }
        }
        while self.acking > MAX_ACKING {
            let Some((j, g)) = self.ackers.pop_front() else {
                break;
            };
            let Some(Some(c)) = self.conns.get_mut(j) else {
                continue;
            };
            if c.generation != g {
                continue;
            }
            match c.advance(srv) {
                Step::Waiting => out.push((j, Step::Dropped(format!(
                    "no acknowledgement while {MAX_ACKING} answered connections waited for theirs (replayed hellos?)"
                )))),
                step => out.push((j, step)),
            }
            // Closed by the caller; not counted twice meanwhile.
            c.counted = false;
            self.acking -= 1;
        }
        out
    }

    /// Whether the entry of the expiry queue is a handshake still under way.
    fn current(&self, &(_, i, g): &(Instant, usize, u64)) -> bool {
        matches!(self.conns.get(i), Some(Some(c)) if c.generation == g)
    }

    fn next_expiry(&mut self) -> Option<Instant> {
        while let Some(front) = self.expiry.front() {
            if self.current(front) {
                return Some(front.0);
            }
            self.expiry.pop_front();
        }
        None
    }

    /// The handshakes past their deadline, whatever they were waiting for, except a rank's
    /// acknowledgement: a rank that proved the token and holds its ids has returned from
    /// its rendezvous, so dropping it would leave rank 0 waiting for it until the whole
    /// deadline (1 run in 3 at 16,384 ranks on 2 cores, its threads slow to send); it is
    /// waited for until the rendezvous' own deadline.
    fn expired(&mut self, now: Instant) -> Vec<(usize, Step)> {
        let mut out = Vec::new();
        while let Some(&front) = self.expiry.front() {
            if self.current(&front) {
                if front.0 > now {
                    break;
                }
                let acking = matches!(self.conns.get(front.1), Some(Some(c)) if c.acking.is_some());
                if !acking {
                    let why = format!("too slow (no complete handshake in {PER_CONNECTION:?})");
                    out.push((front.1, Step::Dropped(why)));
                }
            }
            self.expiry.pop_front();
        }
        out
    }

    /// Waits for events until `wake`, accepts what fits and advances every connection
    /// that can move; returns those that moved, with where they stand.
    fn turn(&mut self, srv: &mut Server<'_>, wake: Instant) -> Result<Vec<(usize, Step)>> {
        // Connections may wait in the queue with no event to come for them (the listener
        // signals arrivals once, and a slot may have freed since): no sleep while any can
        // be accepted, and a short one after an accept that failed for want of resources.
        let wake = match self.retry {
            Some(r) => wake.min(r),
            None => wake,
        };
        let left = if self.pending().is_some()
            && self.handshaking() < MAX_HANDSHAKES
            && self.retry.is_none()
        {
            Duration::ZERO
        } else {
            wake.saturating_duration_since(Instant::now())
        };
        self.retry = None;
        match self.poll.poll(&mut self.events, Some(left)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(io("rendezvous event loop", e)),
        }
        let mut ready: Vec<usize> = Vec::new();
        for ev in self.events.iter() {
            match ev.token() {
                Token(t) if t > LISTENERS => self.pending[usize::MAX - t] = true,
                Token(i) => ready.push(i),
            }
        }
        let mut moved = Vec::with_capacity(ready.len());
        for i in ready {
            if let Some(Some(c)) = self.conns.get_mut(i) {
                let step = c.advance(srv);
                let waiting = matches!(step, Step::Waiting);
                moved.push((i, step));
                if waiting {
                    moved.extend(self.track(i, srv));
                }
            }
        }
        moved.extend(self.accept(srv)?);
        Ok(moved)
    }

    /// Accepts while slots are free (over them the kernel keeps the queue); each new
    /// connection advanced at once (its hello is often there already).
    fn accept(&mut self, srv: &mut Server<'_>) -> Result<Vec<(usize, Step)>> {
        let mut moved = Vec::new();
        while self.handshaking() < MAX_HANDSHAKES {
            let Some(k) = self.pending() else { break };
            let mut s = match self.listeners[k].accept() {
                Ok(x) => x,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    srv.tally.empty_accepts += 1;
                    self.pending[k] = false;
                    continue;
                }
                // Reset or aborted while queued: the next one.
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::Interrupted
                            | ErrorKind::ConnectionAborted
                            | ErrorKind::ConnectionReset
                    ) =>
                {
                    continue
                }
                // No file descriptor or memory now: again in 10 ms (the deadline bounds it).
                Err(_) => {
                    self.retry = Some(Instant::now() + Duration::from_millis(10));
                    break;
                }
            };
            srv.tally.accepted += 1;
            let i = self.free.pop().unwrap_or_else(|| {
                self.conns.push(None);
                self.conns.len() - 1
            });
            let interest = Interest::READABLE | Interest::WRITABLE;
            if let Err(e) = self.poll.registry().register(&mut s, Token(i), interest) {
                self.free.push(i);
                moved.push((usize::MAX, Step::Dropped(format!("event loop: {e}"))));
                continue;
            }
            self.generation += 1;
            let mut c = Conn::new(s, self.generation);
            self.expiry.push_back((c.deadline, i, c.generation));
            let step = c.advance(srv);
            let waiting = matches!(step, Step::Waiting);
            self.conns[i] = Some(c);
            moved.push((i, step));
            if waiting {
                moved.extend(self.track(i, srv));
            }
        }
        Ok(moved)
    }

    fn close(&mut self, i: usize) {
        if let Some(slot) = self.conns.get_mut(i) {
            // Closing the socket takes it out of the epoll set (never duplicated): no
            // deregistration call per handshake.
            // A queue is tried again on its next arrival (each is an event), not whenever a
            // slot frees: retrying every queue at each close was one empty accept per queue
            // per rank, a fifth of rank 0's CPU per rank at 16,384 ranks in five queues.
            if let Some(c) = slot.take() {
                self.free.push(i);
                if c.counted {
                    self.acking -= 1;
                }
            }
        }
    }
}
