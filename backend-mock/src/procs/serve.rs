//! The hub's event loop (`mio`, one thread): accepts the ranks' connections, authenticates
//! their hellos and serves every rank's requests. A request that waits for peers (a gather,
//! a barrier, a receive) becomes a [`Wait`] checked whenever the exchange changes, so the
//! hub holds no thread per rank: a thousand ranks' requests are served by this one thread
//! and their lives watched by one other (`life.rs`).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

use super::wire::*;

mod admit;
use crate::fabric::{Desc, Done, LocalFabric, Wait};

pub(crate) const LISTENER: Token = Token(0);
pub(crate) const WAKER: Token = Token(1);
/// The longest sleep: how soon the loop sees the hub stopped.
const TICK: Duration = Duration::from_millis(50);

/// The most connections the hub holds before they authenticate; beyond them it stops
/// accepting and the kernel queues the rest (the job's ranks open two each).
pub(crate) const MAX_UNAUTHENTICATED: usize = 32;
/// What a connection may send before it authenticates: its hello (secret, rank, kind).
pub(crate) const MAX_HELLO: usize = 64;
/// How long a connection has to authenticate.
pub(crate) const HELLO_WITHIN: Duration = Duration::from_secs(2);

/// What a request of a rank comes to: its reply now, or a wait for its peers (until the
/// deadline) whose end is the reply.
pub(crate) enum Step {
    Reply(Vec<u8>),
    Wait(Wait, Instant),
}

/// What the loop serves: the hub, which owns the world's lives and its exchange.
pub(crate) trait Host: Send + Sync + 'static {
    /// The exchange the ranks' waits are checked against.
    fn fabric(&self) -> &LocalFabric;
    /// The hub is shutting down.
    fn stopped(&self) -> bool;
    /// The rank and kind of an authenticated hello; a refusal for one that proved the
    /// job's secret but not its rank or world; `Err(None)` for a stranger's.
    fn authenticate(&self, hello: &[u8]) -> std::result::Result<(usize, u8), Option<Refusal>>;
    /// The world's size (what a refusal names).
    fn world(&self) -> usize;
    /// `rank`'s life connection arrived: `false` if it had one already.
    fn join(&self, rank: usize) -> bool;
    /// Whether `rank` is live (its requests are served).
    fn live(&self, rank: usize) -> bool;
    /// Hands `rank`'s acknowledged life connection to the watcher.
    fn watch_life(&self, rank: usize, s: std::net::TcpStream);
    /// `rank`'s life connection ended before it was watched.
    fn life_ended(&self, rank: usize);
    /// Starts one request of `rank`; `Err` for a malformed one.
    fn begin(&self, rank: usize, req: &[u8]) -> unicomm_core::Result<Step>;
    /// `rank` took message `id`: tracked until it completes it (released for it if its
    /// process dies meanwhile).
    fn took(&self, rank: usize, id: u64);
}

enum Stage {
    /// Not authenticated: its hello (at most `MAX_HELLO` bytes) due by the deadline.
    Hello(Instant),
    /// A rank's requests, one at a time; `busy` while one waits for its peers.
    Calls { rank: usize, busy: bool },
}

struct Conn {
    s: TcpStream,
    inb: Vec<u8>,
    out: Vec<u8>,
    stage: Stage,
    /// Registered for writing too (a reply did not fit the socket).
    writing: bool,
    /// Reading stopped with a whole frame buffered: the socket may hold more.
    more: bool,
}

/// The loop's connections and its ranks' open waits.
struct Served {
    conns: HashMap<Token, Conn>,
    waits: Vec<(Token, Wait, Instant)>,
    next: usize,
    /// Every rank's descriptions of a collective, published once in shared memory for the
    /// ranks to read, kept until the collective's slot is gone (every rank left it: the
    /// fabric dropped its reference).
    published: Published,
}

/// Gathers' descriptions published in shared memory, each with the descriptions it holds.
type Published = Vec<(Arc<[Desc]>, crate::shm::Segment)>;

/// A gather's reply above this size is published in shared memory and the ranks are told
/// where: the hub then writes O(world) bytes per collective, not O(world^2) (at 1,024
/// ranks 118 KB to each, 120 MB per collective, which the one loop could not write while
/// a thousand processes competed for the CPU).
#[cfg(not(test))]
const SHARED_REPLY: usize = 16 << 10;
/// In the unit tests, small worlds take the shared-memory path too.
#[cfg(test)]
const SHARED_REPLY: usize = 1 << 10;

