//! One rank per process: who am I (from the launcher's variables) and the 128-byte unique id
//! every rank needs, exchanged over a small TCP rendezvous on `MASTER_ADDR:MASTER_PORT`.
//! Across machines NCCL/RCCL themselves carry the traffic; this only hands out the id.

#![deny(unsafe_code)]

mod auth;
mod backoff;
mod client;
mod deadline;
mod drops;
mod file;
mod forward;
mod launcher;
mod rejoin;
mod secret;
mod serve;
mod serving;
mod stream;
mod tcp;

pub use auth::{Hello, HELLO_LEN};
pub use launcher::{LaunchEnv, Launcher, FORWARD_LOCAL_SIZE, LAUNCHERS, MAX_WORLD, MIN_SECRET};
pub use rejoin::Rejoin;
pub use serving::Serving;
pub use tcp::{exchange_unique_id, exchange_unique_ids, exchange_unique_ids_serving, MAX_IDS};
#[cfg(test)]
use {auth::*, backoff::*, client::*, file::listed_acks, serve::*, tcp::*};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_forward;
#[cfg(test)]
mod tests_keys;
#[cfg(test)]
mod tests_replay;
#[cfg(test)]
mod tests_scale;
#[cfg(test)]
mod tests_serving;

/// Raises this process's soft limit of open files to its hard limit (as NCCL's bootstrap
/// root does), for a process that holds a connection or two per rank: the mock's hub
/// holds two per rank, and the usual soft limit of 1,024 ends a world near 500 ranks.
/// Returns the soft limit now in force; never lowers it. A system that refuses the raise
/// (a hard limit the kernel does not allow as soft, `RLIM_INFINITY` on some systems) keeps
/// the limit it had: an error here would end a job that may not need more.
#[cfg(unix)]
pub fn raise_open_files_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 0;
    };
    if soft >= hard {
        return soft;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => {
            tracing::debug!(from = soft, to = hard, "raised the soft open-files limit");
            hard
        }
        Err(e) => {
            tracing::debug!(soft, hard, "the open-files limit stays: {e}");
            soft
        }
    }
}
