//! Forwarding through each host's first rank (`UNICOMM_RENDEZVOUS_FORWARD=1`): rank 0 serves
//! its own host's ranks and each other host's first rank; a host's first rank, once it holds
//! the ids, serves its host's other ranks on a local socket with the same handshake. Rank 0
//! then holds one connection per host instead of one per rank.
//!
//! The local socket is a Unix socket in Linux's abstract namespace (never a file, reachable
//! only from this host's network namespace), named by a MAC of the job's token and the
//! host's number, so two jobs on one host never meet; a stranger who finds it still has to
//! pass the handshake, with the same bounds as rank 0's port.

use super::auth::Key;
use super::launcher::LaunchEnv;
use unicomm_core::{Error, Result};

/// What a rank does in the rendezvous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Rank 0: makes the ids and serves on `MASTER_ADDR:MASTER_PORT`.
    Root,
    /// Joins rank 0 over TCP (every rank without forwarding; rank 0's own host's with it).
    Direct,
    /// The first rank of host `host` (not rank 0's): joins rank 0, then serves its host's
    /// other `per_host - 1` ranks.
    Forwarder { host: usize, per_host: usize },
    /// Another rank of host `host`: joins the host's first rank on the local socket.
    Forwarded { host: usize },
}

pub(crate) fn role(env: &LaunchEnv) -> Role {
    let Some(l) = env.forward else {
        return if env.rank == 0 {
            Role::Root
        } else {
            Role::Direct
        };
    };
    match (env.rank, env.rank / l, env.rank % l) {
        (0, _, _) => Role::Root,
        (_, 0, _) => Role::Direct,
        (_, host, 0) => Role::Forwarder { host, per_host: l },
        (_, host, _) => Role::Forwarded { host },
    }
}

/// Whether rank 0 serves rank `r` itself: every other rank, or with forwarding its own
/// host's and each other host's first.
pub(crate) fn rank0_serves(env: &LaunchEnv, r: usize) -> bool {
    r != 0 && env.forward.is_none_or(|l| r < l || r.is_multiple_of(l))
}

/// Host `host`'s local socket for this job.
#[cfg(target_os = "linux")]
pub(crate) fn local_addr(env: &LaunchEnv, host: usize) -> Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    let tag = Key::new(&env.token).mac(b"forward", &[&(host as u64).to_le_bytes()]);
    let hex: String = tag[..12].iter().map(|b| format!("{b:02x}")).collect();
    let name = format!("unicomm-rendezvous-{hex}");
    std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| {
        Error::Bootstrap {
            reason: format!("the host's local rendezvous socket: {e}"),
        }
    })
}

/// The forwarder's listener on its host's local socket, bound before it joins rank 0 (its
/// host's ranks then wait in the queue, not in retries).
#[cfg(target_os = "linux")]
pub(crate) fn listen_local(env: &LaunchEnv, host: usize) -> Result<mio::net::UnixListener> {
    let addr = local_addr(env, host)?;
    let what = |e: std::io::Error| Error::Bootstrap {
        reason: format!("host {host}'s first rank cannot listen on its local socket: {e}"),
    };
    let l = std::os::unix::net::UnixListener::bind_addr(&addr).map_err(what)?;
    l.set_nonblocking(true).map_err(what)?;
    Ok(mio::net::UnixListener::from_std(l))
}
