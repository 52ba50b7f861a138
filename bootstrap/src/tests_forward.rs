//! Forwarding through each host's first rank: rank 0 serves its host and each other host's
//! first rank; the others join their host's first rank on the host's local socket.
use super::*;
use std::time::Duration;

use unicomm_core::{Error, Result};

use super::tests::{env, free_port};

/// Rank `rank` of a job forwarding through each host's first of `per_host` ranks; the token
/// names the job (each test its own: the local sockets are named by it, as real jobs' are).
fn forwarded(rank: usize, world: usize, port: u16, per_host: usize) -> LaunchEnv {
    LaunchEnv {
        forward: Some(per_host),
        local_rank: rank % per_host,
        token: format!("job-on-{port}").into_bytes(),
        ..env(rank, world, port)
    }
}

/// Two "hosts" of three ranks: ranks 4 and 5 are given a port where nothing listens, so
/// they can only hold rank 0's ids through host 1's first rank (rank 3), which serves them
/// after joining rank 0 itself; rank 0 ends after serving ranks 1, 2 and 3 alone.
#[cfg(target_os = "linux")]
#[test]
fn a_hosts_other_ranks_hold_the_ids_through_its_first_rank() {
    let (port, nowhere) = (free_port(), free_port());
    let ids: Vec<Result<Vec<[u8; 128]>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..6)
            .map(|r| {
                s.spawn(move || {
                    let e = LaunchEnv {
                        master: ("127.0.0.1".into(), if r >= 4 { nowhere } else { port }),
                        ..forwarded(r, 6, port, 3)
                    };
                    exchange_unique_ids(
                        &e,
                        2,
                        || Ok(vec![[7; 128], [8; 128]]),
                        Duration::from_secs(10),
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, got) in ids.iter().enumerate() {
        assert_eq!(
            got.as_ref().map_err(|e| format!("rank {r}: {e}")).unwrap(),
            &vec![[7; 128], [8; 128]],
            "rank {r}"
        );
    }
}

/// A host's first rank serves beside its caller too: it returns holding the ids, and its
/// `Serving` finishes once the host's other ranks joined; a rank of another job (another
/// token) does not get them (its own job's socket has no server; this job's handshake
/// would refuse it).
#[cfg(target_os = "linux")]
#[test]
fn a_hosts_first_rank_serves_beside_its_caller_and_only_its_own_job() {
    let port = free_port();
    std::thread::scope(|s| {
        let root = s.spawn(move || {
            exchange_unique_ids(
                &forwarded(0, 4, port, 2),
                1,
                || Ok(vec![[3; 128]]),
                Duration::from_secs(10),
            )
        });
        let (ids, serving) = exchange_unique_ids_serving(
            &forwarded(2, 4, port, 2),
            1,
            || unreachable!(),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(ids, vec![[3; 128]]);
        let stranger = LaunchEnv {
            token: b"another-job".to_vec(),
            ..forwarded(3, 4, port, 2)
        };
        let other =
            exchange_unique_ids(&stranger, 1, || unreachable!(), Duration::from_millis(600));
        assert!(matches!(other, Err(Error::Timeout { .. })), "{other:?}");
        let mine = exchange_unique_ids(
            &forwarded(3, 4, port, 2),
            1,
            || unreachable!(),
            Duration::from_secs(10),
        );
        assert_eq!(mine.unwrap(), vec![[3; 128]]);
        serving.finish().unwrap();
        let one = exchange_unique_ids(
            &forwarded(1, 4, port, 2),
            1,
            || unreachable!(),
            Duration::from_secs(10),
        );
        assert_eq!(one.unwrap(), vec![[3; 128]]);
        assert_eq!(root.join().unwrap().unwrap(), vec![[3; 128]]);
    });
}

/// The ranks per host come from the launcher; forwarding refuses a placement that is not
/// by block (rank % per host = local rank) and a missing size, naming the rule, and has
/// nothing to do on one host.
#[test]
fn forwarding_reads_the_ranks_per_host_and_refuses_what_it_cannot_do() {
    let vars = |rank: &str, local: &str, size: Option<&str>| {
        let mut kv = vec![
            ("RANK", rank.to_string()),
            ("WORLD_SIZE", "8".to_string()),
            ("LOCAL_RANK", local.to_string()),
            ("MASTER_ADDR", "127.0.0.1".to_string()),
            ("MASTER_PORT", "29500".to_string()),
            ("UNICOMM_RENDEZVOUS_TOKEN", "t".to_string()),
            ("UNICOMM_RENDEZVOUS_FORWARD", "1".to_string()),
        ];
        if let Some(s) = size {
            kv.push(("LOCAL_WORLD_SIZE", s.to_string()));
        }
        LaunchEnv::from_vars(move |k| kv.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()))
    };
    assert_eq!(vars("5", "1", Some("4")).unwrap().forward, Some(4));
    let cyclic = vars("5", "0", Some("4")).unwrap_err().to_string();
    assert!(cyclic.contains("placed by block"), "{cyclic}");
    let missing = vars("5", "1", None).unwrap_err().to_string();
    assert!(missing.contains("LOCAL_WORLD_SIZE"), "{missing}");
    assert_eq!(vars("5", "5", Some("8")).unwrap().forward, None);
}

/// With forwarding rank 0's listen queues are sized for the ranks that join it itself (its
/// host's and each other host's first): 16,384 ranks of 8 per host fit one queue of
/// Linux's default cap, where sizing for the world would open five.
#[test]
fn with_forwarding_rank_0s_queues_hold_the_hosts_first_ranks_not_the_world() {
    let hosts = forwarded(0, 16_384, 1, 8);
    assert_eq!(joining_rank0(&hosts), 7 + 2_047);
    let direct = env(0, 16_384, 1);
    assert_eq!(joining_rank0(&direct), 16_383);
}
