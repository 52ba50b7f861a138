//! The rendezvous port a launch hands its ranks.

use anyhow::{Context, Result};

/// A port nobody listens on now, below the kernel's ephemeral range (the rendezvous binds it
/// right after). A port the kernel hands out for `:0` comes from the range it also takes the
/// source ports of outgoing connections from, so another job's rank could take it before
/// rank 0 binds it ("Address already in use", seen in CI with three launches at once).
pub(super) fn free_port() -> Result<u16> {
    let low = ephemeral_low().unwrap_or(32768).max(10_001);
    for _ in 0..200 {
        let mut b = [0u8; 2];
        getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("no randomness for a port: {e}"))?;
        let port = 10_000 + u16::from_le_bytes(b) % (low - 10_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(std::net::TcpListener::bind("127.0.0.1:0")
        .context("finding a free port")?
        .local_addr()?
        .port())
}

/// The first port of the kernel's ephemeral range (Linux; at most 64 bytes read).
fn ephemeral_low() -> Option<u16> {
    use std::io::Read;
    let f = std::fs::File::open("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut text = String::new();
    f.take(64).read_to_string(&mut text).ok()?;
    text.split_whitespace().next()?.parse().ok()
}
