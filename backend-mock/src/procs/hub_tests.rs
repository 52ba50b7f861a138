//! The hub against strangers on its port: what they can make it hold before they
//! authenticate is bounded (threads, bytes, time), and the job's ranks still join.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::hub::{Hub, MAX_UNAUTHENTICATED};
use super::Client;

fn threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn strangers_hold_bounded_threads_and_bytes_and_the_rank_still_joins() {
    let (hub, id) = Hub::start(2, Duration::from_secs(30)).unwrap();
    let before = threads();
    let addr = ("127.0.0.1", id.port);
    // Silent connections, more than the hub takes at once.
    let silent: Vec<TcpStream> = (0..200)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let grew = threads().saturating_sub(before);
    assert!(
        grew <= MAX_UNAUTHENTICATED + 2,
        "{grew} threads for {} strangers",
        silent.len()
    );
    // A stranger announcing a 16 MiB hello is closed without the hub reading (or making
    // room for) it.
    drop(silent);
    std::thread::sleep(Duration::from_millis(100));
    let mut big = TcpStream::connect(addr).unwrap();
    big.write_all(&(16u32 << 20).to_le_bytes()).unwrap();
    big.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t = Instant::now();
    let mut b = [0u8; 1];
    assert!(matches!(big.read(&mut b), Ok(0) | Err(_)));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // Strangers again filling every slot: the real rank retries past them (each holds a
    // slot at most 2 s) and joins.
    let _again: Vec<TcpStream> = (0..MAX_UNAUTHENTICATED + 8)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    let c = Client::connect(&id, 1, Duration::from_secs(20));
    assert!(c.is_ok(), "{:?}", c.err());
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
    drop(hub);
}
