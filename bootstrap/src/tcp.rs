//! The TCP rendezvous on `MASTER_ADDR:MASTER_PORT`: rank 0 serves the unique id, every
//! other rank joins, one deadline over all of it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::auth::*;
use super::file::{file_exchange, missing};
use super::launcher::*;
use unicomm_core::{Error, Result};

/// The server's answers after a hello.
pub(crate) const REFUSED: u8 = 0;
pub(crate) const CHALLENGE: u8 = 1;

/// Reads exactly `buf.len()` bytes before `deadline` (each read's timeout is what is left).
pub(crate) fn read_until(
    s: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub(crate) fn write_until(s: &mut TcpStream, buf: &[u8], deadline: Instant) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::ErrorKind::TimedOut.into());
    }
    s.set_write_timeout(Some(left))?;
    s.write_all(buf)
}

/// How long one connection may take on the server before it is dropped (so one silent or
/// dripping client cannot hold the others back for long); never past the deadline.
pub(crate) const PER_CONNECTION: Duration = Duration::from_secs(2);

/// The most handshakes rank 0 serves at once; a connection beyond them is closed at once.
/// Each holds a thread and a few hundred bytes for at most [`PER_CONNECTION`], so a stranger
/// can make rank 0 hold at most this many of each, and a real rank retries past them.
pub(crate) const MAX_HANDSHAKES: usize = 64;

/// Rank 0's side of one connection: the handshake, then the id. `Ok(rank)` when the rank
/// joined; `Err(why)` when the connection was dropped (logged by the caller).
pub(crate) fn serve(
    s: &mut TcpStream,
    env: &LaunchEnv,
    id: &[u8; 128],
    served: &Mutex<Vec<bool>>,
    deadline: Instant,
) -> std::result::Result<usize, String> {
    let deadline = deadline.min(Instant::now() + PER_CONNECTION);
    let mut hb = [0u8; HELLO_LEN];
    read_until(s, &mut hb, deadline).map_err(|e| format!("no complete hello: {e}"))?;
    let h = Hello::parse(&hb).map_err(|e| e.to_string())?;
    let (r, w) = (
        (h.rank as u32).to_le_bytes(),
        (h.world as u32).to_le_bytes(),
    );
    let taken = |rank: usize| served.lock().map_or(true, |v| v.get(rank) != Some(&false));
    if h.world != env.world_size || h.rank == 0 || h.rank >= env.world_size || taken(h.rank) {
        // Authenticated under the client's fresh nonce: only a holder of the token can
        // refuse a rank, so a stranger on the port cannot make it give up.
        let mut msg = vec![REFUSED];
        msg.extend_from_slice(&mac(&env.token, b"refused", &[&r, &w, &h.nonce]));
        let _ = write_until(s, &msg, deadline);
        let served = served.lock().map(|v| v.clone()).unwrap_or_default();
        return Err(format!(
            "refused: claims rank {} of {}; this job is {} ranks{}",
            h.rank,
            h.world,
            env.world_size,
            if h.rank < served.len() && served[h.rank] {
                " and that rank already joined"
            } else {
                ""
            }
        ));
    }
    let ns = nonce().map_err(|e| e.to_string())?;
    let server_proof = mac(&env.token, b"server", &[&r, &w, &h.nonce, &ns]);
    let mut msg = vec![CHALLENGE];
    msg.extend_from_slice(&ns);
    msg.extend_from_slice(&server_proof);
    write_until(s, &msg, deadline).map_err(|e| format!("challenge: {e}"))?;
    let mut client_proof = [0u8; 32];
    read_until(s, &mut client_proof, deadline).map_err(|e| format!("no proof: {e}"))?;
    if !same(
        &client_proof,
        &mac(&env.token, b"client", &[&r, &w, &h.nonce, &ns]),
    ) {
        return Err("the client does not hold this job's token".into());
    }
    // Authenticated: the rank is taken now (two connections of one rank race here).
    {
        let mut v = served
            .lock()
            .map_err(|_| "the rendezvous' state was poisoned")?;
        match v.get_mut(h.rank) {
            Some(t) if !*t => *t = true,
            _ => return Err(format!("rank {} joined meanwhile", h.rank)),
        }
    }
    // The id travels encrypted with a keystream only holders of the token can derive.
    let mut sealed = *id;
    for (k, chunk) in sealed.chunks_mut(32).enumerate() {
        let ks = mac(&env.token, b"key", &[&h.nonce, &ns, &[k as u8]]);
        chunk.iter_mut().zip(ks).for_each(|(b, k)| *b ^= k);
    }
    write_until(s, &sealed, deadline).map_err(|e| format!("sending the id: {e}"))?;
    Ok(h.rank)
}