/// Runs the hub's loop on `poll` (with the fabric's waker at [`WAKER`]) until the hub is
/// dropped or stopped.
pub(crate) fn run<H: Host>(mut poll: Poll, listener: std::net::TcpListener, hub: Weak<H>) {
    let mut listener = TcpListener::from_std(listener);
    if poll
        .registry()
        .register(&mut listener, LISTENER, Interest::READABLE)
        .is_err()
    {
        tracing::warn!("unicomm mock hub: its listener cannot be watched; no rank can join");
        return;
    }
    let mut sv = Served {
        conns: HashMap::new(),
        waits: Vec::new(),
        next: 2,
        published: Vec::new(),
    };
    let mut events = Events::with_capacity(1024);
    loop {
        let wake = sv
            .next_deadline()
            .map(|d| d.saturating_duration_since(Instant::now()));
        if poll
            .poll(&mut events, Some(wake.map_or(TICK, |w| w.min(TICK))))
            .is_err()
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        let Some(h) = hub.upgrade() else { return };
        if h.stopped() {
            return;
        }
        let mut ready: Vec<Token> = Vec::new();
        for ev in events.iter() {
            let t = ev.token();
            if t == LISTENER || t == WAKER {
                continue;
            }
            if ev.is_writable() {
                sv.flush(&poll, t);
            }
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                ready.push(t);
            }
        }
        sv.accept(&poll, &listener, &mut ready);
        // Connections that stopped reading with a whole frame buffered (edge-triggered: no
        // new event comes for the bytes left in the socket).
        ready.extend(sv.conns.iter().filter(|(_, c)| c.more).map(|(t, _)| *t));
        for t in ready {
            sv.read(&poll, &h, t);
        }
        sv.check(&poll, &h);
        // A collective every rank left: its published descriptions are read by all.
        sv.published.retain(|(all, _)| Arc::strong_count(all) > 1);
        sv.expire_hellos(&poll);
    }
}

impl Served {
    fn next_deadline(&self) -> Option<Instant> {
        let hellos = self.conns.values().filter_map(|c| match c.stage {
            Stage::Hello(d) => Some(d),
            Stage::Calls { .. } => None,
        });
        let waits = self
            .waits
            .iter()
            .filter(|(_, w, _)| w.has_deadline())
            .map(|(_, _, d)| *d);
        hellos.chain(waits).min()
    }

    fn close(&mut self, poll: &Poll, t: Token) {
        if let Some(mut c) = self.conns.remove(&t) {
            let _ = poll.registry().deregister(&mut c.s);
        }
        self.waits.retain(|(k, _, _)| *k != t);
    }

