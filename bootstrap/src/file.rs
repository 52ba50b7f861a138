//! The file rendezvous (`UNICOMM_RENDEZVOUS_FILE`): rank 0 writes the sealed id to a file
//! on a file system every rank sees, each rank acknowledges it.

use std::io::Write;
use std::time::{Duration, Instant};

use super::auth::*;
use super::backoff::Backoff;
use super::deadline::Deadline;
use super::launcher::*;
use unicomm_core::env::read_bounded;
use unicomm_core::{Error, Result};

pub(crate) const FILE_MAGIC: &[u8; 8] = b"UNICFID1";
pub(crate) const ACK_MAGIC: &[u8; 8] = b"UNICFAK1";
pub(crate) const FILE_LEN: usize = 8 + 16 + 4 + 128 + 32;
pub(crate) const ACK_LEN: usize = 8 + 16 + 4 + 32;
/// The acknowledgements rank 0 looks for by name in one poll, beside the listing.
const BY_NAME: usize = 256;

/// Writes `bytes` to `path` all at once: a private temporary file beside it (mode 0600,
/// created new), synced, then renamed over `path`, so a reader sees all of it or nothing.
pub(crate) fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    let n = nonce()?;
    let hex: String = n.iter().map(|b| format!("{b:02x}")).collect();
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}.{hex}", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    let write = || -> std::io::Result<()> {
        let mut f = o.open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(&format!("writing {}", path.display()), e)
    })
}

/// Where the job's files lie for the path it was given: `<path>.<tag>`, the tag a MAC of the
/// job's token, so that no one without the token can know the names in advance (another
/// user's file or FIFO made at a predictable name in a sticky shared directory such as
/// `/tmp` stopped the job: rank 0 cannot rename over it, a rank waited its deadline).
pub(crate) fn job_file(env: &LaunchEnv, path: &std::path::Path) -> std::path::PathBuf {
    let tag = mac(&env.token, b"file-name", &[]);
    let hex: String = tag[..12].iter().map(|b| format!("{b:02x}")).collect();
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".{hex}"));
    p.into()
}

pub(crate) fn ack_path(path: &std::path::Path, rank: usize) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".ack.{rank}"));
    p.into()
}

/// The file rendezvous (`UNICOMM_RENDEZVOUS_FILE`, a filesystem every rank sees): rank 0
/// writes the id there, sealed and authenticated with the job's token under a fresh nonce
/// (mode 0600, written atomically); each other rank polls for a file that proves the token,
/// takes the id and leaves an authenticated acknowledgement (`<file>.ack.<rank>`); rank 0
/// returns once every rank has acknowledged and removes the files. A file that fails the
/// checks (another job's, a torn or foreign one) is ignored and the wait goes on; one
/// deadline bounds it all. Use a path of this job only (with its job id in it): without a
/// token, a leftover file of an earlier job of the same size at the same path would be
/// taken.
pub(crate) fn file_exchange(
    env: &LaunchEnv,
    path: &std::path::Path,
    make_id: impl FnOnce() -> Result<[u8; 128]>,
    start: Instant,
    deadline: Instant,
    timeout: Duration,
) -> Result<[u8; 128]> {
    let path = &job_file(env, path);
    if env.rank == 0 {
        let id = make_id()?;
        serve_file(
            env,
            path,
            &id,
            Deadline {
                start,
                at: deadline,
                timeout,
            },
        )?;
        return Ok(id);
    }
    take_file(
        env,
        path,
        Deadline {
            start,
            at: deadline,
            timeout,
        },
    )
}

/// The job's world size as the file's bytes hold it.
fn world_bytes(env: &LaunchEnv) -> [u8; 4] {
    (env.world_size as u32).to_le_bytes()
}

/// The keystream that seals chunk `k` of the id under nonce `n`.
fn keystream(env: &LaunchEnv, n: &[u8; 16], k: usize) -> [u8; 32] {
    mac(&env.token, b"file-key", &[n, &world_bytes(env), &[k as u8]])
}