/// Why a join failed: final (the real rank 0 refused this rank) or worth retrying (a
/// stranger on the port, a broken connection).
#[derive(Debug)]
pub(crate) enum JoinError {
    Refused(Error),
    Retry(Error),
}

impl From<Error> for JoinError {
    fn from(e: Error) -> Self {
        JoinError::Retry(e)
    }
}

/// A client's side: hello, check rank 0's proof, prove itself, receive the id.
pub(crate) fn join(
    s: &mut TcpStream,
    env: &LaunchEnv,
    deadline: Instant,
) -> std::result::Result<[u8; 128], JoinError> {
    let ioe = |what: &str, e: std::io::Error| io(what, e);
    let h = Hello {
        rank: env.rank,
        world: env.world_size,
        nonce: nonce()?,
    };
    write_until(s, &h.bytes(), deadline).map_err(|e| ioe("hello", e))?;
    let mut kind = [0u8; 1];
    read_until(s, &mut kind, deadline).map_err(|e| ioe("rank 0's answer", e))?;
    let (r, w) = (
        (h.rank as u32).to_le_bytes(),
        (h.world as u32).to_le_bytes(),
    );
    if kind[0] == REFUSED {
        let mut proof = [0u8; 32];
        read_until(s, &mut proof, deadline).map_err(|e| ioe("rank 0's refusal", e))?;
        // Believed only from a holder of the token: a stranger's refusal is retried.
        if !same(&proof, &mac(&env.token, b"refused", &[&r, &w, &h.nonce])) {
            return Err(Error::Bootstrap {
                reason: "a refusal without this job's token (a stranger on the port)".into(),
            }
            .into());
        }
        return Err(JoinError::Refused(Error::Bootstrap {
            reason: format!(
                "rank 0 refused rank {} of {} (another world size, or this rank already joined)",
                env.rank, env.world_size
            ),
        }));
    }
    if kind[0] != CHALLENGE {
        return Err(Error::Bootstrap {
            reason: format!(
                "answer {} is not unicomm's (a stranger on the port)",
                kind[0]
            ),
        }
        .into());
    }
    let mut ch = [0u8; 48];
    read_until(s, &mut ch, deadline).map_err(|e| ioe("rank 0's challenge", e))?;
    let mut ns = [0u8; 16];
    ns.copy_from_slice(&ch[..16]);
    let mut proof = [0u8; 32];
    proof.copy_from_slice(&ch[16..]);
    if !same(
        &proof,
        &mac(&env.token, b"server", &[&r, &w, &h.nonce, &ns]),
    ) {
        return Err(Error::Bootstrap {
            reason: "the process on the rendezvous port does not hold this job's token \
                     (another job, or a stranger on the port)"
                .into(),
        }
        .into());
    }
    let mine = mac(&env.token, b"client", &[&r, &w, &h.nonce, &ns]);
    write_until(s, &mine, deadline).map_err(|e| ioe("proof", e))?;
    let mut id = [0u8; 128];
    read_until(s, &mut id, deadline).map_err(|e| ioe("receiving the id", e))?;
    for (k, chunk) in id.chunks_mut(32).enumerate() {
        let ks = mac(&env.token, b"key", &[&h.nonce, &ns, &[k as u8]]);
        chunk.iter_mut().zip(ks).for_each(|(b, k)| *b ^= k);
    }
    Ok(id)
}

/// Hands rank 0's unique id to every rank: rank 0 calls `make_id`, listens on exactly
/// `MASTER_ADDR:MASTER_PORT` and serves the id to each other rank once; the others connect
/// (retrying until rank 0 listens) and receive it.
///
/// Security: both sides prove they hold the job's token (`LaunchEnv::token`, HMAC-SHA256
/// over fresh nonces), so a stray client gets nothing and a process squatting on the port
/// cannot hand out a forged id; the id travels encrypted. A malformed or partial hello, a
/// wrong token or a rank claimed twice is dropped (logged on stderr) and the rendezvous goes
/// on. Without a launcher job id or `UNICOMM_RENDEZVOUS_TOKEN` the token is only the job's
/// address and size: say so with [`LaunchEnv::token_source`] "none".
///
/// One deadline, `timeout`, bounds the whole exchange, every read and write included; its
/// `Timeout` names the ranks still missing and the time really waited.
pub fn exchange_unique_id(
    env: &LaunchEnv,
    make_id: impl FnOnce() -> Result<[u8; 128]>,
    timeout: Duration,
) -> Result<[u8; 128]> {
    let start = Instant::now();
    let deadline = start
        .checked_add(timeout)
        .ok_or_else(|| Error::invalid("timeout", format!("{timeout:?} overflows the clock")))?;
    if env.world_size == 0 || env.world_size > MAX_WORLD || env.rank >= env.world_size {
        return Err(Error::Bootstrap {
            reason: format!("rank {} of {} is not a valid job", env.rank, env.world_size),
        });
    }
    let env = &env.keyed(deadline)?;
    tracing::info!(
        rank = env.rank,
        world = env.world_size,
        launcher = env.launcher,
        secret = env.token_source,
        key_file = ?env.secret_file,
        "rendezvous"
    );
    if let Some(path) = &env.file {
        return file_exchange(env, path, make_id, start, deadline, timeout);
    }
    let addr = resolve(env)?;
    if env.rank == 0 {
        let id = make_id()?;
        serve_rank0(env, addr, &id, (start, deadline, timeout))?;
        return Ok(id);
    }
    join_rank0(env, addr, (start, deadline, timeout))
}

