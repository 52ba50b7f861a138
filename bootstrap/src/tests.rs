#![allow(unsafe_code, reason = "the tests make FIFOs (libc::mkfifo)")]
//! Tests of the launcher variables and the rendezvous, attacks included.
use super::*;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};
use unicomm_core::{Error, Place, Result};

fn vars(kv: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = kv
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

#[test]
fn reads_each_launcher() {
    let t = LaunchEnv::from_vars(vars(&[
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("MASTER_ADDR", "h"),
        ("MASTER_PORT", "29500"),
    ]))
    .unwrap();
    assert_eq!(
        (t.rank, t.world_size, t.local_rank, t.launcher),
        (3, 8, 1, "torchrun")
    );
    let m = LaunchEnv::from_vars(vars(&[
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("MASTER_ADDR", "h"),
        ("MASTER_PORT", "1"),
    ]))
    .unwrap();
    assert_eq!((m.rank, m.world_size, m.local_rank), (1, 2, 1));
    let s = LaunchEnv::from_vars(vars(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_LOCALID", "0"),
        ("MASTER_ADDR", "h"),
        ("MASTER_PORT", "2"),
    ]))
    .unwrap();
    assert_eq!(s.launcher, "srun (Slurm)");
    let base = [("MASTER_ADDR", "h"), ("MASTER_PORT", "3")];
    for (kv, want) in [
        (
            vec![
                ("PMI_RANK", "2"),
                ("PMI_SIZE", "3"),
                ("MPI_LOCALRANKID", "1"),
            ],
            (2, 3, 1, "mpiexec (MPICH / Intel MPI, PMI)"),
        ),
        (
            vec![
                ("MV2_COMM_WORLD_RANK", "1"),
                ("MV2_COMM_WORLD_SIZE", "5"),
                ("MV2_COMM_WORLD_LOCAL_RANK", "0"),
            ],
            (1, 5, 0, "mpirun (MVAPICH2)"),
        ),
        (
            vec![
                ("PMIX_RANK", "4"),
                ("PMIX_SIZE", "6"),
                ("PMIX_LOCAL_RANK", "2"),
            ],
            (4, 6, 2, "PMIx"),
        ),
        // PMIx under srun --mpi=pmix: Slurm's size and local rank.
        (
            vec![
                ("PMIX_RANK", "1"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_LOCALID", "1"),
            ],
            (1, 2, 1, "PMIx"),
        ),
    ] {
        let kv: Vec<_> = kv.into_iter().chain(base).collect();
        let e = LaunchEnv::from_vars(vars(&kv)).unwrap();
        assert_eq!(
            (e.rank, e.world_size, e.local_rank, e.launcher),
            want,
            "{kv:?}"
        );
    }
    // None found: the error names what was looked for, every launcher.
    let e = LaunchEnv::from_vars(vars(&base)).unwrap_err().to_string();
    for v in [
        "RANK",
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "PMIX_RANK",
        "SLURM_PROCID",
        "MV2_COMM_WORLD_RANK",
    ] {
        assert!(e.contains(v), "{e}");
    }
}

#[test]
fn bad_or_missing_variables_are_bootstrap_errors() {
    for kv in [
        vec![],
        vec![
            ("RANK", "x"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ],
        vec![
            ("RANK", "2"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ],
        vec![("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "1")],
        vec![
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "99999"),
        ],
    ] {
        assert!(
            matches!(
                LaunchEnv::from_vars(vars(&kv)),
                Err(Error::Bootstrap { .. })
            ),
            "{kv:?}"
        );
    }
}

pub(super) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(super) fn env(rank: usize, world: usize, port: u16) -> LaunchEnv {
    LaunchEnv {
        rank,
        world_size: world,
        local_rank: rank,
        master: ("127.0.0.1".into(), port),
        file: None,
        launcher: "test",
        token: b"job-42".to_vec(),
        token_source: "test",
        secret_file: None,
        forward: None,
    }
}

#[test]
fn every_rank_gets_rank_zeros_id() {
    let port = free_port();
    let ids: Vec<Result<[u8; 128]>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .rev() // the others start before rank 0 listens
            .map(|r| {
                s.spawn(move || {
                    exchange_unique_id(&env(r, 4, port), || Ok([42; 128]), Duration::from_secs(10))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for id in ids {
        assert_eq!(id.unwrap(), [42; 128]);
    }
}

#[test]
fn a_missing_rank_times_out_and_a_wrong_world_is_refused() {
    let port = free_port();
    let r = exchange_unique_id(
        &env(0, 2, port),
        || Ok([1; 128]),
        Duration::from_millis(200),
    );
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    let port = free_port();
    let r = exchange_unique_id(
        &env(1, 2, port),
        || Ok([1; 128]),
        Duration::from_millis(200),
    );
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    let port = free_port();
    let out: Vec<Result<[u8; 128]>> = std::thread::scope(|s| {
        let a = s.spawn(move || {
            exchange_unique_id(&env(0, 2, port), || Ok([1; 128]), Duration::from_secs(5))
        });
        let b = s.spawn(move || {
            exchange_unique_id(&env(1, 3, port), || Ok([1; 128]), Duration::from_secs(5))
        });
        vec![a.join().unwrap(), b.join().unwrap()]
    });
    // A rank holding the job's token but told another world size: refused, and rank 0
    // fails at once too (the job is misconfigured), naming both sizes.
    assert!(
        matches!(&out[0], Err(Error::InvalidArgument { reason, .. }) if reason.contains("world of 3") && reason.contains("one of 2")),
        "{:?}",
        out[0]
    );
    assert!(
        matches!(out[1], Err(Error::Bootstrap { .. })),
        "{:?}",
        out[1]
    );
}

/// Ranks whose launcher variables give different `WORLD_SIZE`s share the job's token (the
/// size is proven in each message, not mixed into the token): the rank told another size
/// is refused and rank 0 fails naming both sizes, both well before the deadline (10 s),
/// instead of the rank waiting out its deadline as a stranger.
#[test]
fn a_rank_told_another_world_size_by_its_launcher_is_refused_at_once() {
    let port = free_port().to_string();
    let launch = |rank: &str, world: &str| {
        LaunchEnv::from_vars(vars(&[
            ("RANK", rank),
            ("WORLD_SIZE", world),
            ("LOCAL_RANK", rank),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", &port),
            (
                "UNICOMM_RENDEZVOUS_TOKEN",
                "a-job-secret-of-enough-length-0123456789",
            ),
        ]))
        .unwrap()
    };
    let (e0, e1) = (launch("0", "2"), launch("1", "3"));
    assert_eq!(e0.token, e1.token);
    let t = Instant::now();
    let (r0, r1) = std::thread::scope(|s| {
        let a = s.spawn(|| exchange_unique_id(&e0, || Ok([1; 128]), Duration::from_secs(10)));
        let b = s.spawn(|| exchange_unique_id(&e1, || Ok([1; 128]), Duration::from_secs(10)));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(matches!(r0, Err(Error::InvalidArgument { .. })), "{r0:?}");
    assert!(matches!(r1, Err(Error::Bootstrap { .. })), "{r1:?}");
}

/// Runs rank 0 of a 2-rank job on `port` in a thread while `attack` runs, then rank 1.
fn with_attacker(
    port: u16,
    attack: impl FnOnce(SocketAddr) + Send,
) -> (Result<[u8; 128]>, Result<[u8; 128]>) {
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    std::thread::scope(|s| {
        let r0 = s.spawn(move || {
            exchange_unique_id(&env(0, 2, port), || Ok([9; 128]), Duration::from_secs(10))
        });
        std::thread::sleep(Duration::from_millis(100));
        attack(addr);
        let r1 = exchange_unique_id(&env(1, 2, port), || Ok([0; 128]), Duration::from_secs(10));
        (r0.join().unwrap(), r1)
    })
}

#[test]
fn strangers_partial_and_malformed_hellos_are_dropped_and_the_job_still_joins() {
    let port = free_port();
    let (r0, r1) = with_attacker(port, |addr| {
        // An HTTP request.
        let mut s = TcpStream::connect(addr).unwrap();
        let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        // Half a hello, then silence (held open while the others come).
        let mut half = TcpStream::connect(addr).unwrap();
        let _ = half.write_all(&MAGIC[..]);
        // A well-formed hello from a process without the token: gets no id.
        let mut stray = TcpStream::connect(addr).unwrap();
        let mut e = env(1, 2, addr.port());
        e.token = b"not-the-job".to_vec();
        let got = {
            let by = Instant::now() + Duration::from_secs(3);
            join(&mut stray, &e, 1, (by, by))
        };
        assert!(got.is_err(), "a stranger got {got:?}");
        drop(half);
    });
    assert_eq!(r0.unwrap(), [9; 128]);
    assert_eq!(r1.unwrap(), [9; 128]);
}

#[test]
fn a_squatter_on_the_port_cannot_hand_out_a_forged_id() {
    let port = free_port();
    // The squatter accepts and answers like rank 0 would, but without the token.
    let squat = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let fake = std::thread::spawn(move || {
        for s in squat.incoming().take(10_000).flatten() {
            let mut s = s;
            let mut first = [0u8; FIRST_LEN];
            if s.read_exact(&mut first).is_err() {
                continue;
            }
            let mut msg = vec![IDS];
            msg.extend_from_slice(&[0u8; IDS_HEAD_LEN]);
            let _ = s.write_all(&msg);
            let _ = s.write_all(&[0u8; 128]);
        }
    });
    let r = exchange_unique_id(
        &env(1, 2, port),
        || Ok([0; 128]),
        Duration::from_millis(600),
    );
    match r {
        Err(Error::Timeout { what, .. }) => assert!(what.contains("token"), "{what}"),
        other => panic!("expected a timeout naming the token, got {other:?}"),
    }
    drop(fake);
}

#[test]
fn a_rank_joins_once_and_the_deadline_holds_against_a_dripping_client() {
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let t0 = Instant::now();
    let out = std::thread::scope(|s| {
        let r0 = s.spawn(move || {
            exchange_unique_id(
                &env(0, 3, port),
                || Ok([5; 128]),
                Duration::from_millis(1500),
            )
        });
        let r1 = s.spawn(move || {
            exchange_unique_id(&env(1, 3, port), || Ok([0; 128]), Duration::from_secs(3))
        });
        let dup = r1.join().unwrap();
        // Rank 1 again: refused (each rank joins once).
        let again = exchange_unique_id(&env(1, 3, port), || Ok([0; 128]), Duration::from_secs(3));
        // A client that drips one byte a second.
        let mut drip = TcpStream::connect(addr).unwrap();
        for b in &MAGIC[..3] {
            let _ = drip.write_all(&[*b]);
            std::thread::sleep(Duration::from_millis(400));
        }
        (r0.join().unwrap(), dup, again)
    });
    assert_eq!(out.1.unwrap(), [5; 128]);
    assert!(matches!(out.2, Err(Error::Bootstrap { .. })), "{:?}", out.2);
    match out.0 {
        Err(Error::Timeout { what, .. }) => assert!(what.contains("rank(s) 2 "), "{what}"),
        other => panic!("expected rank 2 missing, got {other:?}"),
    }
    assert!(
        t0.elapsed() < Duration::from_millis(3500),
        "{:?}",
        t0.elapsed()
    );
}

#[test]
fn rank_zero_listens_only_on_the_address_it_was_given() {
    let port = free_port();
    std::thread::scope(|s| {
        let r0 = s.spawn(move || {
            exchange_unique_id(
                &env(0, 2, port),
                || Ok([1; 128]),
                Duration::from_millis(800),
            )
        });
        std::thread::sleep(Duration::from_millis(200));
        // Another loopback address of this machine: nothing listens there.
        let other = TcpStream::connect_timeout(
            &format!("127.0.0.2:{port}").parse().unwrap(),
            Duration::from_millis(200),
        );
        assert!(other.is_err(), "rank 0 listens beyond MASTER_ADDR");
        let _ = r0.join();
    });
}

#[test]
fn the_hello_parser_never_panics() {
    // A bounded fuzz loop (xorshift): every length 0..=64 and random contents.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..200_000u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = (x % 65) as usize;
        let mut b: Vec<u8> = (0..len)
            .map(|k| (x >> (k % 8 * 8)) as u8 ^ k as u8)
            .collect();
        if i % 3 == 0 && len >= 8 {
            b[..8].copy_from_slice(MAGIC);
        }
        let _ = Hello::parse(&b);
    }
    let h = Hello {
        rank: 3,
        world: 8,
        nonce: [7; 16],
    };
    assert_eq!(Hello::parse(&h.bytes()).unwrap(), h);
}

#[test]
fn token_comes_from_the_launcher_or_the_variable() {
    let base = [
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "h"),
        ("MASTER_PORT", "1"),
    ];
    let none = LaunchEnv::from_vars(vars(&base)).unwrap();
    assert_eq!(none.token_source, "none");
    let mut kv = base.to_vec();
    kv.push(("TORCHELASTIC_RUN_ID", "run7"));
    // A job id is public: without a home directory for the key file it is no secret.
    let t = LaunchEnv::from_vars(vars(&kv)).unwrap();
    assert_eq!((t.token_source, t.secret_file.as_deref()), ("none", None));
    kv.push(("HOME", "/home/u"));
    let t = LaunchEnv::from_vars(vars(&kv)).unwrap();
    assert_eq!(t.token_source, "key file");
    assert_eq!(
        t.secret_file.as_deref(),
        Some(std::path::Path::new("/home/u/.unicomm/rendezvous.key"))
    );
    kv.push(("UNICOMM_RENDEZVOUS_TOKEN", "s3cret"));
    let u = LaunchEnv::from_vars(vars(&kv)).unwrap();
    assert_eq!(u.token_source, "UNICOMM_RENDEZVOUS_TOKEN");
    assert_eq!(u.secret_file, None, "the variable is the secret");
    assert_ne!(t.token, u.token);
    let mut huge = base.to_vec();
    huge[1] = ("WORLD_SIZE", "1099511627776");
    assert!(matches!(
        LaunchEnv::from_vars(vars(&huge)),
        Err(Error::Bootstrap { .. })
    ));
}

/// A fresh directory for one file-rendezvous test.
fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("unicomm-file-rdv-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Where a job of `token` keeps its file for the path `given` (what a stranger would have to
/// guess to plant a file the ranks read).
fn job_path(given: &std::path::Path, token: &[u8]) -> std::path::PathBuf {
    crate::file::job_file(&file_env(0, 1, given, token), given)
}

fn file_env(rank: usize, world: usize, path: &std::path::Path, token: &[u8]) -> LaunchEnv {
    LaunchEnv {
        file: Some(path.to_path_buf()),
        master: (String::new(), 0),
        token: token.to_vec(),
        ..env(rank, world, 0)
    }
}

#[test]
fn file_rendezvous_hands_every_rank_rank_zeros_id_and_cleans_up() {
    let d = scratch("all");
    let path = d.join("job.id");
    let ids: Vec<Result<[u8; 128]>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|r| {
                let path = &path;
                s.spawn(move || {
                    exchange_unique_id(
                        &file_env(r, 4, path, b"t"),
                        || Ok([7; 128]),
                        Duration::from_secs(10),
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for id in ids {
        assert_eq!(id.unwrap(), [7; 128]);
    }
    let left: Vec<_> = std::fs::read_dir(&d).unwrap().collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}

#[test]
fn file_rendezvous_ignores_another_jobs_file_and_waits_for_its_own() {
    let d = scratch("stale");
    let path = d.join("job.id");
    // A leftover of a job with another token at the same path.
    let stale = std::thread::spawn({
        let path = path.clone();
        move || {
            exchange_unique_id(
                &file_env(0, 2, &path, b"old-job"),
                || Ok([1; 128]),
                Duration::from_millis(300),
            )
        }
    });
    assert!(matches!(stale.join().unwrap(), Err(Error::Timeout { .. })));
    // Put the stale file back (rank 0 removed it on its timeout) and start rank 1 first.
    let other = std::thread::spawn({
        let path = path.clone();
        move || {
            exchange_unique_id(
                &file_env(0, 2, &path, b"old-job"),
                || Ok([1; 128]),
                Duration::from_millis(600),
            )
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    let r1 = std::thread::spawn({
        let path = path.clone();
        move || {
            exchange_unique_id(
                &file_env(1, 2, &path, b"new-job"),
                || Ok([0; 128]),
                Duration::from_secs(10),
            )
        }
    });
    let _ = other.join().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let r0 = exchange_unique_id(
        &file_env(0, 2, &path, b"new-job"),
        || Ok([2; 128]),
        Duration::from_secs(10),
    );
    assert_eq!(r0.unwrap(), [2; 128]);
    assert_eq!(
        r1.join().unwrap().unwrap(),
        [2; 128],
        "rank 1 took the other job's id"
    );
}

#[test]
fn file_rendezvous_deadline_names_the_missing_ranks_and_ignores_garbage() {
    let d = scratch("missing");
    let path = d.join("job.id");
    let start = Instant::now();
    let e = exchange_unique_id(
        &file_env(0, 3, &path, b"t"),
        || Ok([3; 128]),
        Duration::from_millis(400),
    )
    .expect_err("nobody took the id");
    assert!(start.elapsed() < Duration::from_secs(3));
    assert!(e.to_string().contains("rank(s) 1, 2"), "{e}");
    assert!(
        !job_path(&path, b"t").exists(),
        "the id file outlived the failed rendezvous"
    );
    // A rank that only ever finds garbage times out, saying what it found.
    std::fs::write(job_path(&path, b"t"), b"GET / HTTP/1.1").unwrap();
    let e = exchange_unique_id(
        &file_env(1, 2, &path, b"t"),
        || Ok([0; 128]),
        Duration::from_millis(300),
    )
    .expect_err("garbage is no id");
    assert!(e.to_string().contains("not unicomm's"), "{e}");
}

#[cfg(unix)]
#[test]
fn file_rendezvous_file_is_private_to_its_user() {
    use std::os::unix::fs::PermissionsExt;
    let d = scratch("mode");
    let path = d.join("job.id");
    let t = std::thread::spawn({
        let path = path.clone();
        move || {
            exchange_unique_id(
                &file_env(0, 2, &path, b"t"),
                || Ok([5; 128]),
                Duration::from_millis(800),
            )
        }
    });
    let path = job_path(&path, b"t");
    let t0 = Instant::now();
    while !path.exists() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let _ = t.join();
}

#[test]
fn the_file_variable_replaces_master_addr_and_port() {
    let e = LaunchEnv::from_vars(vars(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("UNICOMM_RENDEZVOUS_FILE", "/shared/job-17.id"),
    ]))
    .unwrap();
    assert_eq!(
        e.file.as_deref(),
        Some(std::path::Path::new("/shared/job-17.id"))
    );
    let bad = LaunchEnv::from_vars(vars(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("UNICOMM_RENDEZVOUS_FILE", "/"),
    ]));
    assert!(matches!(bad, Err(Error::InvalidArgument { .. })), "{bad:?}");
}

/// Values that cannot work are refused when the variables are read, naming them: port 0
/// (a port nobody else knows), an empty or `none` token (no secret), an empty rendezvous
/// file or a directory path (never "TCP instead").
#[test]
fn values_that_cannot_work_are_refused_at_parse_time() {
    let base = [
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "h"),
        ("MASTER_PORT", "29500"),
    ];
    let with = |k: &'static str, v: &'static str| {
        let mut kv = base.to_vec();
        kv.retain(|(n, _)| *n != k);
        kv.push((k, v));
        LaunchEnv::from_vars(vars(&kv))
    };
    assert!(LaunchEnv::from_vars(vars(&base)).is_ok());
    let e = with("MASTER_PORT", "0").unwrap_err().to_string();
    assert!(e.contains("MASTER_PORT") && e.contains("1..=65535"), "{e}");
    for t in ["", "none", "NONE"] {
        let e = with("UNICOMM_RENDEZVOUS_TOKEN", t).unwrap_err().to_string();
        assert!(e.contains("UNICOMM_RENDEZVOUS_TOKEN"), "{t:?}: {e}");
    }
    for f in ["", "/tmp/unicomm-rdv/", "/"] {
        let e = with("UNICOMM_RENDEZVOUS_FILE", f).unwrap_err().to_string();
        assert!(e.contains("UNICOMM_RENDEZVOUS_FILE"), "{f:?}: {e}");
    }
    // A huge bad value is quoted short.
    let long: &'static str = Box::leak("9".repeat(1 << 20).into_boxed_str());
    let e = with("MASTER_PORT", long).unwrap_err().to_string();
    assert!(e.len() < 300, "{} bytes", e.len());
}

/// A launcher variable that is set but not UTF-8 is an error naming it, not "unset".
#[cfg(unix)]
#[test]
fn a_variable_that_is_not_utf8_is_an_error_naming_it() {
    use std::os::unix::ffi::OsStrExt;
    // This test owns the variable (nothing else in the binary reads MV2_COMM_WORLD_SIZE).
    std::env::set_var(
        "MV2_COMM_WORLD_SIZE",
        std::ffi::OsStr::from_bytes(b"\xff\xfe"),
    );
    let r = LaunchEnv::detect();
    std::env::remove_var("MV2_COMM_WORLD_SIZE");
    let e = r.unwrap_err().to_string();
    assert!(
        e.contains("MV2_COMM_WORLD_SIZE") && e.contains("UTF-8"),
        "{e}"
    );
}

/// A FIFO planted at the rendezvous path (any user can plant one in a shared sticky
/// directory) blocked `open` forever: it is opened without blocking and refused as not a
/// regular file, and the rank times out at its deadline saying so.
#[cfg(unix)]
#[test]
fn file_rendezvous_refuses_a_fifo_within_its_deadline() {
    let d = scratch("fifo");
    let path = d.join("job.id");
    let planted = job_path(&path, b"t");
    let c = std::ffi::CString::new(planted.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo creates the node or fails.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.clone();
    std::thread::spawn(move || {
        let r = exchange_unique_id(
            &file_env(1, 2, &p, b"t"),
            || Ok([0; 128]),
            Duration::from_millis(300),
        );
        let _ = tx.send(r);
    });
    let r = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the rank returned within its deadline (open did not block)");
    let e = r.expect_err("a FIFO is no id").to_string();
    assert!(e.contains("not a regular file"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

/// A file at the path larger than a rendezvous file (here a sparse 512 MiB one, as an
/// attacker would plant) is read at most one byte past what a rendezvous file holds and
/// refused, not pulled into memory.
#[test]
fn file_rendezvous_reads_at_most_what_a_rendezvous_file_holds() {
    let d = scratch("huge");
    let path = d.join("job.id");
    let planted = job_path(&path, b"t");
    let f = std::fs::File::create(&planted).unwrap();
    f.set_len(512 << 20).unwrap();
    let e = exchange_unique_id(
        &file_env(1, 2, &path, b"t"),
        || Ok([0; 128]),
        Duration::from_millis(300),
    )
    .expect_err("no id in a giant file")
    .to_string();
    assert!(e.contains("longer than"), "{e}");
    let b = unicomm_core::env::read_bounded(&planted, 64);
    assert!(b.is_err());
    let _ = std::fs::remove_dir_all(&d);
}

/// A directory crowded with 40,000 other files: rank 0 finds every rank's acknowledgement
/// by its name, not only in its bounded listing (which reads at most world + 4,096 entries,
/// and missed acknowledgements that existed in 2 of 3 jobs).
#[test]
fn rank_0_finds_every_acknowledgement_in_a_crowded_directory() {
    let d = scratch("crowded");
    for i in 0..40_000 {
        std::fs::File::create(d.join(format!("another-job-{i}"))).unwrap();
    }
    let path = d.join("job.id");
    let secret = b"a crowded directory's secret....";
    let t = Instant::now();
    let ids: Vec<Result<[u8; 128]>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|r| {
                let p = path.clone();
                s.spawn(move || {
                    let env = LaunchEnv::shared_file(p, Place::new(r, 8, r), secret)?;
                    exchange_unique_id(&env, || Ok([9; 128]), Duration::from_secs(20))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for id in ids {
        assert_eq!(id.unwrap(), [9; 128]);
    }
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let _ = std::fs::remove_dir_all(&d);
}

/// In a sticky shared directory another user can make entries at any name it can predict:
/// the job's files carry a tag of its secret, so an entry at the path the job was given,
/// and at `<path>.ack.<rank>`, neither stops rank 0 nor holds a rank.
#[cfg(unix)]
#[test]
fn squatted_names_beside_the_given_path_do_not_stop_the_job() {
    let d = scratch("squatted");
    let path = d.join("by-id-29500");
    // Directories: nothing renames a file over one, root included (this test may run as
    // root, whom a sticky directory does not stop); another user's file or FIFO stops a
    // job of another user the same way.
    std::fs::create_dir(&path).unwrap();
    std::fs::create_dir(crate::file::ack_path(&path, 1)).unwrap();
    let fifo = crate::file::ack_path(&path, 2);
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo creates the node or fails.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let secret = b"a squatted directory's secret...";
    let ids: Vec<Result<[u8; 128]>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|r| {
                let p = path.clone();
                s.spawn(move || {
                    let env = LaunchEnv::shared_file(p, Place::new(r, 3, r), secret)?;
                    exchange_unique_id(&env, || Ok([8; 128]), Duration::from_secs(10))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for id in ids {
        assert_eq!(id.unwrap(), [8; 128]);
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// An engine's own bootstrap through `LaunchEnv::shared_file`: a stranger's id planted at
/// the path (the raw 129 bytes an engine would have written) and a FIFO at `<file>.tmp`
/// neither hand a rank the stranger's id nor hang rank 0's write: every rank gets rank 0's
/// id. A secret shorter than `MIN_SECRET`, or a rank outside the world, is refused.
#[cfg(unix)]
#[test]
fn an_engines_shared_file_ignores_a_planted_id_and_a_fifo_beside_it() {
    let d = scratch("shared");
    let path = d.join("engine.id");
    std::fs::write(&path, [3u8; 129]).unwrap();
    let tmp = d.join("engine.tmp");
    let c = std::ffi::CString::new(tmp.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo creates the node or fails.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let secret = b"an engine's secret of 32 bytes..";
    let ids: Vec<Result<[u8; 128]>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .rev()
            .map(|r| {
                let p = path.clone();
                s.spawn(move || {
                    let env = LaunchEnv::shared_file(p, Place::new(r, 3, r), secret)?;
                    exchange_unique_id(&env, || Ok([7; 128]), Duration::from_secs(10))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for id in ids {
        assert_eq!(id.unwrap(), [7; 128]);
    }
    assert!(LaunchEnv::shared_file(&path, Place::new(0, 2, 0), b"job-42").is_err());
    assert!(LaunchEnv::shared_file(&path, Place::new(2, 2, 0), secret).is_err());
    let _ = std::fs::remove_dir_all(&d);
}