/// Rank 0's side: the sealed id written, then every rank's acknowledgement awaited.
fn serve_file(
    env: &LaunchEnv,
    path: &std::path::Path,
    id: &[u8; 128],
    Deadline {
        start,
        at: deadline,
        timeout,
    }: Deadline,
) -> Result<()> {
    let world = world_bytes(env);
    let (n, bytes) = sealed_file(env, id)?;
    write_atomically(path, &bytes)?;
    let mut acked = vec![false; env.world_size];
    acked[0] = true;
    let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(200));
    let mut turn = 0;
    loop {
        // One listing of the directory per poll, then only the acknowledgements that
        // exist are opened (a reopen of every missing one every 20 ms was 200,000 opens a
        // second at 4,096 ranks on a shared file system); and by name, up to
        // `BY_NAME` missing ranks a poll in turn, so that a directory crowded past the
        // listing's bound (another job's 10,000 files) hides no acknowledgement.
        for r in to_look_at(path, &acked, &mut turn) {
            if acked.get(r) != Some(&false) {
                continue;
            }
            if let Ok(b) = read_bounded(&ack_path(path, r), ACK_LEN) {
                let rb = (r as u32).to_le_bytes();
                acked[r] = b.len() == ACK_LEN
                    && &b[..8] == ACK_MAGIC
                    && b[8..24] == n
                    && b[24..28] == rb
                    && b[28..].try_into().is_ok_and(|t: [u8; 32]| {
                        same(&t, &mac(&env.token, b"file-ack", &[&n, &world, &rb]))
                    });
            }
        }
        if acked.iter().all(|&a| a) {
            break;
        }
        if Instant::now() >= deadline {
            let _ = std::fs::remove_file(path);
            return Err(Error::Timeout {
                what: format!(
                    "rank(s) {} to take the id from {} (waited {:.1?})",
                    missing(&acked),
                    path.display(),
                    start.elapsed()
                ),
                after: timeout,
            });
        }
        let left = deadline.saturating_duration_since(Instant::now());
        std::thread::sleep(backoff.next().min(left));
    }
    let _ = std::fs::remove_file(path);
    for r in 1..env.world_size {
        let _ = std::fs::remove_file(ack_path(path, r));
    }
    Ok(())
}

/// Rank 0's file for `id`: sealed and authenticated under a fresh nonce; the nonce and the
/// file's bytes.
fn sealed_file(env: &LaunchEnv, id: &[u8; 128]) -> Result<([u8; 16], Vec<u8>)> {
    let world = world_bytes(env);
    let n = nonce()?;
    let mut sealed = *id;
    for (k, chunk) in sealed.chunks_mut(32).enumerate() {
        chunk
            .iter_mut()
            .zip(keystream(env, &n, k))
            .for_each(|(b, k)| *b ^= k);
    }
    let tag = mac(&env.token, b"file-id", &[&n, &world, &sealed]);
    let mut bytes = Vec::with_capacity(FILE_LEN);
    for part in [&FILE_MAGIC[..], &n, &world, &sealed, &tag] {
        bytes.extend_from_slice(part);
    }
    Ok((n, bytes))
}

/// The ranks whose acknowledgement rank 0 looks at in this poll: those its bounded listing
/// shows, and up to [`BY_NAME`] of the missing ones by name, in turn from `turn`.
fn to_look_at(path: &std::path::Path, acked: &[bool], turn: &mut usize) -> Vec<usize> {
    let world = acked.len();
    let mut present: Vec<usize> = match listed_acks(path, world) {
        Ok(v) => v,
        Err(_) => (1..world).collect(),
    };
    let waiting: Vec<usize> = (1..world).filter(|&r| !acked[r]).collect();
    if !waiting.is_empty() {
        *turn %= waiting.len();
        let by_name = waiting
            .iter()
            .cycle()
            .skip(*turn)
            .take(BY_NAME.min(waiting.len()));
        present.extend(by_name);
        *turn += BY_NAME;
    }
    present
}

