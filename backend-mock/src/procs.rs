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

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use unicomm_core::registry::RegKind;
use unicomm_core::{DataType, Error, ReduceOp, Result};

use crate::fabric::{Desc, Exchange, LocalFabric, Msg, Signature};
use crate::shm::Remote;

/// The first bytes of a mock unique id (NCCL's are random: no collision in practice).
const ID_MAGIC: &[u8; 8] = b"UCMOCK01";
/// The largest frame either side accepts.
const MAX_FRAME: usize = 16 << 20;
/// How long a reply may take beyond the deadline the hub enforces itself.
const SLACK: Duration = Duration::from_secs(10);

/// What rank 0 hands the others through the rendezvous: the hub's port and secret.
pub(crate) struct HubId {
    pub port: u16,
    pub secret: [u8; 32],
}

impl HubId {
    pub(crate) fn to_bytes(&self) -> [u8; 128] {
        let mut b = [0u8; 128];
        b[..8].copy_from_slice(ID_MAGIC);
        b[8..10].copy_from_slice(&self.port.to_le_bytes());
        b[10..42].copy_from_slice(&self.secret);
        b
    }
    pub(crate) fn parse(b: &[u8; 128]) -> Result<Self> {
        if &b[..8] != ID_MAGIC {
            return Err(Error::Bootstrap {
                reason: "the unique id is not a mock hub's (rank 0 runs another backend?)".into(),
            });
        }
        let mut secret = [0u8; 32];
        secret.copy_from_slice(&b[10..42]);
        Ok(HubId {
            port: u16::from_le_bytes([b[8], b[9]]),
            secret,
        })
    }
}

// ---------------------------------------------------------------------------------------
// Wire format: a frame is a u32 length and a payload written by `W`, read by `R`.

#[derive(Default)]
struct W(Vec<u8>);

impl W {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn opt<T>(&mut self, v: Option<T>, f: impl FnOnce(&mut Self, T)) -> &mut Self {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                f(self, x);
                self
            }
        }
    }
    fn remote(&mut self, r: Remote) {
        self.u64(r.pid as u64)
            .u64(r.fd as u64)
            .u64(r.id)
            .u64(r.offset as u64);
    }
    fn desc(&mut self, d: &Desc) {
        let s = &d.sig;
        self.str(s.kind).u64(s.count as u64);
        self.opt(s.dtype, |w, t| {
            w.u8(t as u8);
        });
        self.opt(s.op, |w, o| {
            w.u8(o as u8);
        });
        self.opt(s.root, |w, r| {
            w.u64(r as u64);
        });
        self.opt(s.send_reg, |w, k| {
            w.u8(reg_code(k));
        });
        self.opt(s.recv_reg, |w, k| {
            w.u8(reg_code(k));
        });
        self.u64(d.send as u64).u64(d.recv as u64);
        self.opt(d.send_at, W::remote);
        self.opt(d.recv_at, W::remote);
    }
    fn msg(&mut self, m: &Msg) {
        self.u64(m.id)
            .u64(m.addr as u64)
            .u64(m.count as u64)
            .u8(m.dtype as u8);
        self.opt(m.at, W::remote);
    }
    fn error(&mut self, e: &Error) {
        match e {
            Error::Timeout { what, after } => {
                self.u8(0).str(what).u64(after.as_millis() as u64);
            }
            Error::Mismatch { what, detail } => {
                self.u8(2).str(what).str(detail);
            }
            Error::Aborted { reason } => {
                self.u8(1).str(reason);
            }
            other => {
                self.u8(1).str(&other.to_string());
            }
        }
    }
    fn result(&mut self, r: &Result<()>) {
        match r {
            Ok(()) => {
                self.u8(0);
            }
            Err(e) => {
                self.u8(1);
                self.error(e);
            }
        }
    }
}

fn reg_code(k: RegKind) -> u8 {
    match k {
        RegKind::Buffer => 0,
        RegKind::Window => 1,
        RegKind::Auto => 2,
    }
}

/// The collective names a signature can carry (`Kind::name` and the window operations).
const KINDS: &[&str] = &[
    "AllReduce",
    "Broadcast",
    "Reduce",
    "AllGather",
    "ReduceScatter",
    "AlltoAll",
    "Send",
    "Recv",
    "Barrier",
    "WindowRegister",
    "WindowDeregister",
];

/// The fields a `Mismatch` can name (`exec::agree` and send/recv).
const MISMATCH: &[&str] = &[
    "send/recv",
    "operation",
    "count",
    "data type",
    "reduction",
    "root",
    "registration of the send buffer",
    "registration of the receive buffer",
];

