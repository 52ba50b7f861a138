//! Device memory shared between the processes of one job on one host (the copy-engine path
//! with one rank per process): each rank exports its window's allocation as a POSIX file
//! descriptor (cuMem / hipMem), and the ranks swap the descriptors over Unix-domain sockets
//! (`SCM_RIGHTS`), as NCCL itself does for its cuMem buffers.
//!
//! Security: a rank's listener lives in the abstract namespace under a name derived from the
//! communicator's unique id (which only the job's ranks know) and the registration's number;
//! both ends check the other's user id (`SO_PEERCRED`: only processes of the same user,
//! which could read this process's memory anyway, are talked to) and every offer carries a
//! key derived from the unique id. A connection that fails a check is dropped and logged,
//! and the exchange goes on; one deadline bounds it all.
//!
//! Agreement: every rank must come to the same answer (all ranks take the copy-engine path
//! for a window, or none does), or one rank would wait in a collective its peers never
//! call. A rank's answer is yes when it reached every peer, exported its own memory and
//! imported every peer's; it sends that answer back on each connection it accepted and
//! reads the peers' answers on the connections it opened; the window takes the path when
//! every answer is yes. Ranks on other hosts are simply unreachable (their names exist on
//! their own host only): the answer is then no everywhere.

#![allow(
    unsafe_code,
    reason = "calls the NCCL-API library or the device runtime at its call sites (the architecture test's UNSAFE_FILES lists them)"
)]

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use nix::sys::socket::{self, sockopt, ControlMessage, ControlMessageOwned, MsgFlags};
use unicomm_core::{Error, Result};

/// What identifies one communicator's exchanges: the listener names' tag and the key every
/// offer carries, both derived from the communicator's unique id.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Job {
    tag: [u8; 16],
    key: [u8; 16],
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Job({})", hex(&self.tag)) // never the key
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// FNV-1a over `data` from `seed` (names and keys, not a cryptographic hash: the secret is
/// the unique id itself, and only the same user's processes are ever talked to).
fn fnv(seed: u64, data: &[u8]) -> u64 {
    data.iter().fold(seed ^ 0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl Job {
    /// The job of the communicator created from `id` (the unique id's bytes).
    pub fn from_id(id: &[u8]) -> Job {
        let part = |i: u64| fnv(i.wrapping_mul(0x9e37_79b9_7f4a_7c15), id).to_le_bytes();
        let mut tag = [0; 16];
        let mut key = [0; 16];
        tag[..8].copy_from_slice(&part(1));
        tag[8..].copy_from_slice(&part(2));
        key[..8].copy_from_slice(&part(3));
        key[8..].copy_from_slice(&part(4));
        Job { tag, key }
    }

    /// The job of the child of split number `split` with `color` of this job's
    /// communicator: its own names and key, derived from this job's secret key (which the
    /// child's members share, and nobody else has).
    pub fn child(&self, split: u64, color: u32) -> Job {
        let mut id = Vec::with_capacity(44);
        id.extend_from_slice(&self.key);
        id.extend_from_slice(&self.tag);
        id.extend_from_slice(&split.to_le_bytes());
        id.extend_from_slice(&color.to_le_bytes());
        Job::from_id(&id)
    }

    /// The abstract socket name of `rank`'s listener for exchange number `seq`.
    pub fn name(&self, seq: u64, rank: usize) -> String {
        format!("unicomm-ce-{}-{seq}-{rank}", hex(&self.tag))
    }
}

/// One rank's side of an exported allocation, as its peers need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offer {
    /// The allocation's size (what the importer maps).
    pub size: u64,
    /// Where the window starts in the allocation.
    pub offset: u64,
    /// The window's bytes.
    pub bytes: u64,
}

const MAGIC: &[u8; 8] = b"UNICOMM1";
/// How long one accepted connection may take to deliver its offer.
const PER_OFFER: Duration = Duration::from_secs(2);
const MSG: usize = 8 + 16 + 8 + 4 + 4 + 4 + 8 + 8 + 8;

/// A rank's listener for registration `seq`, bound before the peers are told to connect.
pub struct Listener {
    sock: UnixListener,
    job: Job,
    seq: u64,
    rank: usize,
}

impl Listener {
    /// Binds rank `rank`'s abstract socket for registration `seq`.
    pub fn bind(job: Job, seq: u64, rank: usize) -> Result<Listener> {
        let name = job.name(seq, rank);
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| io("name", e))?;
        let sock = UnixListener::bind_addr(&addr).map_err(|e| {
            io(
                "binding the copy-engine exchange's socket (is another process using this communicator's name?)",
                e,
            )
        })?;
        sock.set_nonblocking(true).map_err(|e| io("socket", e))?;
        Ok(Listener {
            sock,
            job,
            seq,
            rank,
        })
    }
}