/// Another rank's side: the id taken from a file that proves the job's token, then
/// acknowledged.
fn take_file(
    env: &LaunchEnv,
    path: &std::path::Path,
    Deadline {
        start,
        at: deadline,
        timeout,
    }: Deadline,
) -> Result<[u8; 128]> {
    let mut last = String::from("no file yet");
    // Rank 0 of this job writes its file within its own deadline of this rank's start: a
    // file older than that (with 30 s for the clocks of a shared file system) is an earlier
    // run's, even under the same token, and is never taken.
    let oldest = std::time::SystemTime::now()
        .checked_sub(timeout + Duration::from_secs(30))
        .unwrap_or(std::time::UNIX_EPOCH);
    // Jittered backoff: ranks started together do not read the file in lockstep.
    let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(200));
    loop {
        let stale = std::fs::symlink_metadata(path)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t < oldest);
        match read_bounded(path, FILE_LEN) {
            Ok(_) if stale => {
                last = "a file older than this job's rendezvous could be (an earlier run's)".into();
            }
            Ok(b) if b.len() == FILE_LEN && &b[..8] == FILE_MAGIC => match open_file(env, &b) {
                Ok((id, n)) => {
                    acknowledge(env, path, &n)?;
                    return Ok(id);
                }
                Err(why) => last = why.into(),
            },
            Ok(b) => last = format!("a file that is not unicomm's ({} bytes)", b.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => last = e.to_string(),
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: format!(
                    "rank 0's id in {} (waited {:.1?}; last: {last})",
                    path.display(),
                    start.elapsed()
                ),
                after: timeout,
            });
        }
        let left = deadline.saturating_duration_since(Instant::now());
        std::thread::sleep(backoff.next().min(left));
    }
}

/// The id in rank 0's file `b` (of `FILE_LEN` bytes, unicomm's magic) and the file's nonce,
/// or why it is not this job's: a world of another size, or no proof of the job's token.
fn open_file(
    env: &LaunchEnv,
    b: &[u8],
) -> std::result::Result<([u8; 128], [u8; 16]), &'static str> {
    let world = world_bytes(env);
    let mut n = [0u8; 16];
    n.copy_from_slice(&b[8..24]);
    let mut tag = [0u8; 32];
    tag.copy_from_slice(&b[156..]);
    if b[24..28] != world {
        return Err("a file for a world of another size");
    }
    if !same(
        &tag,
        &mac(&env.token, b"file-id", &[&n, &world, &b[28..156]]),
    ) {
        return Err("a file that does not prove this job's token (another job's?)");
    }
    let mut id = [0u8; 128];
    id.copy_from_slice(&b[28..156]);
    for (k, chunk) in id.chunks_mut(32).enumerate() {
        chunk
            .iter_mut()
            .zip(keystream(env, &n, k))
            .for_each(|(b, k)| *b ^= k);
    }
    Ok((id, n))
}

/// This rank's acknowledgement of the file of nonce `n`, proving the job's token.
fn acknowledge(env: &LaunchEnv, path: &std::path::Path, n: &[u8; 16]) -> Result<()> {
    let world = world_bytes(env);
    let rb = (env.rank as u32).to_le_bytes();
    let mut ack = Vec::with_capacity(ACK_LEN);
    for part in [
        &ACK_MAGIC[..],
        n,
        &rb,
        &mac(&env.token, b"file-ack", &[n, &world, &rb]),
    ] {
        ack.extend_from_slice(part);
    }
    write_atomically(&ack_path(path, env.rank), &ack)
}

/// The ranks whose acknowledgement (`<file>.ack.<rank>`) is in the file's directory, from
/// one listing of it, at most `world + 4096` entries read (a directory of strangers' files
/// cannot hold rank 0 in a long read).
pub(crate) fn listed_acks(path: &std::path::Path, world: usize) -> std::io::Result<Vec<usize>> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let prefix = match path.file_name().and_then(|n| n.to_str()) {
        Some(n) => format!("{n}.ack."),
        None => return Ok(Vec::new()),
    };
    Ok(std::fs::read_dir(dir)?
        .take(world + 4096)
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let rank = name.to_str()?.strip_prefix(&prefix)?;
            // Digits only: "+3" or " 3" are not a rank's file.
            rank.bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| rank.parse().ok())
                .flatten()
        })
        .collect())
}

/// The ranks not yet arrived (`arrived[r]` false), at most 32 of them listed.
pub(crate) fn missing(arrived: &[bool]) -> String {
    let all: Vec<String> = (0..arrived.len())
        .filter(|&r| !arrived[r])
        .map(|r| r.to_string())
        .collect();
    if all.len() > 32 {
        format!("{}, ...", all[..32].join(", "))
    } else {
        all.join(", ")
    }
}
