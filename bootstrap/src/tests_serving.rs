//! Rank 0 serving the rendezvous beside its caller: it holds the ids before any other rank
//! joined, and `finish` reports how the rendezvous ended.
use super::*;
use std::time::{Duration, Instant};

use super::tests::{env, free_port};

/// Rank 0 goes on to create its communicator at once (NCCL's creation waits for every rank
/// anyway); the ranks that join later get the same ids from the thread serving them.
#[test]
fn rank_0_holds_the_ids_before_anyone_joined_and_serves_them_meanwhile() {
    let port = free_port();
    let t = Instant::now();
    let (ids, serving) = exchange_unique_ids_serving(
        &env(0, 3, port),
        2,
        || Ok(vec![[5; 128], [6; 128]]),
        Duration::from_secs(10),
    )
    .unwrap();
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(ids, vec![[5; 128], [6; 128]]);
    assert!(!serving.is_finished(), "no other rank has joined yet");
    std::thread::scope(|s| {
        let joined: Vec<_> = (1..3)
            .map(|r| {
                s.spawn(move || {
                    exchange_unique_ids(
                        &env(r, 3, port),
                        2,
                        || unreachable!("only rank 0 makes ids"),
                        Duration::from_secs(10),
                    )
                })
            })
            .collect();
        for j in joined {
            assert_eq!(j.join().unwrap().unwrap(), vec![[5; 128], [6; 128]]);
        }
    });
    serving.finish().unwrap();
}

/// A rank that never joins: rank 0 returned at once, and `finish` names the rank missing at
/// the rendezvous's deadline (what a communicator's creation that timed out cannot say).
#[test]
fn finish_names_the_rank_that_never_joined() {
    let port = free_port();
    let (_, serving) = exchange_unique_ids_serving(
        &env(0, 2, port),
        1,
        || Ok(vec![[1; 128]]),
        Duration::from_millis(300),
    )
    .unwrap();
    let t = Instant::now();
    let r = serving.finish();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    match r {
        Err(unicomm_core::Error::Timeout { what, .. }) => {
            assert!(what.contains("rank(s) 1"), "{what}")
        }
        other => panic!("{other:?}"),
    }
}

/// A port already taken is the call's own error, not the serving thread's.
#[test]
fn a_port_taken_fails_the_call_itself() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let r = exchange_unique_ids_serving(
        &env(0, 2, port),
        1,
        || Ok(vec![[1; 128]]),
        Duration::from_secs(2),
    );
    assert!(r.is_err(), "rank 0 listened on a taken port");
}
