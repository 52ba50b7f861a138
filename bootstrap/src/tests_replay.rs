//! The rendezvous against replays and squatters: replayed hellos that never acknowledge,
//! a squatter that holds a rank's first connection silent, two rank 0s started together.

use super::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::tests::{env, free_port};
use super::tests_scale::connect_when_listening;

/// Two rank 0s of one job started at the same moment, each with shared queues: exactly one
/// has the port, in every trial (a probe, then the binds, let both have it in 7-15 of 20).
#[test]
fn of_two_rank_0s_started_together_one_has_the_port() {
    for trial in 0..20 {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let start = std::sync::Barrier::new(2);
        let got: Vec<bool> = std::thread::scope(|s| {
            let take = || {
                start.wait();
                stream::listen_capped(addr, 24, 8)
            };
            let a = s.spawn(take);
            let b = s.spawn(take);
            let (a, b) = (a.join().unwrap(), b.join().unwrap());
            // Both results held until both ended: a refused one sees the other's port.
            vec![a.is_ok(), b.is_ok()]
        });
        assert_eq!(
            got.iter().filter(|&&ok| ok).count(),
            1,
            "trial {trial}: {got:?}"
        );
    }
}

/// 256 replays of one captured hello, answered and never acknowledged, once held every
/// handshake slot until rank 0's deadline: every real rank was locked out. A connection
/// that owes its acknowledgement takes no slot, so the real ranks join at once.
#[test]
fn replayed_hellos_that_never_acknowledge_lock_no_rank_out() {
    use crate::auth::FIRST_LEN;
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let squat = std::net::TcpListener::bind(addr).unwrap();
    std::thread::scope(|s| {
        let r1 = s.spawn(move || {
            exchange_unique_id(&env(1, 3, port), || Ok([0; 128]), Duration::from_secs(20))
        });
        let (mut captured_from, _) = squat.accept().unwrap();
        let mut hello = vec![0u8; FIRST_LEN];
        captured_from.read_exact(&mut hello).unwrap();
        drop(squat);
        let t = Instant::now();
        let r0 = s.spawn(move || {
            exchange_unique_id(&env(0, 3, port), || Ok([5; 128]), Duration::from_secs(20))
        });
        let replays: Vec<TcpStream> = (0..crate::serve::MAX_HANDSHAKES)
            .map(|_| {
                let mut c = connect_when_listening(addr);
                c.write_all(&hello).unwrap();
                let mut kind = [0u8; 1];
                c.read_exact(&mut kind).unwrap();
                c
            })
            .collect();
        drop(captured_from);
        let r2 = s.spawn(move || {
            exchange_unique_id(&env(2, 3, port), || Ok([0; 128]), Duration::from_secs(20))
        });
        let (r0, r1, r2) = (r0.join().unwrap(), r1.join().unwrap(), r2.join().unwrap());
        drop(replays);
        assert_eq!(r0.unwrap(), [5; 128]);
        assert_eq!(r1.unwrap(), [5; 128]);
        assert_eq!(r2.unwrap(), [5; 128]);
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    });
}

/// A squatter that took rank 1's first connection before rank 0 listened and keeps it open
/// and silent once it let the port go: rank 1 leaves it after the first answer's wait and
/// joins the real rank 0 on a new connection, instead of waiting its whole deadline.
#[test]
fn a_silent_squatter_holding_a_ranks_connection_costs_it_one_answer_wait() {
    use crate::auth::FIRST_LEN;
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let squat = std::net::TcpListener::bind(addr).unwrap();
    std::thread::scope(|s| {
        let t = Instant::now();
        let r1 = s.spawn(move || {
            exchange_unique_id(&env(1, 2, port), || Ok([0; 128]), Duration::from_secs(30))
        });
        let (mut held, _) = squat.accept().unwrap();
        let mut hello = vec![0u8; FIRST_LEN];
        held.read_exact(&mut hello).unwrap();
        drop(squat);
        let r0 = s.spawn(move || {
            exchange_unique_id(&env(0, 2, port), || Ok([4; 128]), Duration::from_secs(30))
        });
        let (r0, r1) = (r0.join().unwrap(), r1.join().unwrap());
        drop(held);
        assert_eq!(r0.unwrap(), [4; 128]);
        assert_eq!(r1.unwrap(), [4; 128]);
        assert!(t.elapsed() < Duration::from_secs(12), "{:?}", t.elapsed());
    });
}
