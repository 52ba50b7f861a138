//! The mock across processes (Linux): this test binary starts copies of itself, one rank per
//! process, with torchrun's variables, as a launcher would. Each copy runs the ignored test
//! `rank`, which reads the scenario from `UNICOMM_TEST_SCENARIO`.
#![cfg(target_os = "linux")]

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use unicomm_bootstrap::LaunchEnv;
use unicomm_conformance::{process_subset, run_case_on_rank, run_groups_on_rank_refusing};
use unicomm_core::{Comm, DeviceStream, Error, ReduceOp};
use unicomm_mock::{join, MockComm, MockConfig};

const SCENARIO: &str = "UNICOMM_TEST_SCENARIO";

struct Rank {
    rank: usize,
    code: Option<i32>,
    out: String,
}

/// Starts `n` ranks of `scenario` and waits for them (killing what is left after 120 s).
fn launch(n: usize, scenario: &str, env: &[(&str, &str)]) -> Vec<Rank> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let token = format!("procs-test-{}-{port}", std::process::id());
    let mut kids: Vec<(usize, Child)> = (0..n)
        .map(|r| {
            let c = Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "rank",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(SCENARIO, scenario)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("UNICOMM_RENDEZVOUS_TOKEN", &token)
                .envs(env.iter().copied())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start a rank");
            (r, c)
        })
        .collect();
    let start = Instant::now();
    let mut done: Vec<Rank> = Vec::new();
    while !kids.is_empty() {
        let mut i = 0;
        while i < kids.len() {
            if let Some(st) = kids[i].1.try_wait().unwrap() {
                let (rank, mut c) = kids.swap_remove(i);
                let mut out = String::new();
                c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
                c.stderr.take().unwrap().read_to_string(&mut out).unwrap();
                done.push(Rank {
                    rank,
                    code: st.code(),
                    out,
                });
            } else {
                i += 1;
            }
        }
        if start.elapsed() > Duration::from_secs(120) {
            for (_, c) in &mut kids {
                let _ = c.kill();
            }
            panic!("ranks still running after 120 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    done.sort_by_key(|r| r.rank);
    done
}

fn all_passed(n: usize, scenario: &str, env: &[(&str, &str)]) {
    let ranks = launch(n, scenario, env);
    // Every rank's output where one failed: the first to fail is often not the one named
    // (its peers end with its abort).
    let all = || {
        ranks
            .iter()
            .map(|r| format!("--- rank {} exited {:?}:\n{}", r.rank, r.code, r.out))
            .collect::<Vec<_>>()
            .join("\n")
    };
    for r in &ranks {
        assert!(
            r.code == Some(0) && r.out.contains("RANK PASSED"),
            "rank {} of {n} ({scenario}) failed; every rank's output:\n{}",
            r.rank,
            all()
        );
    }
}

fn joined() -> Comm<MockComm> {
    let env = LaunchEnv::detect().expect("launcher variables");
    let config = MockConfig::from_env().expect("mock config");
    Comm::from_backend(join(&env, config, Duration::from_secs(60)).expect("join"))
}

/// One rank joined by a unique id its rank 0 made and wrote to a file (as candle's example
/// shares NCCL's id), not by the launcher's rendezvous: an all-reduce, then finalize.
fn by_id() {
    let var = |k: &str| std::env::var(k).unwrap();
    let (r, w): (usize, usize) = (
        var("RANK").parse().unwrap(),
        var("WORLD_SIZE").parse().unwrap(),
    );
    let file = std::path::PathBuf::from(var("UNICOMM_TEST_ID_FILE"));
    let id = if r == 0 {
        let id = unicomm_mock::unique_id().unwrap();
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, id).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        id
    } else {
        let start = Instant::now();
        loop {
            if let Ok(b) = std::fs::read(&file) {
                break <[u8; 128]>::try_from(b.as_slice()).unwrap();
            }
            assert!(start.elapsed() < Duration::from_secs(30), "no id");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let config = MockConfig {
        timeout: Duration::from_secs(30),
        ..MockConfig::default()
    };
    let c = Comm::from_backend(unicomm_mock::init_rank(&id, r, w, config).unwrap());
    let st = c.create_stream().unwrap();
    let mut b = c.alloc::<f32>(4).unwrap();
    b.copy_from_host(&[(r + 1) as f32; 4], &st).unwrap();
    c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
    let want = (w * (w + 1) / 2) as f32;
    assert_eq!(b.copy_to_host(&st).unwrap(), vec![want; 4]);
    c.finalize().unwrap();
    println!("rank {r}: RANK PASSED");
}

/// One rank of a scenario (started by the tests below, never on its own).
#[test]
#[ignore = "one rank of the multi-process tests; they start it"]
fn rank() {
    let scenario = std::env::var(SCENARIO).expect("started by a multi-process test");
    let c = joined();
    let (r, w) = (c.rank(), c.world_size());
    match scenario.as_str() {
        "conformance" => {
            let cases = process_subset(w);
            for case in &cases {
                // What NCCL refuses by design, refused by the mock standing for it.
                let refused = unicomm_conformance::refused_by_design(case, true);
                if let Err(e) = run_case_on_rank(&c, *case, refused) {
                    panic!("rank {r}: {e}");
                }
            }
            c.finalize().unwrap();
            println!("rank {r}: {} cases; RANK PASSED", cases.len());
        }
        "by_id" => by_id(),
        "one_sided" => {
            let seen = unicomm_conformance::one_sided_put_signal(std::slice::from_ref(&c));
            assert_eq!(seen.unwrap(), vec![true], "rank {r}");
            // A graph's signals cross the processes marked as a graph's.
            let seen = unicomm_conformance::one_sided_in_graph(std::slice::from_ref(&c), 50);
            assert_eq!(seen.unwrap(), vec![true], "rank {r}");
            c.finalize().unwrap();
            println!("rank {r}: one-sided ring, eager and in a graph; RANK PASSED");
        }
        "symmetric" => {
            // Every rank's part mapped in every process (memfd segments): each algorithm
            // exact, eager and replayed.
            let one = std::slice::from_ref(&c);
            let seen = unicomm_conformance::symmetric_all_reduce::<f32, _>(one, 33, 50);
            assert_eq!(seen.unwrap(), vec![true], "rank {r}");
            let seen = unicomm_conformance::symmetric_all_reduce::<half::bf16, _>(one, 16, 5);
            assert_eq!(seen.unwrap(), vec![true], "rank {r}");
            let seen = unicomm_conformance::symmetric_rms_norm::<f32, _>(one, 24, 2, 0.0, 10);
            assert_eq!(seen.unwrap(), vec![true], "rank {r}");
            let seen = unicomm_conformance::symmetric_all_to_all_v(one, 5, 10);
            assert_eq!(seen.unwrap(), vec![true], "rank {r}");
            let cfg = unicomm_core::ExpertConfig {
                experts: 2 * c.world_size(),
                max_tokens: 16,
                hidden: 5,
                top_k: 3,
            };
            let seen = unicomm_conformance::expert_dispatch_combine(one, cfg, 6, 6);
            assert_eq!(seen.unwrap(), vec![true], "rank {r}");
            // High throughput: packed rows, some rounds past max_recv refused on both.
            let seen = unicomm_conformance::expert_dispatch_combine_packed(one, cfg, 28, 6, 6);
            assert_eq!(seen.unwrap(), vec![true], "rank {r}");
            // The processes as the survivors of a layout one rank larger, its rank 1 masked.
            let w = c.world_size();
            let mask = unicomm_core::RankMask::new(w + 1, &[1]).unwrap();
            let cfg = unicomm_core::ExpertConfig {
                experts: 2 * (w + 1),
                ..cfg
            };
            let seen = unicomm_conformance::expert_dispatch_combine_masked(one, cfg, mask, 6, 6);
            assert_eq!(seen.unwrap(), vec![true], "rank {r}");
            c.finalize().unwrap();
            println!("rank {r}: symmetric kernels; RANK PASSED");
        }
        "symmetric-disagree" => {
            // Every disagreement of every algorithm, 100 attempts each, the differing rank
            // rotating: Mismatch on every rank, never Ok; count-0 Lamport calls exact.
            for algorithm in unicomm_conformance::ALGORITHMS {
                for d in unicomm_conformance::Disagreement::all(algorithm) {
                    let seen = unicomm_conformance::symmetric_disagreement(&c, d, algorithm, 100);
                    let seen = seen.unwrap_or_else(|e| panic!("rank {r}: {d:?}: {e}"));
                    assert!(seen.is_some(), "rank {r}: {d:?}");
                }
            }
            let zero = unicomm_conformance::lamport_count_zero_sequence(&c, 100);
            assert!(zero.unwrap(), "rank {r}");
            c.finalize().unwrap();
            println!("rank {r}: symmetric disagreements; RANK PASSED");
        }
        "groups" => {
            let refused =
                |check: &str| unicomm_conformance::group_check_refused_by_design(check, w, true);
            if let Err(e) = run_groups_on_rank_refusing(&c, &refused) {
                panic!("rank {r}: {e}");
            }
            c.finalize().unwrap();
            println!("rank {r}: RANK PASSED");
        }
        "mismatch" => {
            // Ranks disagree on the count: every rank gets Mismatch, none hangs.
            let st = c.create_stream().unwrap();
            let n = 4 + r;
            let mut b = c.alloc::<f32>(n).unwrap();
            c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
            let e = st.synchronize().unwrap_err();
            assert!(matches!(e, Error::Mismatch { what: "count", .. }), "{e}");
            println!("rank {r}: {e}; RANK PASSED");
        }
        "kill" => {
            // The last rank kills itself in the middle of a stream of collectives; the
            // others must fail long before their 60 s deadline.
            let st = c.create_stream().unwrap();
            let mut b = c.alloc::<f32>(1 << 18).unwrap();
            let t = Instant::now();
            for i in 0..1_000_000u64 {
                if r == w - 1 && i == 20 {
                    // SAFETY: kill(2) on this process; nothing after it runs.
                    unsafe { libc::kill(std::process::id() as i32, libc::SIGKILL) };
                }
                let res = c
                    .all_reduce_in_place(&mut b, ReduceOp::Sum, &st)
                    .and_then(|_| st.synchronize());
                if let Err(e) = res {
                    let waited = t.elapsed();
                    assert!(matches!(e, Error::Aborted { .. }), "{e}");
                    assert!(waited < Duration::from_secs(10), "{waited:?}");
                    println!("rank {r}: after {i} collectives: {e}; RANK PASSED");
                    return;
                }
            }
            panic!("rank {r}: the killed peer was never noticed");
        }
        "symmetric-kill" => {
            // The last rank kills itself among the replays of a graph of symmetric
            // all-reduces: the others' kernels, waiting on its pad, end by the deadline.
            let st = c.create_stream().unwrap();
            let x = c.alloc_symmetric::<f32>(64).unwrap();
            let out = c.alloc::<f32>(64).unwrap();
            let how = unicomm_core::symmetric::SymmetricOptions::new(
                ReduceOp::Sum,
                unicomm_core::symmetric::SymmetricAlgorithm::OneShot,
            );
            let g = unicomm_core::graph::Graph::capture(&st, |g| {
                g.all_reduce_symmetric(&c, &x, 64, &out, how)
            })
            .unwrap();
            let t = Instant::now();
            for i in 0..100_000u64 {
                if r == w - 1 && i == 50 {
                    // SAFETY: kill(2) on this process; nothing after it runs.
                    unsafe { libc::kill(std::process::id() as i32, libc::SIGKILL) };
                }
                if let Err(e) = g.launch(&st).and_then(|_| st.synchronize()) {
                    let waited = t.elapsed();
                    assert!(
                        matches!(e, Error::Aborted { .. } | Error::Timeout { .. }),
                        "{e}"
                    );
                    assert!(waited < Duration::from_secs(20), "{waited:?}");
                    println!("rank {r}: after {i} replays: {e}; RANK PASSED");
                    return;
                }
            }
            panic!("rank {r}: the killed peer was never noticed");
        }
        "skip" => {
            // Rank 1 skips the second all-reduce; rank 0 times out at its deadline (2 s).
            let st = c.create_stream().unwrap();
            let mut b = c.alloc::<f32>(16).unwrap();
            c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
            st.synchronize().unwrap();
            if r == 1 {
                std::thread::sleep(Duration::from_secs(4));
                let e = st.synchronize().and_then(|_| c.barrier(&st)).unwrap_err();
                println!("rank {r}: skipped; then {e}; RANK PASSED");
                return;
            }
            let t = Instant::now();
            c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
            let e = st.synchronize().unwrap_err();
            let waited = t.elapsed();
            assert!(matches!(e, Error::Timeout { .. }), "{e}");
            assert!(
                waited >= Duration::from_secs(2) && waited < Duration::from_secs(4),
                "{waited:?}"
            );
            println!("rank {r}: {e} after {waited:?}; RANK PASSED");
        }
        "shrink" => {
            // The victim kills itself mid-stream; the survivors see the failure, shrink the
            // world without it (re-formed over the job's rendezvous, even when the victim
            // was rank 0, whose process served the old world) and go on, exactly.
            let victim: usize = std::env::var("UNICOMM_TEST_VICTIM")
                .unwrap()
                .parse()
                .unwrap();
            let st = c.create_stream().unwrap();
            let mut b = c.alloc::<f32>(1024).unwrap();
            let failed = (0..1_000_000u64).find_map(|i| {
                if r == victim && i == 10 {
                    // SAFETY: kill(2) on this process; nothing after it runs.
                    unsafe { libc::kill(std::process::id() as i32, libc::SIGKILL) };
                }
                c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)
                    .and_then(|_| st.synchronize())
                    .err()
            });
            let e = failed.expect("the lost rank was noticed");
            let small = c
                .shrink(&[victim], unicomm_core::ShrinkMode::Default)
                .unwrap();
            let (nr, nw) = (small.rank(), small.world_size());
            assert_eq!(nw, w - 1);
            assert_eq!(nr, if r > victim { r - 1 } else { r });
            let st = small.create_stream().unwrap();
            let mut b = small.alloc::<f32>(1024).unwrap();
            b.copy_from_host(&[(r + 1) as f32; 1024], &st).unwrap();
            small
                .all_reduce_in_place(&mut b, ReduceOp::Sum, &st)
                .unwrap();
            let want = (1..=w).filter(|&x| x != victim + 1).sum::<usize>() as f32;
            assert!(b.copy_to_host(&st).unwrap().iter().all(|&x| x == want));
            small.finalize().unwrap();
            println!("rank {r} (now {nr} of {nw}): {e}; RANK PASSED");
        }
        other => panic!("unknown scenario {other}"),
    }
}

/// Puts' bytes travel in their messages through rank 0's hub (parts of at most 4 MiB):
/// the ring of the conformance case, across processes.
#[test]
fn symmetric_kernels_across_three_processes() {
    all_passed(3, "symmetric", &[]);
}

/// Ranks in processes whose symmetric calls disagree get `Mismatch` on every rank (the
/// signature compared in the pads and in Lamport's headers, across mappings of memfd
/// segments); Lamport calls of count 0 keep the rounds in step.
#[test]
fn symmetric_disagreements_across_two_and_three_processes() {
    all_passed(2, "symmetric-disagree", &[]);
    all_passed(3, "symmetric-disagree", &[]);
}

#[test]
fn one_sided_puts_and_signals_across_three_processes() {
    all_passed(3, "one_sided", &[("UNICOMM_MOCK_TARGET", "nccl-2.32.3")]);
}

/// The conformance subset, one rank a process, at worlds 2-4.
#[rstest::rstest]
fn conformance_subset_across_processes(#[values(2, 3, 4)] procs: usize) {
    all_passed(procs, "conformance", &[]);
}

/// Process groups and the variable-size exchanges, one rank a process, at worlds 2-4.
#[rstest::rstest]
fn process_groups_and_variable_exchanges_across_processes(#[values(2, 3, 4)] procs: usize) {
    all_passed(procs, "groups", &[]);
}

#[test]
fn ranks_that_disagree_get_mismatch_across_processes() {
    all_passed(3, "mismatch", &[]);
}

#[test]
fn a_killed_process_fails_its_peers_at_once() {
    survivors_passed(&launch(3, "kill", &[]));
}

/// The last rank died by SIGKILL, every other passed.
fn survivors_passed(ranks: &[Rank]) {
    let (killed, rest) = ranks.split_last().expect("ranks were launched");
    assert_eq!(
        killed.code, None,
        "rank {} was to die by SIGKILL:\n{}",
        killed.rank, killed.out
    );
    for r in rest {
        assert!(
            r.code == Some(0) && r.out.contains("RANK PASSED"),
            "rank {}: {:?}\n{}",
            r.rank,
            r.code,
            r.out
        );
    }
}

/// A rank SIGKILLed among the replays of a graph of symmetric all-reduces: the survivors'
/// kernels, waiting on its signal pad, end by the deadline (3 s) with an error.
#[test]
fn a_killed_process_ends_its_peers_symmetric_kernels_by_the_deadline() {
    let fast = [("UNICOMM_MOCK_TIMEOUT_MS", "3000")];
    survivors_passed(&launch(3, "symmetric-kill", &fast));
}

#[test]
fn a_rank_that_skips_a_collective_times_out_its_peer() {
    all_passed(2, "skip", &[("UNICOMM_MOCK_TIMEOUT_MS", "2000")]);
}

/// One rank SIGKILLed mid-stream: the three survivors shrink and go on with exact data,
/// whether the lost rank was the last or rank 0 (whose process served the old world).
#[test]
fn survivors_of_a_killed_rank_shrink_and_go_on() {
    for victim in ["3", "0"] {
        let ranks = launch(4, "shrink", &[("UNICOMM_TEST_VICTIM", victim)]);
        let v: usize = victim.parse().unwrap();
        for r in &ranks {
            if r.rank == v {
                assert_eq!(
                    r.code, None,
                    "the victim was killed by its signal:\n{}",
                    r.out
                );
                continue;
            }
            assert!(
                r.code == Some(0) && r.out.contains("RANK PASSED"),
                "rank {} (victim {v}) exited {:?}:\n{}",
                r.rank,
                r.code,
                r.out
            );
        }
    }
}

/// Processes that share the mock's unique id through a file of their own (no launcher
/// rendezvous) form one world: rank 0's process serves it.
#[test]
fn processes_join_by_a_unique_id_shared_through_a_file() {
    let dir = std::env::temp_dir().join(format!("unicomm-id-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("id");
    let _ = std::fs::remove_file(&file);
    all_passed(
        3,
        "by_id",
        &[("UNICOMM_TEST_ID_FILE", file.to_str().unwrap())],
    );
    let _ = std::fs::remove_dir_all(&dir);
}