/// Rank 0's side: every other rank served the id over an authenticated handshake, each on
/// its own thread under its own short deadline, until all joined or `deadline`.
fn serve_rank0(
    env: &LaunchEnv,
    addr: std::net::SocketAddr,
    id: &[u8; 128],
    (start, deadline, timeout): (Instant, Instant, Duration),
) -> Result<()> {
    let id = *id;
    let listener =
        TcpListener::bind(addr).map_err(|e| io(&format!("rank 0 cannot listen on {addr}"), e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| io("listener", e))?;
    let mut served = vec![false; env.world_size];
    served[0] = true;
    let served = Arc::new(Mutex::new(served));
    let live = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = std::sync::mpsc::channel::<usize>();
    let mut joined = 1;
    while joined < env.world_size {
        match listener.accept() {
            Ok((s, peer)) => {
                // Each connection is served on its own thread with its own short deadline,
                // so silent or dripping strangers cannot queue the real ranks behind them;
                // at most MAX_HANDSHAKES at once, each holding a few hundred bytes.
                if live.load(Ordering::Acquire) >= MAX_HANDSHAKES {
                    tracing::warn!("unicomm rendezvous on {addr}: dropped {peer}: {MAX_HANDSHAKES} handshakes already under way");
                    continue;
                }
                let (env, served, live, tx) =
                    (env.clone(), served.clone(), live.clone(), tx.clone());
                live.fetch_add(1, Ordering::AcqRel);
                let spawned = std::thread::Builder::new()
                    .name("unicomm-rendezvous".into())
                    .spawn({
                        let live = live.clone();
                        move || {
                            let mut s = s;
                            let r = s
                                .set_nonblocking(false)
                                .map_err(|e| e.to_string())
                                .and_then(|()| serve(&mut s, &env, &id, &served, deadline));
                            match r {
                                Ok(rank) => {
                                    let _ = tx.send(rank);
                                }
                                Err(why) => tracing::warn!(
                                    "unicomm rendezvous on {addr}: dropped {peer}: {why}"
                                ),
                            }
                            live.fetch_sub(1, Ordering::AcqRel);
                        }
                    });
                if spawned.is_err() {
                    live.fetch_sub(1, Ordering::AcqRel);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let served = served.lock().map(|v| v.clone()).unwrap_or_default();
                    return Err(Error::Timeout {
                        what: format!(
                            "rank(s) {} to join the rendezvous on {addr} (waited {:.1?})",
                            missing(&served),
                            start.elapsed()
                        ),
                        after: timeout,
                    });
                }
                if rx.recv_timeout(Duration::from_millis(5)).is_ok() {
                    joined += 1;
                }
            }
            Err(e) => return Err(io("accept", e)),
        }
        while rx.try_recv().is_ok() {
            joined += 1;
        }
    }
    Ok(())
}

/// Another rank's side: connect to rank 0 and join, retrying past strangers and a rank 0
/// not listening yet, until `deadline`.
fn join_rank0(
    env: &LaunchEnv,
    addr: std::net::SocketAddr,
    (start, deadline, timeout): (Instant, Instant, Duration),
) -> Result<[u8; 128]> {
    let mut last = String::from("rank 0 never answered");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout {
                what: format!(
                    "rank 0's rendezvous on {addr} (waited {:.1?}; last: {last})",
                    start.elapsed()
                ),
                after: timeout,
            });
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(1))) {
            Ok(mut s) => match join(&mut s, env, deadline) {
                Ok(id) => return Ok(id),
                // Refused by the real rank 0 (wrong size, rank taken): final.
                Err(JoinError::Refused(e)) => return Err(e),
                // A stranger or a broken connection: try again until the deadline.
                Err(JoinError::Retry(e)) => {
                    last = e.to_string();
                    std::thread::sleep(Duration::from_millis(50));
                }
            },
            // Rank 0 is not listening yet: try again until the deadline.
            Err(e) => {
                last = e.to_string();
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}
