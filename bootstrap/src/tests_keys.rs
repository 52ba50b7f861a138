#![allow(unsafe_code, reason = "the tests make FIFOs (libc::mkfifo)")]
//! The rendezvous against strangers who know everything public about the job (its address,
//! size and launcher job id): a key file only the user can read, handshakes served
//! concurrently, refusals believed only when authenticated.
use super::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use unicomm_core::Error;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Rank `rank` of a torchrun-like job of `world` on `port`, its key in `key`.
fn job(rank: usize, world: usize, port: u16, key: &std::path::Path) -> LaunchEnv {
    let r = rank.to_string();
    let w = world.to_string();
    let p = port.to_string();
    let kv = [
        ("RANK", r.as_str()),
        ("WORLD_SIZE", w.as_str()),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", p.as_str()),
        ("TORCHELASTIC_RUN_ID", "public-run-id"),
        ("UNICOMM_RENDEZVOUS_SECRET_FILE", key.to_str().unwrap()),
    ];
    LaunchEnv::from_vars(|k| kv.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())).unwrap()
}

fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("unicomm-keys-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A key file as an operator makes it: 32 hex digits, readable by its owner only.
fn private_key(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let key = dir.join("k");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    key
}

#[test]
fn rank_zero_creates_a_private_key_file_and_a_stranger_with_the_job_id_cannot_join() {
    use std::os::unix::fs::PermissionsExt;
    let d = scratch("create");
    let key = d.join("sub/rendezvous.key");
    let port = free_port();
    let out: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .rev() // the others start before rank 0 made the key
            .map(|r| {
                let e = job(r, 3, port, &key);
                s.spawn(move || exchange_unique_id(&e, || Ok([3; 128]), Duration::from_secs(10)))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for o in out {
        assert_eq!(o.unwrap(), [3; 128]);
    }
    let mode = std::fs::metadata(&key).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    // A stranger knows the address, size and job id, but has another key (its own file).
    let port = free_port();
    let other = d.join("stranger.key");
    std::fs::write(&other, "a-key-of-another-user-0123456789").unwrap();
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (r0, stranger) = std::thread::scope(|s| {
        let e0 = job(0, 2, port, &key);
        let r0 =
            s.spawn(move || exchange_unique_id(&e0, || Ok([4; 128]), Duration::from_millis(1500)));
        let e1 = job(1, 2, port, &other);
        let st = exchange_unique_id(&e1, || Ok([0; 128]), Duration::from_millis(1500));
        (r0.join().unwrap(), st)
    });
    assert!(matches!(r0, Err(Error::Timeout { .. })), "{r0:?}");
    assert!(
        matches!(stranger, Err(Error::Timeout { .. })),
        "{stranger:?}"
    );
}

#[test]
fn a_key_file_others_can_read_or_that_is_a_fifo_is_refused_without_blocking() {
    use std::os::unix::fs::PermissionsExt;
    let d = scratch("bad");
    let open = d.join("open.key");
    std::fs::write(&open, "0123456789abcdef0123456789abcdef").unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let r = exchange_unique_id(
        &job(1, 2, free_port(), &open),
        || Ok([0; 128]),
        Duration::from_secs(5),
    );
    match r {
        Err(Error::Bootstrap { reason }) => assert!(reason.contains("chmod 600"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let fifo = d.join("fifo.key");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid C path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let t0 = Instant::now();
    let r = exchange_unique_id(
        &job(0, 2, free_port(), &fifo),
        || Ok([0; 128]),
        Duration::from_secs(5),
    );
    assert!(matches!(r, Err(Error::Bootstrap { .. })), "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
}

/// A dangling symbolic link at the key's path reads as "no key yet" through the link while
/// making the key there fails as "someone made it": rank 0 looped for good. It is refused at
/// once, naming the link; a link to a good key is refused too (never followed).
#[test]
fn a_symbolic_link_at_the_key_path_is_refused_at_once_by_every_rank() {
    let d = scratch("link");
    let dangling = d.join("dangling.key");
    std::os::unix::fs::symlink(d.join("nowhere"), &dangling).unwrap();
    for rank in [0, 1] {
        let t0 = Instant::now();
        let r = exchange_unique_id(
            &job(rank, 2, free_port(), &dangling),
            || Ok([0; 128]),
            Duration::from_secs(5),
        );
        match r {
            Err(Error::Bootstrap { reason }) => {
                assert!(reason.contains("symbolic link"), "{reason}")
            }
            other => panic!("rank {rank}: {other:?}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    }
    assert!(
        !d.join("nowhere").exists(),
        "the key was made through the link"
    );
}

#[test]
fn silent_connections_do_not_lock_a_real_rank_out() {
    let d = scratch("silent");
    let key = d.join("k");
    let port = free_port();
    let t0 = Instant::now();
    let out = std::thread::scope(|s| {
        let e0 = job(0, 2, port, &key);
        let r0 = s.spawn(move || exchange_unique_id(&e0, || Ok([7; 128]), Duration::from_secs(10)));
        // Sixteen connections that never say a word, opened before the real rank 1; served
        // one after another they would hold it back 2 s each, past its deadline.
        let mut silent = Vec::new();
        while silent.len() < 16 {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(c) => silent.push(c),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        let r1 = exchange_unique_id(
            &job(1, 2, port, &key),
            || Ok([0; 128]),
            Duration::from_secs(10),
        );
        drop(silent);
        (r0.join().unwrap(), r1)
    });
    assert_eq!(out.0.unwrap(), [7; 128]);
    assert_eq!(out.1.unwrap(), [7; 128]);
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
}

#[test]
fn a_refusal_without_the_token_is_not_believed() {
    let d = scratch("squat");
    let key = private_key(&d);
    let port = free_port();
    // A squatter answers every rank's message with the refusal byte (and some bytes as the
    // number of ids and its "proof").
    let squat = TcpListener::bind(("127.0.0.1", port)).unwrap();
    squat.set_nonblocking(true).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let squatter = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok((mut s, _)) = squat.accept() {
                    let _ = s.set_nonblocking(false);
                    let mut first = [0u8; FIRST_LEN];
                    if s.read_exact(&mut first).is_ok() {
                        let _ = s.write_all(&[REFUSED]);
                        let _ = s.write_all(&[0u8; 2 + 32]);
                    }
                } else {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        })
    };
    let t0 = Instant::now();
    let r = exchange_unique_id(
        &job(1, 2, port, &key),
        || Ok([0; 128]),
        Duration::from_millis(800),
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    squatter.join().unwrap();
    // Retried until the deadline, never taken as rank 0's word.
    match r {
        Err(Error::Timeout { what, .. }) => assert!(what.contains("stranger"), "{what}"),
        other => panic!("expected a timeout naming the stranger, got {other:?}"),
    }
    assert!(t0.elapsed() >= Duration::from_millis(800));
}

#[test]
fn a_timeout_names_the_last_answer_heard_not_the_attempt_its_own_deadline_cut() {
    let d = scratch("cut");
    let key = private_key(&d);
    let port = free_port();
    // A squatter refuses the first connection without the token, then reads every later
    // rank's message and never answers: the rank's last attempt is cut by its deadline.
    let squat = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let squatter = std::thread::spawn(move || {
        let mut held = Vec::new();
        for (i, s) in squat.incoming().enumerate() {
            let Ok(mut s) = s else { break };
            let mut first = [0u8; FIRST_LEN];
            if s.read_exact(&mut first).is_err() {
                break; // the test's own wake-up connection
            }
            if i == 0 {
                let _ = s.write_all(&[REFUSED]);
                let _ = s.write_all(&[0u8; 2 + 32]);
            } else {
                held.push(s);
            }
        }
    });
    let r = exchange_unique_id(
        &job(1, 2, port, &key),
        || Ok([0; 128]),
        Duration::from_millis(600),
    );
    drop(TcpStream::connect(("127.0.0.1", port)));
    squatter.join().unwrap();
    match r {
        Err(Error::Timeout { what, .. }) => {
            assert!(what.contains("stranger"), "{what}");
            assert!(!what.contains("timed out"), "{what}");
        }
        other => panic!("expected a timeout naming the stranger, got {other:?}"),
    }
}

#[test]
fn a_stale_file_of_an_earlier_run_with_the_same_token_is_never_taken() {
    let d = scratch("stale");
    let path = d.join("job.id");
    let env = |rank| LaunchEnv {
        rank,
        world_size: 2,
        local_rank: rank,
        master: (String::new(), 0),
        file: Some(path.clone()),
        launcher: "test",
        token: b"the-same-token-every-run".to_vec(),
        token_source: "test",
        secret_file: None,
        forward: None,
    };
    // An earlier run's rank 0 wrote its file and died (a copy of it, kept as it was).
    let copy = d.join("earlier.id");
    let given = path.clone();
    let path = crate::file::job_file(&env(0), &given);
    std::thread::scope(|s| {
        let e0 = env(0);
        let r0 =
            s.spawn(move || exchange_unique_id(&e0, || Ok([1; 128]), Duration::from_millis(400)));
        let t = Instant::now();
        while std::fs::copy(&path, &copy).is_err() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(r0.join().unwrap().is_err(), "no rank 1 came");
    });
    std::fs::rename(&copy, &path).unwrap();
    let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(an_hour_ago)
        .unwrap();
    // This run's rank 1 starts before its rank 0: it must wait, not take the old id.
    let r = exchange_unique_id(&env(1), || Ok([0; 128]), Duration::from_millis(800));
    match r {
        Err(Error::Timeout { what, .. }) => assert!(what.contains("earlier run"), "{what}"),
        other => panic!("the stale file was taken: {other:?}"),
    }
    // A relaunch (torchrun's restart count) is another rendezvous: another token.
    let vars = |restart: &'static str| {
        move |k: &str| {
            [
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "h"),
                ("MASTER_PORT", "1"),
                ("UNICOMM_RENDEZVOUS_TOKEN", "t"),
                ("TORCHELASTIC_RESTART_COUNT", restart),
            ]
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
        }
    };
    let (a, b) = (
        LaunchEnv::from_vars(vars("0")).unwrap(),
        LaunchEnv::from_vars(vars("1")).unwrap(),
    );
    assert_ne!(a.token, b.token);
    let _ = std::fs::remove_dir_all(&d);
}