fn io(what: &str, e: impl std::fmt::Display) -> Error {
    Error::invalid("copy-engine exchange", format!("{what}: {e}"))
}

/// Swaps this rank's offer (`mine`: the offer and its descriptor, `None` when its memory
/// could not be exported) with every peer's, imports each peer's with `import` (which
/// keeps what it mapped: on an error or a no, the caller unmaps it), and returns whether
/// every rank agreed to take the path; at most until `deadline` (then `Timeout`, naming
/// the ranks that never answered).
pub fn exchange(
    listener: &Listener,
    world: usize,
    mine: Option<(Offer, BorrowedFd<'_>)>,
    deadline: Instant,
    import: impl FnMut(usize, &Offer, BorrowedFd<'_>) -> Result<()>,
) -> Result<bool> {
    let round = Round {
        job: listener.job,
        seq: listener.seq,
        rank: listener.rank,
        world,
        me: uid(),
        deadline,
        start: Instant::now(),
    };
    // 1. Offer: to every peer's listener (bound before the barrier that preceded this).
    let mut outgoing = Vec::new();
    let mut reached_all = true;
    for p in (0..world).filter(|&p| p != round.rank) {
        match round.offer_to(p, mine)? {
            Some(s) => outgoing.push((p, s)),
            None => reached_all = false,
        }
    }
    // 2. Accept the peers' offers: as many as this rank reached (reachability is
    // symmetric: on one host every listener was bound before anyone connected).
    let (mut incoming, imported) = round.accept(listener, &outgoing, import)?;
    // 3. Agree: answer every accepted connection, read every opened one's answer.
    round.agree(
        &mut incoming,
        &mut outgoing,
        reached_all && mine.is_some() && imported,
    )
}

/// One exchange as this rank takes part in it: which (job, registration), who (rank, world,
/// this process's user), and until when.
struct Round {
    job: Job,
    seq: u64,
    rank: usize,
    world: usize,
    me: u32,
    deadline: Instant,
    start: Instant,
}

impl Round {
    /// Accepts one offer from each peer this rank reached, importing each: the accepted
    /// connections and whether every import succeeded (and every peer had memory to offer).
    fn accept(
        &self,
        listener: &Listener,
        outgoing: &[(usize, UnixStream)],
        mut import: impl FnMut(usize, &Offer, BorrowedFd<'_>) -> Result<()>,
    ) -> Result<(Vec<(usize, UnixStream)>, bool)> {
        let (seq, rank) = (self.seq, self.rank);
        let mut incoming: Vec<(usize, UnixStream)> = Vec::new();
        let mut ok = true;
        while incoming.len() < outgoing.len() {
            let s = match listener.sock.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= self.deadline {
                        return Err(self.never_sent(&incoming, outgoing));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                Err(e) => return Err(io("accept", e)),
            };
            match self.read_offer(&s) {
                Ok((p, offer, fd)) if p != rank && !incoming.iter().any(|x| x.0 == p) => {
                    match (offer, fd) {
                        (Some(o), Some(fd)) => {
                            if let Err(e) = import(p, &o, fd.as_fd()) {
                                tracing::warn!("unicomm copy-engine exchange #{seq}: rank {rank} could not map rank {p}'s window: {e}");
                                ok = false;
                            }
                        }
                        _ => ok = false, // the peer could not export its memory
                    }
                    incoming.push((p, s));
                }
                Ok((p, ..)) => {
                    tracing::warn!(
                        "unicomm copy-engine exchange #{seq}: dropped a second offer claiming rank {p}"
                    )
                }
                Err(why) => {
                    tracing::warn!(
                        "unicomm copy-engine exchange #{seq}: dropped a connection: {why}"
                    )
                }
            }
        }
        Ok((incoming, ok))
    }

    /// The deadline's error: the peers reached whose offers never came.
    fn never_sent(
        &self,
        incoming: &[(usize, UnixStream)],
        outgoing: &[(usize, UnixStream)],
    ) -> Error {
        let heard: Vec<usize> = incoming.iter().map(|x| x.0).collect();
        let missing: Vec<String> = outgoing
            .iter()
            .map(|x| x.0)
            .filter(|p| !heard.contains(p))
            .map(|p| p.to_string())
            .collect();
        Error::Timeout {
            what: format!(
                "copy-engine exchange #{}: rank(s) {} never sent their window",
                self.seq,
                missing.join(", ")
            ),
            after: self.start.elapsed(),
        }
    }

    /// Answers every accepted connection with this rank's verdict `ok` and reads every
    /// opened one's: whether all said yes.
    fn agree(
        &self,
        incoming: &mut [(usize, UnixStream)],
        outgoing: &mut [(usize, UnixStream)],
        ok: bool,
    ) -> Result<bool> {
        for (_, s) in incoming.iter_mut() {
            with_deadline(s, self.deadline)?;
            s.write_all(&[b'K', u8::from(ok)])
                .map_err(|e| io("answer", e))?;
        }
        let mut agreed = ok;
        for (p, s) in outgoing.iter_mut() {
            with_deadline(s, self.deadline)?;
            let mut a = [0u8; 2];
            s.read_exact(&mut a).map_err(|e| {
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) {
                    Error::Timeout {
                        what: format!(
                            "copy-engine exchange #{}: rank {p} never answered",
                            self.seq
                        ),
                        after: self.start.elapsed(),
                    }
                } else {
                    io(&format!("rank {p}'s answer"), e)
                }
            })?;
            agreed &= a == [b'K', 1];
        }
        Ok(agreed)
    }
}

fn uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Read and write timeouts of `s`: what is left until `deadline` (at least 1 ms).
fn with_deadline(s: &UnixStream, deadline: Instant) -> Result<()> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    s.set_read_timeout(Some(left))
        .and_then(|_| s.set_write_timeout(Some(left)))
        .map_err(|e| io("socket", e))
}

/// Connects to peer `p`'s listener and sends this rank's offer: `None` when `p` is not
/// reachable from here (no such listener on this host).
impl Round {
    fn offer_to(
        &self,
        p: usize,
        mine: Option<(Offer, BorrowedFd<'_>)>,
    ) -> Result<Option<UnixStream>> {
        let addr = SocketAddr::from_abstract_name(self.job.name(self.seq, p).as_bytes())
            .map_err(|e| io("name", e))?;
        let s = match UnixStream::connect_addr(&addr) {
            Ok(s) => s,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(io(&format!("connecting to rank {p}"), e)),
        };
        let cred =
            socket::getsockopt(&s, sockopt::PeerCredentials).map_err(|e| io("SO_PEERCRED", e))?;
        let (seq, me) = (self.seq, self.me);
        if cred.uid() != me {
            // Someone else holds this job's name: talk to nobody there.
            tracing::warn!(
            "unicomm copy-engine exchange #{seq}: rank {p}'s socket belongs to user {} (pid {}), not to this job's user {me}: not sent",
            cred.uid(),
            cred.pid()
        );
            return Ok(None);
        }
        with_deadline(&s, self.deadline)?;
        let offer = mine.map(|m| m.0).unwrap_or(Offer {
            size: 0,
            offset: 0,
            bytes: 0,
        });
        let mut msg = Vec::with_capacity(MSG);
        msg.extend_from_slice(MAGIC);
        msg.extend_from_slice(&self.job.key);
        msg.extend_from_slice(&seq.to_le_bytes());
        msg.extend_from_slice(&(self.rank as u32).to_le_bytes());
        msg.extend_from_slice(&(self.world as u32).to_le_bytes());
        msg.extend_from_slice(&u32::from(mine.is_some()).to_le_bytes());
        msg.extend_from_slice(&offer.size.to_le_bytes());
        msg.extend_from_slice(&offer.offset.to_le_bytes());
        msg.extend_from_slice(&offer.bytes.to_le_bytes());
        let fds: Vec<RawFd> = mine.iter().map(|m| m.1.as_raw_fd()).collect();
        let cmsgs: Vec<ControlMessage<'_>> = if fds.is_empty() {
            Vec::new()
        } else {
            vec![ControlMessage::ScmRights(&fds)]
        };
        let n = socket::sendmsg::<()>(
            s.as_raw_fd(),
            &[IoSlice::new(&msg)],
            &cmsgs,
            MsgFlags::empty(),
            None,
        )
        .map_err(|e| io(&format!("sending to rank {p}"), e))?;
        if n < MSG {
            (&s).write_all(&msg[n..])
                .map_err(|e| io(&format!("sending to rank {p}"), e))?;
        }
        Ok(Some(s))
    }

    /// Reads one offer from an accepted connection: (sender's rank, its offer if it had
    /// one, its descriptor). An error (logged by the caller, the connection dropped) for a
    /// stranger: another user, a wrong key, registration or world, a short or slow message.
    fn read_offer(
        &self,
        s: &UnixStream,
    ) -> std::result::Result<(usize, Option<Offer>, Option<OwnedFd>), String> {
        let cred = socket::getsockopt(s, sockopt::PeerCredentials).map_err(|e| e.to_string())?;
        if cred.uid() != self.me {
            return Err(format!(
                "pid {} of user {}, not {}",
                cred.pid(),
                cred.uid(),
                self.me
            ));
        }
        s.set_nonblocking(false).map_err(|e| e.to_string())?;
        // A peer sends its whole offer as soon as it connects; a stranger that holds the
        // connection open gets at most `PER_OFFER` of the deadline, not all of it.
        with_deadline(s, self.deadline.min(Instant::now() + PER_OFFER))
            .map_err(|e| e.to_string())?;
        let (buf, fd) = receive(s)?;
        self.parse(&buf, fd)
    }

    /// The offer in `buf` (with `fd`, the descriptor that came with it), checked to be this
    /// round's.
    fn parse(
        &self,
        buf: &[u8; MSG],
        fd: Option<OwnedFd>,
    ) -> std::result::Result<(usize, Option<Offer>, Option<OwnedFd>), String> {
        let u32_at = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        let u64_at = |i: usize| {
            let mut b = [0; 8];
            b.copy_from_slice(&buf[i..i + 8]);
            u64::from_le_bytes(b)
        };
        if &buf[..8] != MAGIC {
            return Err("not an offer (bad magic)".into());
        }
        if buf[8..24] != self.job.key {
            return Err("a wrong key (another job?)".into());
        }
        if u64_at(24) != self.seq {
            return Err(format!(
                "registration #{} while this is #{}",
                u64_at(24),
                self.seq
            ));
        }
        let (r, w, has) = (u32_at(32) as usize, u32_at(36) as usize, u32_at(40));
        if w != self.world || r >= self.world {
            return Err(format!("rank {r} of {w}, this world has {}", self.world));
        }
        let offer = Offer {
            size: u64_at(44),
            offset: u64_at(52),
            bytes: u64_at(60),
        };
        match (has, fd) {
            (1, Some(fd)) => Ok((r, Some(offer), Some(fd))),
            (0, _) => Ok((r, None, None)),
            _ => Err(format!("rank {r}'s offer came without its descriptor")),
        }
    }
}

/// One message of `MSG` bytes from `s` and the first descriptor that came with it (any
/// others closed).
fn receive(s: &UnixStream) -> std::result::Result<([u8; MSG], Option<OwnedFd>), String> {
    let mut buf = [0u8; MSG];
    let mut cmsg = nix::cmsg_space!([RawFd; 1]);
    let (n, fd) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let m = socket::recvmsg::<()>(
            s.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| e.to_string())?;
        let mut fd = None;
        for c in m.cmsgs().map_err(|e| e.to_string())? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for f in fds {
                    // SAFETY: a descriptor the kernel just installed in this process for
                    // this message; owned here (closed on drop), once.
                    let owned = unsafe { OwnedFd::from_raw_fd(f) };
                    fd.get_or_insert(owned);
                }
            }
        }
        (m.bytes, fd)
    };
    if n == 0 {
        return Err("closed before its offer".into());
    }
    if n < MSG {
        (&*s)
            .read_exact(&mut buf[n..])
            .map_err(|e| format!("a short offer ({n} of {MSG} bytes): {e}"))?;
    }
    Ok((buf, fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn job(n: u8) -> Job {
        Job::from_id(&[n; 128])
    }

    /// An "export": a memfd holding `tag`, so the importer can tell whose it got.
    fn exported(tag: u8) -> OwnedFd {
        let fd =
            nix::sys::memfd::memfd_create(c"unicomm-test", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
                .expect("memfd");
        nix::unistd::write(&fd, &[tag]).expect("write");
        fd
    }

    fn read_tag(fd: BorrowedFd<'_>) -> u8 {
        let mut b = [0u8; 1];
        nix::sys::uio::pread(fd, &mut b, 0).expect("pread");
        b[0]
    }

    /// Per rank: (peer, tag) of what it imported, and whether all agreed.
    type Got = (Vec<(usize, u8)>, bool);

    /// One rank's exchange: it offers a memfd holding `tag` (nothing when `tag` is None,
    /// as a rank that cannot export), at offset `tag`, and records the peers' tags.
    fn swap(l: &Listener, world: usize, tag: Option<u8>, within: Duration) -> Result<Got> {
        let fd = exported(tag.unwrap_or(0));
        let offer = Offer {
            size: 4096,
            offset: u64::from(tag.unwrap_or(0)),
            bytes: 64,
        };
        let mine = tag.map(|_| (offer, fd.as_fd()));
        let mut got = Vec::new();
        exchange(l, world, mine, Instant::now() + within, |p, o, fd| {
            let t = read_tag(fd);
            assert_eq!(
                o.offset,
                u64::from(t),
                "the offer travels with its descriptor"
            );
            got.push((p, t));
            Ok(())
        })
        .map(|agreed| (got, agreed))
    }

    /// `world` ranks on threads (listeners of ranks in `bound` only; rank r's tag is
    /// 100 + r, none for ranks in `no_export`), each swapping with a `world`-rank job.
    fn run(
        world: usize,
        bound: usize,
        no_export: &[usize],
        within: Duration,
    ) -> Vec<(Result<Got>, Duration)> {
        let j = job(world as u8 * 16 + bound as u8 + no_export.len() as u8 * 64);
        let ls: Vec<Arc<Listener>> = (0..bound)
            .map(|r| Arc::new(Listener::bind(j, 1, r).expect("bind")))
            .collect();
        let hs: Vec<_> = (0..bound)
            .map(|r| {
                let l = ls[r].clone();
                let tag = (!no_export.contains(&r)).then_some(100 + r as u8);
                std::thread::spawn(move || {
                    let start = Instant::now();
                    (swap(&l, world, tag, within), start.elapsed())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    }

    #[test]
    fn every_rank_gets_every_peers_descriptor_and_all_agree() {
        for world in [1, 2, 4] {
            for (r, (out, _)) in run(world, world, &[], Duration::from_secs(10))
                .into_iter()
                .enumerate()
            {
                let (mut got, agreed) = out.unwrap();
                got.sort();
                let want: Vec<(usize, u8)> = (0..world)
                    .filter(|&p| p != r)
                    .map(|p| (p, p as u8 + 100))
                    .collect();
                assert_eq!(got, want, "rank {r} of {world}");
                assert!(agreed, "rank {r} of {world}");
            }
        }
    }

    #[test]
    fn one_rank_without_exportable_memory_makes_every_rank_say_no() {
        for (out, _) in run(3, 3, &[1], Duration::from_secs(10)) {
            assert!(!out.unwrap().1);
        }
    }

    #[test]
    fn a_rank_on_another_host_is_unreachable_and_every_rank_says_no() {
        // Rank 2's listener never exists here (it would be on its host).
        for (out, took) in run(3, 2, &[], Duration::from_secs(20)) {
            assert!(!out.unwrap().1);
            assert!(
                took < Duration::from_secs(5),
                "{took:?}: waited for a rank it cannot reach"
            );
        }
    }

    #[test]
    fn a_stranger_with_the_wrong_key_is_dropped_and_the_exchange_goes_on() {
        let j = job(9);
        let (a, b) = (
            Listener::bind(j, 5, 0).unwrap(),
            Listener::bind(j, 5, 1).unwrap(),
        );
        // The stranger connects to rank 0 first: a well-formed message with another key,
        // then a half message that stays open.
        let addr = SocketAddr::from_abstract_name(j.name(5, 0).as_bytes()).unwrap();
        let mut s1 = UnixStream::connect_addr(&addr).unwrap();
        let mut bad = vec![0u8; MSG];
        bad[..8].copy_from_slice(MAGIC);
        s1.write_all(&bad).unwrap();
        let mut s2 = UnixStream::connect_addr(&addr).unwrap();
        s2.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        let t = std::thread::spawn(move || swap(&b, 2, Some(11), Duration::from_secs(10)));
        let start = Instant::now();
        let r0 = swap(&a, 2, Some(10), Duration::from_secs(8));
        let r1 = t.join().unwrap();
        // The half message held rank 0 for one offer's budget (2 s), not its deadline
        // (8 s); the exchange then completed with the real peer.
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(r0.unwrap(), (vec![(1, 11)], true));
        assert_eq!(r1.unwrap(), (vec![(0, 10)], true));
        drop((s1, s2));
    }

    #[test]
    fn a_missing_peer_is_a_timeout_at_the_deadline_naming_it() {
        // Rank 1 bound its listener (so rank 0 reached it) but never takes part.
        let j = job(10);
        let (a, _b) = (
            Listener::bind(j, 1, 0).unwrap(),
            Listener::bind(j, 1, 1).unwrap(),
        );
        let start = Instant::now();
        let e = swap(&a, 2, Some(1), Duration::from_millis(300)).expect_err("a timeout");
        assert!(start.elapsed() < Duration::from_secs(3));
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        assert!(e.to_string().contains("rank(s) 1"), "{e}");
    }

    #[test]
    fn a_name_is_bound_once() {
        let j = job(11);
        let _a = Listener::bind(j, 1, 0).unwrap();
        assert!(Listener::bind(j, 1, 0).is_err());
    }
}