    /// Reads what `t` sent and acts on its complete frames; closes it at its end or on a
    /// frame it may not send.
    fn read<H: Host>(&mut self, poll: &Poll, h: &Arc<H>, t: Token) {
        let Some(c) = self.conns.get_mut(&t) else {
            return;
        };
        let cap = match c.stage {
            Stage::Hello(_) => 4 + MAX_HELLO,
            Stage::Calls { .. } => 4 + MAX_FRAME,
        };
        let mut b = [0u8; 16 << 10];
        c.more = false;
        let open = loop {
            let room = cap.saturating_sub(c.inb.len()).min(b.len());
            if room == 0 {
                c.more = true; // a whole frame is here at most: acted on first
                break true;
            }
            match c.s.read(&mut b[..room]) {
                Ok(0) => break false,
                Ok(n) => c.inb.extend_from_slice(&b[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break true,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break false,
            }
        };
        if !self.frames(poll, h, t) || !open {
            self.close(poll, t);
        }
    }

    /// Acts on `t`'s complete frames while it is not waiting; `false` to close it.
    fn frames<H: Host>(&mut self, poll: &Poll, h: &Arc<H>, t: Token) -> bool {
        loop {
            let Some(c) = self.conns.get_mut(&t) else {
                return false;
            };
            let max = match c.stage {
                Stage::Hello(_) => MAX_HELLO,
                Stage::Calls { busy: true, .. } => return true,
                Stage::Calls { .. } => MAX_FRAME,
            };
            let Some(n) = c
                .inb
                .get(..4)
                .map(|n| u32::from_le_bytes([n[0], n[1], n[2], n[3]]))
            else {
                return true;
            };
            let n = n as usize;
            if n > max {
                return false; // announced more than it may send: not read, not made room for
            }
            if c.inb.len() < 4 + n {
                return true;
            }
            let frame: Vec<u8> = c.inb.drain(..4 + n).skip(4).collect();
            let ok = match c.stage {
                Stage::Hello(_) => self.hello(poll, h, t, &frame),
                Stage::Calls { rank, .. } => self.request(h, t, rank, &frame),
            };
            if !ok {
                return false;
            }
            self.flush(poll, t);
        }
    }

    /// One request of `rank` on `t`: answered now, or waiting for its peers.
    fn request<H: Host>(&mut self, h: &Arc<H>, t: Token, rank: usize, req: &[u8]) -> bool {
        let Some(c) = self.conns.get_mut(&t) else {
            return false;
        };
        match h.begin(rank, req) {
            Ok(Step::Reply(r)) => queue(c, &r),
            Ok(Step::Wait(w, deadline)) => {
                c.stage = Stage::Calls { rank, busy: true };
                self.waits.push((t, w, deadline));
            }
            Err(_) => return false,
        }
        true
    }

    /// Checks every open wait; the ended ones are answered and their connections read on.
    /// The ranks of one collective get the same descriptions: encoded once for all of them.
    fn check<H: Host>(&mut self, poll: &Poll, h: &Arc<H>) {
        if self.waits.is_empty() {
            return;
        }
        let mut encoded: HashMap<usize, Vec<u8>> = HashMap::new();
        for (t, r) in h.fabric().check_all(&mut self.waits, Instant::now()) {
            let Some(c) = self.conns.get_mut(&t) else {
                continue;
            };
            let Stage::Calls { rank, .. } = c.stage else {
                continue;
            };
            c.stage = Stage::Calls { rank, busy: false };
            if let Ok(Done::Msg(m)) = &r {
                h.took(rank, m.id);
            }
            match &r {
                Ok(Done::Descs(all)) => {
                    let key = Arc::as_ptr(all) as *const () as usize;
                    let published = &mut self.published;
                    queue(
                        c,
                        encoded
                            .entry(key)
                            .or_insert_with(|| publish(published, all, &r)),
                    );
                }
                _ => queue(c, &encode(&r)),
            }
            self.flush(poll, t);
            if !self.frames(poll, h, t) {
                self.close(poll, t);
            }
        }
    }

    fn expire_hellos(&mut self, poll: &Poll) {
        let now = Instant::now();
        let late: Vec<Token> = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.stage, Stage::Hello(d) if d <= now))
            .map(|(t, _)| *t)
            .collect();
        for t in late {
            self.close(poll, t);
        }
    }

    /// Writes what `t` has queued; what the socket does not take waits for it to be writable.
    fn flush(&mut self, poll: &Poll, t: Token) {
        let Some(c) = self.conns.get_mut(&t) else {
            return;
        };
        let mut failed = false;
        while !c.out.is_empty() {
            match c.s.write(&c.out) {
                Ok(0) => {
                    failed = true;
                    break;
                }
                Ok(n) => {
                    c.out.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            self.close(poll, t);
            return;
        }
        let want = !c.out.is_empty();
        if want != c.writing {
            let interest = if want {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            if poll.registry().reregister(&mut c.s, t, interest).is_ok() {
                c.writing = want;
            }
        }
    }
}

/// Appends `payload` as a frame to `c`'s output.
fn queue(c: &mut Conn, payload: &[u8]) {
    c.out
        .extend_from_slice(&(payload.len() as u32).to_le_bytes());
    c.out.extend_from_slice(payload);
}

/// A gather's reply: above [`SHARED_REPLY`] written once to shared memory (kept in
/// `published` with the descriptions it holds) and the reply says where; else `r` itself.
fn publish(
    published: &mut Published,
    all: &Arc<[Desc]>,
    r: &unicomm_core::Result<Done>,
) -> Vec<u8> {
    let full = encode(r);
    if full.len() <= SHARED_REPLY {
        return full;
    }
    match crate::shm::Segment::with(&full) {
        Ok(seg) => {
            let mut w = W::default();
            w.u8(2).remote(seg.remote(0));
            w.u64(full.len() as u64);
            published.push((all.clone(), seg));
            w.0
        }
        // No shared memory to be had: the whole reply on the socket.
        Err(_) => full,
    }
}

/// The reply to a request that waited: its result, as the request's code expects it.
fn encode(r: &unicomm_core::Result<Done>) -> Vec<u8> {
    let mut w = W::default();
    match r {
        Ok(Done::Descs(all)) => {
            w.u8(0).u64(all.len() as u64);
            for d in all.iter() {
                w.desc(d);
            }
        }
        Ok(Done::Msg(m)) => {
            w.u8(0).msg(m);
        }
        Ok(Done::Unit) => {
            w.u8(0);
        }
        Err(e) => {
            w.u8(1).error(e);
        }
    }
    w.0
}
