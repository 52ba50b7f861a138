//! The TCP rendezvous on `MASTER_ADDR:MASTER_PORT`: rank 0 serves the unique id, every
//! other rank joins, one deadline over all of it.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::backoff::Backoff;
use super::client::{join, JoinError};
use super::deadline::Deadline;
use super::file::file_exchange;
use super::forward::{rank0_serves, role, Role};
use super::launcher::*;
use super::serve::serve;
use super::serving::Serving;
use super::stream::{listen, Listener, Timed};
use unicomm_core::{Error, Result};

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
    let ids = exchange_unique_ids(env, 1, || Ok(vec![make_id()?]), timeout)?;
    ids.first()
        .copied()
        .ok_or_else(|| Error::invalid("ids", "the rendezvous handed out none"))
}

/// The most unique ids one rendezvous hands out (32 KiB to each rank): NCCL's many-root
/// creation takes one per root (the contract's constant).
pub use unicomm_core::shrink::MAX_IDS;

/// [`exchange_unique_id`] for `count` ids made by rank 0 (NCCL's many-root creation,
/// `ncclCommInitRankScalable`, takes one per root): every rank passes the same `count`
/// (1..=[`MAX_IDS`]); a rank expecting another number than rank 0 hands out fails at once,
/// naming both. The file rendezvous hands out one id.
pub fn exchange_unique_ids(
    env: &LaunchEnv,
    count: usize,
    make_ids: impl FnOnce() -> Result<Vec<[u8; 128]>>,
    timeout: Duration,
) -> Result<Vec<[u8; 128]>> {
    exchange(env, count, make_ids, timeout, false).map(|(ids, _done)| ids)
}

/// [`exchange_unique_ids`], except that rank 0 returns as soon as its ids exist and its port
/// listens, serving the other ranks on a thread of its own meanwhile, so that it enters its
/// communicator's creation (which waits for every rank anyway) while they join. The
/// [`Serving`] says how the rendezvous ended: call [`Serving::finish`] after the creation
/// (its error names the ranks that never joined, which a creation that timed out cannot).
/// Other ranks, and every rank of the file rendezvous, return once they hold the ids, with a
/// `Serving` already finished.
pub fn exchange_unique_ids_serving(
    env: &LaunchEnv,
    count: usize,
    make_ids: impl FnOnce() -> Result<Vec<[u8; 128]>>,
    timeout: Duration,
) -> Result<(Vec<[u8; 128]>, Serving)> {
    exchange(env, count, make_ids, timeout, true)
}

fn exchange(
    env: &LaunchEnv,
    count: usize,
    make_ids: impl FnOnce() -> Result<Vec<[u8; 128]>>,
    timeout: Duration,
    beside: bool,
) -> Result<(Vec<[u8; 128]>, Serving)> {
    if count == 0 || count > MAX_IDS || (count > 1 && env.file.is_some()) {
        return Err(Error::invalid(
            "count",
            format!("{count} unique ids: 1..={MAX_IDS} over TCP, 1 through a file"),
        ));
    }
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
        let id = file_exchange(
            env,
            path,
            || only_one(make_ids()?),
            start,
            deadline,
            timeout,
        )?;
        return Ok((vec![id], Serving::finished()));
    }
    let addr = resolve(env)?;
    let times = Deadline {
        start,
        at: deadline,
        timeout,
    };
    let got = match role(env) {
        Role::Root => return serve_as_root(env, (addr, count), make_ids, times, beside),
        Role::Direct => join_rank0(env, addr, count, times)?,
        #[cfg(target_os = "linux")]
        Role::Forwarder { host, per_host } => {
            let local = vec![Listener::Local(super::forward::listen_local(env, host)?)];
            let got = join_rank0(env, addr, count, times)?;
            let serves = move |r: usize| r / per_host == host && !r.is_multiple_of(per_host);
            let place = format!("host {host}'s local socket");
            let serving = serve_ids(env, (place, local), got.clone(), serves, times, beside)?;
            return Ok((split_ids(&got), serving));
        }
        #[cfg(target_os = "linux")]
        Role::Forwarded { host } => join_local(env, host, count, times)?,
        #[cfg(not(target_os = "linux"))]
        Role::Forwarder { .. } | Role::Forwarded { .. } => {
            return Err(Error::invalid(
                "UNICOMM_RENDEZVOUS_FORWARD",
                "forwarding needs Linux",
            ))
        }
    };
    Ok((split_ids(&got), Serving::finished()))
}

/// The one id a file rendezvous hands out, of those made.
fn only_one(ids: Vec<[u8; 128]>) -> Result<[u8; 128]> {
    match ids.as_slice() {
        [id] => Ok(*id),
        _ => Err(Error::invalid(
            "ids",
            format!("{} ids made, 1 asked", ids.len()),
        )),
    }
}

/// Rank 0: makes the `count` ids and serves them at `addr` (bound here, so a port taken is
/// this call's error either way; queues for the ranks that join rank 0 itself: with
/// forwarding, its host's and each host's first), beside the caller or until done.
fn serve_as_root(
    env: &LaunchEnv,
    (addr, count): (SocketAddr, usize),
    make_ids: impl FnOnce() -> Result<Vec<[u8; 128]>>,
    times: Deadline,
    beside: bool,
) -> Result<(Vec<[u8; 128]>, Serving)> {
    let ids = make_ids()?;
    if ids.len() != count {
        return Err(Error::invalid(
            "ids",
            format!("{} ids made, {count} asked", ids.len()),
        ));
    }
    let payload: Vec<u8> = ids.iter().flatten().copied().collect();
    let listener = listen(addr, joining_rank0(env))?;
    let root = env.clone();
    let serves = move |r| rank0_serves(&root, r);
    let place = (addr.to_string(), listener);
    let serving = serve_ids(env, place, payload, serves, times, beside)?;
    Ok((ids, serving))
}

