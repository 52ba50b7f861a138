//! The TCP rendezvous on `MASTER_ADDR:MASTER_PORT`: rank 0 serves the unique id, every
//! other rank joins, one deadline over all of it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::auth::*;
use super::file::{file_exchange, missing};
use super::launcher::*;
use crate::{Error, Result};

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

/// Rank 0's side of one connection: the handshake, then the id. `Ok(rank)` when the rank
/// joined; `Err(why)` when the connection was dropped (logged by the caller).
pub(crate) fn serve(
    s: &mut TcpStream,
    env: &LaunchEnv,
    id: &[u8; 128],
    served: &[bool],
    deadline: Instant,
) -> std::result::Result<usize, String> {
    let deadline = deadline.min(Instant::now() + PER_CONNECTION);
    let mut hb = [0u8; HELLO_LEN];
    read_until(s, &mut hb, deadline).map_err(|e| format!("no complete hello: {e}"))?;
    let h = Hello::parse(&hb).map_err(|e| e.to_string())?;
    if h.world != env.world_size || h.rank == 0 || h.rank >= env.world_size || served[h.rank] {
        let _ = write_until(s, &[REFUSED], deadline);
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
    let (r, w) = (
        (h.rank as u32).to_le_bytes(),
        (h.world as u32).to_le_bytes(),
    );
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
    if kind[0] != CHALLENGE {
        return Err(JoinError::Refused(Error::Bootstrap {
            reason: format!(
                "rank 0 refused rank {} of {} (another world size, or this rank already joined)",
                env.rank, env.world_size
            ),
        }));
    }
    let mut ch = [0u8; 48];
    read_until(s, &mut ch, deadline).map_err(|e| ioe("rank 0's challenge", e))?;
    let mut ns = [0u8; 16];
    ns.copy_from_slice(&ch[..16]);
    let mut proof = [0u8; 32];
    proof.copy_from_slice(&ch[16..]);
    let (r, w) = (
        (h.rank as u32).to_le_bytes(),
        (h.world as u32).to_le_bytes(),
    );
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
    if let Some(path) = &env.file {
        return file_exchange(env, path, make_id, start, deadline, timeout);
    }
    let addr = resolve(env)?;
    if env.rank == 0 {
        let id = make_id()?;
        let listener = TcpListener::bind(addr)
            .map_err(|e| io(&format!("rank 0 cannot listen on {addr}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| io("listener", e))?;
        let mut served = vec![false; env.world_size];
        served[0] = true;
        let mut joined = 1;
        while joined < env.world_size {
            match listener.accept() {
                Ok((mut s, peer)) => {
                    s.set_nonblocking(false).map_err(|e| io("socket", e))?;
                    match serve(&mut s, env, &id, &served, deadline) {
                        Ok(rank) => {
                            served[rank] = true;
                            joined += 1;
                        }
                        Err(why) => {
                            eprintln!("unicomm rendezvous on {addr}: dropped {peer}: {why}")
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(Error::Timeout {
                            what: format!(
                                "rank(s) {} to join the rendezvous on {addr} (waited {:.1?})",
                                missing(&served),
                                start.elapsed()
                            ),
                            after: timeout,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(io("accept", e)),
            }
        }
        return Ok(id);
    }
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
