//! The hub against strangers on its port: what they can make it hold before they
//! authenticate is bounded (threads, bytes, time), and the job's ranks still join; and the
//! ranks' requests served by its one loop, whatever the number of ranks waiting.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::hub::Hub;
use super::serve::MAX_UNAUTHENTICATED;
use super::{Client, ProcFabric};
use crate::fabric::{Desc, Exchange, Signature};
use unicomm_core::Error;

/// The tests count this process's threads: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

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
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
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
    assert_eq!(
        named("unicomm-mock-hu"),
        1,
        "strangers are held by the hub's loop, not by threads"
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
    let c = Client::connect(&id, 1, 2, Duration::from_secs(20));
    assert!(c.is_ok(), "{:?}", c.err());
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
    drop(hub);
}

/// This process's threads whose name starts with `prefix` (names are cut at 15 bytes).
fn named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim_end().starts_with(prefix))
                })
                .count()
        })
        .unwrap_or(0)
}

/// The hub watches every rank's life from one thread: a thread per rank polling every
/// 50 ms was 20,000 wake-ups a second at 1,023 ranks, and a thousand threads.
#[test]
fn every_ranks_life_is_watched_by_one_thread_and_a_death_is_still_seen() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (hub, id) = Hub::start(41, Duration::from_secs(30)).unwrap();
    let clients: Vec<_> = (1..41)
        .map(|r| Client::connect(&id, r, 41, Duration::from_secs(20)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        named("unicomm-mock-hu"),
        1,
        "the hub's threads: its accept loop only"
    );
    assert_eq!(named("unicomm-hub-liv"), 1);
    // A rank gone without its goodbye poisons the world, and the others are told.
    drop(clients.into_iter().nth(6));
    let t = Instant::now();
    while crate::fabric::Exchange::poisoned(&hub.fabric).is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "rank 7's death not seen"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(hub);
}

/// Over the cap of silent strangers a newer arrival takes the oldest one's place (closed),
/// so the hub never holds more than the cap, and the newest is in a slot, not left in the
/// kernel's queue behind them.
#[test]
fn over_the_cap_the_oldest_silent_connection_gives_way() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (hub, id) = Hub::start(2, Duration::from_secs(30)).unwrap();
    let addr = ("127.0.0.1", id.port);
    let mut silent: Vec<TcpStream> = (0..MAX_UNAUTHENTICATED)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let _late = TcpStream::connect(addr).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let oldest = &mut silent[0];
    oldest
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut b = [0u8; 1];
    assert!(
        matches!(oldest.read(&mut b), Ok(0) | Err(_)),
        "the oldest silent connection was kept"
    );
    drop(hub);
}

/// 300 silent connections of a local stranger do not lock a real rank out: it joins well
/// within a 3 s deadline (each silent connection held a slot 2 s in turn before).
#[test]
fn three_hundred_silent_strangers_do_not_lock_a_rank_out() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (hub, id) = Hub::start(2, Duration::from_secs(30)).unwrap();
    let addr = ("127.0.0.1", id.port);
    let _silent: Vec<TcpStream> = (0..300)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect();
    let t = Instant::now();
    let c = Client::connect(&id, 1, 2, Duration::from_secs(3));
    assert!(c.is_ok(), "{:?}", c.err());
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    drop(hub);
}

/// One rank's part of a collective, as the tests deposit it.
fn desc() -> Desc {
    Desc {
        sig: Signature {
            kind: "AllReduce",
            count: 1,
            dtype: None,
            op: None,
            root: None,
            send_reg: None,
            recv_reg: None,
        },
        send: 0,
        recv: 0,
        send_at: None,
        recv_at: None,
    }
}

/// Ranks waiting in a collective for a late peer hold no thread of the hub each: their
/// requests wait in its one loop (a thread per connection was a thousand threads in rank
/// 0's process at 1,024 ranks), and all of them are answered when the peer arrives, with
/// every rank's description (published in shared memory above a size: 1 KiB here).
#[test]
fn ranks_waiting_in_a_collective_hold_no_thread_of_the_hub() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let world = 33;
    let (hub, id) = Hub::start(world, Duration::from_secs(30)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let waiting: Vec<_> = (1..world)
        .map(|r| {
            let c = Client::connect(&id, r, world, Duration::from_secs(20)).unwrap();
            let f = Arc::new(ProcFabric::client(c));
            std::thread::spawn(move || f.gather(0, r, desc(), deadline).map(|all| all.len()))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        waiting.iter().all(|h| !h.is_finished()),
        "a gather ended without rank 0"
    );
    assert_eq!(
        named("unicomm-mock-hu"),
        1,
        "{} ranks waiting held threads of the hub",
        world - 1
    );
    // Rank 0 arrives: every waiting rank gets every rank's part.
    let all = hub.fabric.gather(0, 0, desc(), deadline).unwrap();
    assert_eq!(all.len(), world);
    for h in waiting {
        assert_eq!(h.join().unwrap().unwrap(), world);
    }
    drop(hub);
}

/// A request waiting in the hub's loop ends at its deadline with `Timeout` (the loop wakes
/// for it), and the world is poisoned as on threads.
#[test]
fn a_request_waiting_in_the_hubs_loop_ends_at_its_deadline() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (hub, id) = Hub::start(3, Duration::from_secs(30)).unwrap();
    let c = Client::connect(&id, 1, 3, Duration::from_secs(20)).unwrap();
    let f = ProcFabric::client(c);
    let t = Instant::now();
    let r = f.gather(0, 1, desc(), t + Duration::from_millis(300));
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(matches!(hub.fabric.poisoned(), Some(Error::Timeout { .. })));
    drop(hub);
}

/// A rank given a unique id whose secret is not the hub's is refused as a bootstrap error
/// naming the secret, not as the hub's loss (`Aborted`, "cannot reach the hub").
#[test]
fn a_wrong_secret_is_named_not_taken_for_the_hubs_loss() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (hub, id) = Hub::start(2, Duration::from_secs(30)).unwrap();
    let mut secret = id.secret;
    secret[0] ^= 0xff;
    let wrong = super::wire::HubId {
        port: id.port,
        secret,
    };
    let e = Client::connect(&wrong, 1, 2, Duration::from_secs(2))
        .err()
        .expect("a wrong secret joins nothing");
    match &e {
        Error::Bootstrap { reason } => assert!(reason.contains("secret"), "{reason}"),
        other => panic!("{other:?}"),
    }
    drop(hub);
}
