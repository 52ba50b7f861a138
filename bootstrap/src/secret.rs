//! The rendezvous' secret where no `UNICOMM_RENDEZVOUS_TOKEN` is given: a key file only this
//! user can read (`UNICOMM_RENDEZVOUS_SECRET_FILE`, default `$HOME/.unicomm/rendezvous.key`),
//! created by rank 0 when absent. A launcher's job id is public (`squeue`, `ps` show it), so
//! it only labels the job; what authenticates is the key, which another user of the same
//! hosts cannot read. A multi-node job needs the file on a file system its nodes share (a
//! home directory usually is), or the variable.

#![allow(
    unsafe_code,
    reason = "a file opened without blocking and checked by its descriptor"
)]

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use super::auth::{io, nonce};
use unicomm_core::env::read_bounded;
use unicomm_core::{Error, Result};

/// A key file's most bytes (the 64 hex digits written here, with room for a user's own).
const MAX_KEY: usize = 4096;
/// The fewest bytes a key may hold.
const MIN_KEY: usize = 16;

/// The key in `path`, checked: a regular file of this user, readable by no one else,
/// `MIN_KEY..=MAX_KEY` bytes; read without blocking. `Ok(None)` while it does not exist.
fn read_key(path: &Path) -> Result<Option<Vec<u8>>> {
    let refuse = |why: String| {
        Error::Bootstrap {
        reason: format!(
            "the rendezvous key file {}: {why}; remove it (rank 0 makes a new one) or set UNICOMM_RENDEZVOUS_TOKEN",
            path.display()
        ),
    }
    };
    // The entry itself first: a symbolic link (dangling or not), a FIFO or a directory at
    // the key's path is refused, never followed nor taken for "no key yet" (a dangling link
    // reads as absent through it, while making the key there fails: rank 0 would loop).
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(refuse(e.to_string())),
        Ok(m) if !m.file_type().is_file() => {
            let what = if m.file_type().is_symlink() {
                "a symbolic link"
            } else if m.is_dir() {
                "a directory"
            } else {
                "not a regular file"
            };
            return Err(refuse(format!("{what}, not the key file")));
        }
        Ok(_) => {}
    }
    let key = match read_bounded(path, MAX_KEY) {
        Ok(k) => k,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(refuse(e.to_string())),
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(path).map_err(|e| refuse(e.to_string()))?;
        // SAFETY: getuid has no preconditions and cannot fail.
        let me = unsafe { libc::getuid() };
        if m.uid() != me {
            return Err(refuse(format!(
                "owned by uid {}, not this user ({me})",
                m.uid()
            )));
        }
        if m.mode() & 0o077 != 0 {
            return Err(refuse(format!(
                "mode {:o}: others can read it (chmod 600)",
                m.mode() & 0o777
            )));
        }
    }
    if key.len() < MIN_KEY {
        return Err(refuse(format!("{} bytes, fewer than {MIN_KEY}", key.len())));
    }
    Ok(Some(key))
}

/// Creates `path` with a fresh random key (mode 0600, created new: a file that appeared
/// meanwhile is kept, and read by the caller); its directory is made private if absent.
fn create_key(path: &Path) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        b.create(dir)
            .map_err(|e| io(&format!("creating {}", dir.display()), e))?;
    }
    let hex: String = [nonce()?, nonce()?]
        .iter()
        .flatten()
        .map(|b| format!("{b:02x}"))
        .collect();
    // Written whole beside it, then linked in place: a rank reading at the same moment
    // sees all of the key or no file, and a key that appeared meanwhile is kept.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}.{}", std::process::id(), &hex[..8]));
    let tmp = std::path::PathBuf::from(tmp);
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    let made = o
        .open(&tmp)
        .and_then(|mut f| f.write_all(hex.as_bytes()).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    match made {
        Ok(()) => {
            tracing::info!(path = %path.display(), "created the rendezvous key file");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io(&format!("creating {}", path.display()), e)),
    }
}

/// The key of `path`: rank 0 (`create`) makes it if absent; the other ranks wait for it
/// until `deadline` (rank 0 may still be making it).
pub(crate) fn key(path: &Path, create: bool, deadline: Instant) -> Result<Vec<u8>> {
    let start = Instant::now();
    // Jittered backoff: the ranks of a large job do not reopen the file in lockstep.
    let mut backoff =
        super::backoff::Backoff::new(Duration::from_millis(10), Duration::from_millis(200));
    loop {
        if let Some(k) = read_key(path)? {
            return Ok(k);
        }
        // Rank 0's making of the key is bounded too: whatever keeps the key from appearing
        // after it was made ends at the deadline, not in a loop.
        if create && Instant::now() < deadline {
            create_key(path)?;
            continue;
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: format!(
                    "the rendezvous key file {} that rank 0 creates (waited {:.1?}); a job across nodes needs it on a file system they share, or UNICOMM_RENDEZVOUS_TOKEN",
                    path.display(),
                    start.elapsed()
                ),
                after: start.elapsed(),
            });
        }
        let left = deadline.saturating_duration_since(Instant::now());
        std::thread::sleep(backoff.next().min(left));
    }
}