struct R<'a>(&'a [u8]);

fn bad(what: &str) -> Error {
    Error::Aborted {
        reason: format!("the mock's exchange received a malformed message ({what})"),
    }
}

impl R<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        if self.0.len() < n {
            return Err(bad("truncated"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn usize(&mut self) -> Result<usize> {
        usize::try_from(self.u64()?).map_err(|_| bad("size"))
    }
    fn str(&mut self) -> Result<String> {
        let n = self.usize()?;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| bad("text"))
    }
    fn opt<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<Option<T>> {
        match self.u8()? {
            0 => Ok(None),
            1 => f(self).map(Some),
            _ => Err(bad("option")),
        }
    }
    fn dtype(&mut self) -> Result<DataType> {
        let c = self.u8()?;
        DataType::ALL
            .into_iter()
            .find(|t| *t as u8 == c)
            .ok_or_else(|| bad("data type"))
    }
    fn reg(&mut self) -> Result<RegKind> {
        match self.u8()? {
            0 => Ok(RegKind::Buffer),
            1 => Ok(RegKind::Window),
            2 => Ok(RegKind::Auto),
            _ => Err(bad("registration")),
        }
    }
    fn remote(&mut self) -> Result<Remote> {
        Ok(Remote {
            pid: u32::try_from(self.u64()?).map_err(|_| bad("pid"))?,
            fd: i32::try_from(self.u64()? as i64).map_err(|_| bad("fd"))?,
            id: self.u64()?,
            offset: self.usize()?,
        })
    }
    fn desc(&mut self) -> Result<Desc> {
        let kind = self.str()?;
        let kind = KINDS
            .iter()
            .copied()
            .find(|k| *k == kind)
            .ok_or_else(|| bad("operation"))?;
        let sig = Signature {
            kind,
            count: self.usize()?,
            dtype: self.opt(R::dtype)?,
            op: self.opt(|r| {
                let c = r.u8()?;
                ReduceOp::ALL
                    .into_iter()
                    .find(|o| *o as u8 == c)
                    .ok_or_else(|| bad("reduction"))
            })?,
            root: self.opt(R::usize)?,
            send_reg: self.opt(R::reg)?,
            recv_reg: self.opt(R::reg)?,
        };
        Ok(Desc {
            sig,
            send: self.usize()?,
            recv: self.usize()?,
            send_at: self.opt(R::remote)?,
            recv_at: self.opt(R::remote)?,
        })
    }
    fn msg(&mut self) -> Result<Msg> {
        Ok(Msg {
            id: self.u64()?,
            addr: self.usize()?,
            count: self.usize()?,
            dtype: self.dtype()?,
            at: self.opt(R::remote)?,
        })
    }
    fn error(&mut self) -> Result<Error> {
        Ok(match self.u8()? {
            0 => Error::Timeout {
                what: self.str()?,
                after: Duration::from_millis(self.u64()?),
            },
            2 => {
                let what = self.str()?;
                Error::Mismatch {
                    what: MISMATCH
                        .iter()
                        .copied()
                        .find(|m| *m == what)
                        .unwrap_or("operation"),
                    detail: self.str()?,
                }
            }
            _ => Error::Aborted {
                reason: self.str()?,
            },
        })
    }
    fn result(&mut self) -> Result<Result<()>> {
        Ok(match self.u8()? {
            0 => Ok(()),
            _ => Err(self.error()?),
        })
    }
}

fn send_frame(s: &mut TcpStream, payload: &[u8]) -> std::io::Result<()> {
    let mut b = Vec::with_capacity(4 + payload.len());
    b.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    b.extend_from_slice(payload);
    s.write_all(&b)
}

fn recv_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut n = [0u8; 4];
    s.read_exact(&mut n)?;
    let n = u32::from_le_bytes(n) as usize;
    if n > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    let mut b = vec![0u8; n];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// Requests a rank sends the hub (the [`Exchange`] methods).
mod op {
    pub const GATHER: u8 = 1;
    pub const PHASE: u8 = 2;
    pub const ENTER: u8 = 3;
    pub const EXIT: u8 = 4;
    pub const LEAVE: u8 = 5;
    pub const POST: u8 = 6;
    pub const TAKE: u8 = 7;
    pub const COMPLETE: u8 = 8;
    pub const WAIT_SENT: u8 = 9;
    pub const POISON: u8 = 10;
    pub const BYE: u8 = 11;
}

/// The two kinds of connection: one for a rank's life, others for its requests.
const LIFE: u8 = 1;
const CALLS: u8 = 2;

fn secret_ok(a: &[u8], b: &[u8; 32]) -> bool {
    a.len() == 32 && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

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
    fabric: LocalFabric,
    world: usize,
    timeout: Duration,
    secret: [u8; 32],
    lives: Mutex<Vec<Life>>,
    cv: Condvar,
    /// Per rank, the collectives whose peer memory it is accessing and the messages it is
    /// copying: released for it when its process dies (it will never end them itself).
    open: Mutex<HashMap<usize, Open>>,
    stop: AtomicBool,
}

impl Hub {
    /// Starts the hub: listens on 127.0.0.1 (a port the system picks) until rank 0's
    /// fabric is dropped.
    pub(crate) fn start(world: usize, timeout: Duration) -> Result<(Arc<Hub>, HubId)> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| Error::Bootstrap {
            reason: format!("no randomness for the mock's hub: {e}"),
        })?;
        let listener =
            TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).map_err(|e| {
                Error::Bootstrap {
                    reason: format!("the mock's hub cannot listen on 127.0.0.1: {e}"),
                }
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
        });
        let weak = Arc::downgrade(&hub);
        std::thread::Builder::new()
            .name("unicomm-mock-hub".into())
            .spawn(move || accept_loop(listener, weak))
            .map_err(|e| Error::Bootstrap {
                reason: format!("the mock's hub thread: {e}"),
            })?;
        Ok((hub, HubId { port, secret }))
    }

    fn lives(&self) -> std::sync::MutexGuard<'_, Vec<Life>> {
        self.lives.lock().unwrap_or_else(|e| e.into_inner())
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
        self.fabric.poison(Error::Aborted {
            reason: format!(
                "rank {rank}'s process exited (or dropped its communicator) without finalizing"
            ),
        });
        for seq in entered {
            self.fabric.exit(seq);
        }
        for id in taking {
            self.fabric.complete(
                id,
                Some(Error::Aborted {
                    reason: format!("rank {rank}'s process exited while receiving"),
                }),
            );
        }
    }

    /// Rank 0 finalizes: the hub serves until every other rank finalized or died, at most
    /// `timeout`.
    fn wait_departures(&self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let mut lives = self.lives();
        loop {
            let waiting: Vec<usize> = (1..self.world)
                .filter(|&r| lives[r] == Life::Live || lives[r] == Life::Absent)
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

    /// Serves one request of `rank`.
    fn serve(&self, rank: usize, req: &[u8]) -> Result<Vec<u8>> {
        let mut r = R(req);
        let f = &self.fabric;
        let mut w = W::default();
        let within = |ms: u64| Instant::now() + Duration::from_millis(ms.min(86_400_000));
        match r.u8()? {
            op::GATHER => {
                let (seq, ms, desc) = (r.u64()?, r.u64()?, r.desc()?);
                match f.gather(seq, rank, desc, within(ms)) {
                    Ok(all) => {
                        w.u8(0).u64(all.len() as u64);
                        for d in &all {
                            w.desc(d);
                        }
                    }
                    Err(e) => {
                        w.u8(1).error(&e);
                    }
                }
            }
            op::PHASE => {
                let (seq, phase, ms) = (r.u64()?, r.u64()?, r.u64()?);
                let phase = u32::try_from(phase).map_err(|_| bad("phase"))?;
                w.result(&f.phase(seq, rank, phase, within(ms)));
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
                let (seq, failed) = (r.u64()?, r.u8()? != 0);
                f.leave(seq, failed);
                w.result(&Ok(()));
            }
            op::POST => {
                let (dst, msg) = (r.usize()?, r.msg()?);
                w.result(&f.post(rank, dst, msg));
            }
            op::TAKE => {
                let (src, ms, after) = (r.usize()?, r.u64()?, r.u64()?);
                match f.take(src, rank, within(ms), Duration::from_millis(after)) {
                    Ok(m) => {
                        self.track(rank, m.id, false, true);
                        w.u8(0).msg(&m);
                    }
                    Err(e) => {
                        w.u8(1).error(&e);
                    }
                }
            }
            op::COMPLETE => {
                let id = r.u64()?;
                let refused = r.opt(R::error)?;
                self.track(rank, id, false, false);
                f.complete(id, refused);
                w.result(&Ok(()));
            }
            op::WAIT_SENT => {
                let (id, dst, ms, after) = (r.u64()?, r.usize()?, r.u64()?, r.u64()?);
                w.result(&f.wait_sent(id, dst, within(ms), Duration::from_millis(after)));
            }
            op::POISON => {
                f.poison(r.error()?);
                w.result(&Ok(()));
            }
            _ => return Err(bad("request")),
        }
        Ok(w.0)
    }
}

fn accept_loop(listener: TcpListener, hub: Weak<Hub>) {
    loop {
        let Some(h) = hub.upgrade() else { return };
        if h.stop.load(Ordering::Relaxed) {
            return;
        }
        match listener.accept() {
            Ok((s, peer)) if peer.ip().is_loopback() => {
                let weak = hub.clone();
                let _ = std::thread::Builder::new()
                    .name("unicomm-mock-hub-conn".into())
                    .spawn(move || connection(s, weak));
            }
            Ok(_) => {} // not from this machine: dropped
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                drop(h);
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// One connection: a hello (secret, rank, kind) within 10 s, then the rank's life or its
/// requests.
fn connection(mut s: TcpStream, hub: Weak<Hub>) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let Ok(hello) = recv_frame(&mut s) else {
        return;
    };
    let Some(h) = hub.upgrade() else { return };
    let mut r = R(&hello);
    let (Ok(secret), Ok(rank), Ok(kind)) = (r.take(32).map(<[u8]>::to_vec), r.usize(), r.u8())
    else {
        eprintln!("unicomm mock hub: a malformed hello was dropped");
        return;
    };
    if !secret_ok(&secret, &h.secret) || rank == 0 || rank >= h.world {
        eprintln!("unicomm mock hub: a connection without the job's secret (or with rank {rank}) was dropped");
        return;
    }
    match kind {
        LIFE => {
            {
                let mut lives = h.lives();
                if lives[rank] != Life::Absent {
                    eprintln!("unicomm mock hub: rank {rank} joined twice; the second was dropped");
                    return;
                }
                lives[rank] = Life::Live;
            }
            h.cv.notify_all();
            if send_frame(&mut s, &[0]).is_err() {
                return;
            }
            drop(h);
            life(s, hub, rank);
        }
        CALLS => {
            if h.lives()[rank] != Life::Live {
                return;
            }
            drop(h);
            let _ = s.set_read_timeout(None);
            while let Ok(req) = recv_frame(&mut s) {
                let Some(h) = hub.upgrade() else { return };
                let reply = match h.serve(rank, &req) {
                    Ok(w) => w,
                    Err(_) => return,
                };
                if send_frame(&mut s, &reply).is_err() {
                    return;
                }
            }
        }
        _ => {}
    }
}

/// A rank's life connection: watches for its end and hands it the world's poison.
fn life(mut s: TcpStream, hub: Weak<Hub>, rank: usize) {
    let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
    let mut told = false;
    let mut byte = [0u8; 1];
    loop {
        let Some(h) = hub.upgrade() else { return };
        let closed = match s.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => {
                if byte[0] == op::BYE {
                    h.lives()[rank] = Life::Departed;
                    h.cv.notify_all();
                }
                false
            }
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock
                    | std::io::ErrorKind::TimedOut
                    | std::io::ErrorKind::Interrupted
            ),
        };
        if closed {
            let mut lives = h.lives();
            if lives[rank] == Life::Live {
                lives[rank] = Life::Dead;
                drop(lives);
                h.died(rank);
            }
            h.cv.notify_all();
            return;
        }
        if !told {
            if let Some(e) = h.fabric.poisoned() {
                let mut w = W::default();
                w.error(&e);
                told = send_frame(&mut s, &w.0).is_ok();
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// A rank in another process.

pub(crate) struct Client {
    addr: SocketAddr,
    secret: [u8; 32],
    rank: usize,
    pool: Mutex<Vec<TcpStream>>,
    poison: Arc<Mutex<Option<Error>>>,
    life: Mutex<Option<TcpStream>>,
    departing: Arc<AtomicBool>,
}

impl Client {
    pub(crate) fn connect(id: &HubId, rank: usize, timeout: Duration) -> Result<Arc<Client>> {
        let c = Client {
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, id.port)),
            secret: id.secret,
            rank,
            pool: Mutex::new(Vec::new()),
            poison: Arc::new(Mutex::new(None)),
            life: Mutex::new(None),
            departing: Arc::new(AtomicBool::new(false)),
        };
        let mut s = c.open(LIFE, timeout)?;
        let ok = recv_frame(&mut s).map_err(|e| Error::Bootstrap {
            reason: format!("rank {rank}: the mock's hub refused this rank (claimed twice?): {e}"),
        })?;
        if ok != [0] {
            return Err(bad("hub hello"));
        }
        let reader = s.try_clone().map_err(|e| Error::Bootstrap {
            reason: format!("the mock's hub connection: {e}"),
        })?;
        *c.life.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
        let (poison, departing) = (c.poison.clone(), c.departing.clone());
        std::thread::Builder::new()
            .name("unicomm-mock-life".into())
            .spawn(move || watch_hub(reader, poison, departing))
            .map_err(|e| Error::Bootstrap {
                reason: format!("the mock's hub watcher: {e}"),
            })?;
        Ok(Arc::new(c))
    }

    /// A new authenticated connection of `kind`.
    fn open(&self, kind: u8, timeout: Duration) -> Result<TcpStream> {
        let mut s = TcpStream::connect_timeout(&self.addr, timeout.min(Duration::from_secs(30)))
            .map_err(|e| Error::Aborted {
                reason: format!(
                    "rank {}: cannot reach the mock's hub (rank 0's process) at {}: {e}",
                    self.rank, self.addr
                ),
            })?;
        let _ = s.set_nodelay(true);
        let mut w = W::default();
        w.0.extend_from_slice(&self.secret);
        w.u64(self.rank as u64).u8(kind);
        send_frame(&mut s, &w.0).map_err(|e| self.lost(e))?;
        Ok(s)
    }

    fn lost(&self, e: std::io::Error) -> Error {
        let err = Error::Aborted {
            reason: format!(
                "rank {}: the connection to the mock's hub (rank 0's process) failed: {e}; rank 0's process exited",
                self.rank
            ),
        };
        self.poison
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(err.clone());
        err
    }

    /// One request and its reply; `wait` is how long the hub may take.
    fn call(&self, req: &[u8], wait: Duration) -> Result<Vec<u8>> {
        let pooled = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut s = match pooled {
            Some(s) => s,
            None => self.open(CALLS, wait)?,
        };
        let _ = s.set_read_timeout(Some(wait + SLACK));
        send_frame(&mut s, req).map_err(|e| self.lost(e))?;
        let reply = match recv_frame(&mut s) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Error::Timeout {
                    what: format!("rank {}: the mock's hub did not answer", self.rank),
                    after: wait + SLACK,
                })
            }
            Err(e) => return Err(self.lost(e)),
        };
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).push(s);
        Ok(reply)
    }

    fn call_result(&self, req: &W, wait: Duration) -> Result<()> {
        let reply = self.call(&req.0, wait)?;
        R(&reply).result()?
    }

    /// Tells the hub this rank finalized (its connections closing next is no failure).
    fn bye(&self) {
        self.departing.store(true, Ordering::Relaxed);
        if let Some(s) = self.life.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            let _ = s.write_all(&[op::BYE]);
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(s) = self.life.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn watch_hub(mut s: TcpStream, poison: Arc<Mutex<Option<Error>>>, departing: Arc<AtomicBool>) {
    let _ = s.set_read_timeout(None);
    let e = match recv_frame(&mut s) {
        Ok(frame) => R(&frame).error().unwrap_or_else(|e| e),
        Err(_) if departing.load(Ordering::Relaxed) => return,
        Err(e) => Error::Aborted {
            reason: format!(
                "the mock's hub (rank 0's process) closed the connection ({e}): rank 0's process exited"
            ),
        },
    };
    poison
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert(e);
}

// ---------------------------------------------------------------------------------------
// The fabric of a rank in a multi-process world.

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
                    0 => {
                        let n = r.usize()?;
                        if n > crate::MAX_RANKS {
                            return Err(bad("world"));
                        }
                        (0..n).map(|_| r.desc()).collect::<Result<Vec<_>>>()?
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

    fn leave(&self, seq: u64, failed: bool) {
        match &self.link {
            Link::Hub(h) => h.fabric.leave(seq, failed),
            Link::Client(c) => {
                let mut w = W::default();
                w.u8(op::LEAVE).u64(seq).u8(u8::from(failed));
                let _ = c.call_result(&w, Duration::from_secs(60));
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
            Link::Client(c) => {
                let ms = remaining(deadline);
                let mut w = W::default();
                w.u8(op::TAKE)
                    .u64(src as u64)
                    .u64(ms)
                    .u64(after.as_millis() as u64);
                let reply = c.call(&w.0, Duration::from_millis(ms))?;
                let mut r = R(&reply);
                match r.u8()? {
                    0 => r.msg()?,
                    _ => return Err(r.error()?),
                }
            }
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

    fn depart(&self, timeout: Duration) -> Result<()> {
        match &self.link {
            Link::Hub(h) => h.wait_departures(timeout),
            Link::Client(c) => {
                c.bye();
                Ok(())
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