/// The ids received, 128 bytes each.
fn split_ids(got: &[u8]) -> Vec<[u8; 128]> {
    got.chunks_exact(128)
        .map(|c| {
            let mut id = [0u8; 128];
            id.copy_from_slice(c);
            id
        })
        .collect()
}

/// How many ranks join rank 0 itself: every other rank, or with forwarding its host's and
/// each other host's first (what its listen queues are sized for).
pub(crate) fn joining_rank0(env: &LaunchEnv) -> usize {
    (0..env.world_size)
        .filter(|&r| rank0_serves(env, r))
        .count()
}

/// Serves `payload` (the ids) on `listener` to the ranks `serves` names: inline, or on a
/// thread of its own (`beside`), reporting through the [`Serving`].
fn serve_ids(
    env: &LaunchEnv,
    (place, listener): (String, Vec<Listener>),
    payload: Vec<u8>,
    serves: impl Fn(usize) -> bool + Send + 'static,
    Deadline {
        start,
        at: deadline,
        timeout,
    }: Deadline,
    beside: bool,
) -> Result<Serving> {
    let env = env.clone();
    let run = move || -> Result<()> {
        let t = serve(
            &env,
            (place.clone(), listener),
            &payload,
            serves,
            Deadline {
                start,
                at: deadline,
                timeout,
            },
        )?;
        tracing::info!(
            "unicomm rendezvous on {place}: {} ranks served in {:.1?}: {} connections \
             ({} dropped), at most {} handshakes at once",
            t.served,
            start.elapsed(),
            t.accepted,
            t.dropped,
            t.peak
        );
        Ok(())
    };
    match beside {
        true => Serving::spawn(run),
        false => run().map(|()| Serving::finished()),
    }
}

/// Another rank's side: connect to rank 0 and join, retrying past strangers and a rank 0
/// not listening yet, until `deadline`. Retries back off exponentially from 10 ms to 1 s with
/// full jitter (each wait uniform below the bound), so ranks started together spread out
/// instead of returning in waves; a connection attempt may last 15 s, long enough for the
/// kernel's own SYN retransmits (1, 2, 4, 8 s) when rank 0's listen queue is full.
fn join_rank0(
    env: &LaunchEnv,
    addr: std::net::SocketAddr,
    count: usize,
    times: Deadline,
) -> Result<Vec<u8>> {
    let server = format!("rank 0's rendezvous on {addr}");
    let connect = |left: Duration| TcpStream::connect_timeout(&addr, left.min(CONNECT_TIMEOUT));
    join_retrying(env, count, (&server, connect), times)
}

/// How long a rank waits for the first byte of an answer on one connection before it tries
/// a new one (doubling at each attempt): a squatter that took the rank's first connection
/// before rank 0 listened, and holds it open and silent, costs the rank this long, not its
/// whole deadline. Rank 0 answers 16,384 ranks in under 2 s, so a real rank 0 is never left.
const FIRST_ANSWER_WAIT: Duration = Duration::from_secs(5);

/// How long one connection attempt may take: past the kernel's SYN retransmits at 1, 3 and
/// 7 s, so a full listen queue delays a rank rather than making it start over.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// A forwarded rank's side: connect to its host's first rank and join, retrying (it may not
/// listen yet) until `deadline`, as [`join_rank0`] joins rank 0.
#[cfg(target_os = "linux")]
pub(crate) fn join_local(
    env: &LaunchEnv,
    host: usize,
    count: usize,
    times: Deadline,
) -> Result<Vec<u8>> {
    let addr = super::forward::local_addr(env, host)?;
    let first = host * env.forward.unwrap_or(1);
    let server = format!("host {host}'s first rank (rank {first}) on its local socket");
    let connect = |_: Duration| std::os::unix::net::UnixStream::connect_addr(&addr);
    join_retrying(env, count, (&server, connect), times)
}

/// Connects (`connect`, given the time left) to `server` and joins, again after a stranger,
/// a broken connection or a server not listening yet, backing off, until the deadline; a
/// refusal by the real server is final.
fn join_retrying<S: Timed>(
    env: &LaunchEnv,
    count: usize,
    (server, mut connect): (&str, impl FnMut(Duration) -> std::io::Result<S>),
    Deadline {
        start,
        at: deadline,
        timeout,
    }: Deadline,
) -> Result<Vec<u8>> {
    let mut last: Option<String> = None;
    let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(1));
    let mut answer_wait = FIRST_ANSWER_WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout {
                what: format!(
                    "{server} (waited {:.1?}; last: {})",
                    start.elapsed(),
                    last.as_deref().unwrap_or("never answered")
                ),
                after: timeout,
            });
        }
        let failed = match connect(left) {
            Ok(mut s) => match join(&mut s, env, count, (Instant::now() + answer_wait, deadline)) {
                Ok(ids) => return Ok(ids),
                // Refused by the real server (wrong size, rank taken): final.
                Err(JoinError::Refused(e)) => return Err(e),
                // A stranger or a broken connection: try again until the deadline.
                Err(JoinError::Retry(e)) => e.to_string(),
            },
            // Not listening yet: try again until the deadline.
            Err(e) => e.to_string(),
        };
        // An attempt cut by this rank's own deadline heard nothing new: the timeout keeps
        // naming the last answer heard in full (a stranger's refusal, a refused connection).
        if last.is_none() || Instant::now() < deadline {
            last = Some(failed);
        }
        // A server slower than the wait (a queue of thousands) gets twice as long next time.
        answer_wait = answer_wait.saturating_mul(2);
        let left = deadline.saturating_duration_since(Instant::now());
        std::thread::sleep(backoff.next().min(left));
    }
}
