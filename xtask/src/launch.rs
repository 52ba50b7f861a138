//! `cargo xtask run --procs N`: a launcher for development, in the manner of torchrun. It
//! starts N processes of one program with torchrun's variables (`RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR=127.0.0.1`, a free `MASTER_PORT`, and a
//! fresh `UNICOMM_RENDEZVOUS_TOKEN` so that only its own processes can join), prefixes each
//! line they print with `[rank r]`, stops the others when one fails, and exits with the
//! first failure's code.
//!
//! `--share-gpu` puts every rank on GPU 0 (`LOCAL_RANK=0`) and gives each process a host id
//! of its own (`NCCL_HOSTID`): NCCL refuses two ranks of one host on one GPU ("Duplicate GPU
//! detected", 2.28.9), so it then takes them for ranks of different hosts and joins them
//! over its network transport, while unicomm's own exchanges (the copy-engine path's
//! abstract Unix sockets, the rendezvous) still find each other on this machine. A machine
//! with one GPU so runs one-rank-per-process programs (the fault scenarios, the copy-engine
//! path across processes) for correctness; not for speed (the ranks' contexts time-share the
//! GPU, NCCL's transport is sockets).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// How long the others get to end after a failure before they are killed.
const GRACE: Duration = Duration::from_secs(5);

fn prefix(rank: usize, out: impl Read + Send + 'static, err: bool) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            if err {
                eprintln!("[rank {rank}] {line}");
            } else {
                println!("[rank {rank}] {line}");
            }
        }
    })
}

/// A port nobody listens on now (the rendezvous binds it right after).
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")
        .context("finding a free port")?
        .local_addr()?
        .port())
}

fn token() -> Result<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("no randomness for the job token: {e}"))?;
    Ok(format!(
        "xtask-{}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    ))
}

/// Sends `sig` to a rank; SIGTERM first, as torchrun does, so the program can end
/// cleanly. (The ranks stay in the launcher's process group, so Ctrl-C reaches them too.)
fn signal(c: &mut Child, sig: &str) {
    #[cfg(unix)]
    {
        let _ = Command::new("kill")
            .args([sig, &c.id().to_string()])
            .stderr(Stdio::null())
            .status();
    }
    #[cfg(not(unix))]
    {
        let _ = sig;
        let _ = c.kill();
    }
}

fn code(st: ExitStatus) -> i32 {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = st.signal() {
            return 128 + sig;
        }
    }
    st.code().unwrap_or(1)
}

/// Runs `program args` as `n` ranks on this machine (all on GPU 0 with `share_gpu`, see the
/// module's text); `Ok(())` when every rank succeeded, else an error carrying the first
/// failure's exit code.
/// How a program is launched: `n` ranks, stopped after `timeout`; with `share_gpu` all on
/// GPU 0 (see the module's text); the ranks in `expect_lost` may die (a fault test kills
/// them) without stopping the others; `env` added to every rank's.
pub struct Job<'a> {
    pub n: usize,
    pub timeout: Duration,
    pub share_gpu: bool,
    pub expect_lost: &'a [usize],
    pub env: &'a [(&'a str, &'a str)],
}

pub fn run(program: &Path, args: &[String], job: &Job<'_>) -> Result<()> {
    let Job {
        n,
        timeout,
        share_gpu,
        expect_lost,
        env,
    } = *job;
    if n == 0 || n > 1024 {
        bail!("--procs {n}: 1..=1024 processes");
    }
    let port = free_port()?;
    let token = token()?;
    eprintln!(
        "==> launching {n} processes of {} (MASTER_ADDR=127.0.0.1 MASTER_PORT={port})",
        program.display()
    );
    let mut kids: Vec<(usize, Child, Vec<std::thread::JoinHandle<()>>)> = Vec::new();
    for r in 0..n {
        // With a shared GPU every rank is on GPU 0, with a host id of its own for NCCL.
        let local_rank = if share_gpu { 0 } else { r };
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env("RANK", r.to_string())
            .env("LOCAL_RANK", local_rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("UNICOMM_RENDEZVOUS_TOKEN", &token)
            .envs(env.iter().copied());
        if share_gpu {
            cmd.env("NCCL_HOSTID", format!("{token}-rank-{r}"));
        }
        let mut c = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting rank {r}: {}", program.display()))?;
        let mut readers = Vec::new();
        if let Some(o) = c.stdout.take() {
            readers.push(prefix(r, o, false));
        }
        if let Some(e) = c.stderr.take() {
            readers.push(prefix(r, e, true));
        }
        kids.push((r, c, readers));
    }
    let start = Instant::now();
    let mut first_failure: Option<(usize, i32)> = None;
    let mut stopping_since: Option<Instant> = None;
    let mut running = n;
    let mut lost = std::collections::BTreeSet::new();
    while running > 0 {
        running = 0;
        for (r, c, _) in kids.iter_mut() {
            match c.try_wait()? {
                Some(st) => {
                    if !st.success() && expect_lost.contains(r) {
                        if lost.insert(*r) {
                            eprintln!("==> rank {r} lost ({st}), as expected; the others go on");
                        }
                    } else if !st.success() && first_failure.is_none() {
                        eprintln!("==> rank {r} failed ({st}); stopping the others");
                        first_failure = Some((*r, code(st)));
                    }
                }
                None => running += 1,
            }
        }
        if running == 0 {
            break;
        }
        if first_failure.is_some() || start.elapsed() > timeout {
            if first_failure.is_none() {
                eprintln!("==> still running after {timeout:?}; stopping every rank");
                first_failure = Some((usize::MAX, 124));
            }
            let since = *stopping_since.get_or_insert_with(|| {
                for (_, c, _) in kids.iter_mut() {
                    if matches!(c.try_wait(), Ok(None)) {
                        signal(c, "-TERM");
                    }
                }
                Instant::now()
            });
            if since.elapsed() > GRACE {
                for (_, c, _) in kids.iter_mut() {
                    signal(c, "-KILL");
                    let _ = c.kill();
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The ranks' last lines: their pipes close when they exit (a process they started
    // and left behind may hold one open: not waited for beyond 2 s).
    let until = Instant::now() + Duration::from_secs(2);
    for h in kids.into_iter().flat_map(|(_, _, readers)| readers) {
        while !h.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        if h.is_finished() {
            let _ = h.join();
        }
    }
    match first_failure {
        None if lost.is_empty() => {
            eprintln!("==> all {n} ranks succeeded");
            Ok(())
        }
        None => {
            eprintln!(
                "==> the {} other ranks succeeded (lost, as expected: {lost:?})",
                n - lost.len()
            );
            Ok(())
        }
        Some((r, code)) => Err(Failed { rank: r, code }.into()),
    }
}

/// A rank failed: the launcher exits with its code.
#[derive(Debug)]
pub struct Failed {
    pub rank: usize,
    pub code: i32,
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.rank == usize::MAX {
            write!(f, "the ranks did not finish in time (exit {})", self.code)
        } else {
            write!(f, "rank {} failed with exit code {}", self.rank, self.code)
        }
    }
}

impl std::error::Error for Failed {}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["-c".into(), script.into()]
    }

    fn job(n: usize, timeout: Duration, share_gpu: bool, expect_lost: &[usize]) -> Job<'_> {
        Job {
            n,
            timeout,
            share_gpu,
            expect_lost,
            env: &[],
        }
    }

    #[test]
    fn a_rank_expected_to_be_lost_does_not_stop_the_others() {
        // Rank 1 kills itself; the others finish their work after it and succeed.
        let t = Instant::now();
        run(
            Path::new("sh"),
            &sh(r#"if [ "$RANK" = 1 ]; then kill -KILL $$; fi; sleep 1; exit 0"#),
            &job(3, Duration::from_secs(60), false, &[1]),
        )
        .unwrap();
        assert!(t.elapsed() >= Duration::from_secs(1));
        // Another rank's failure still stops the job.
        let e = run(
            Path::new("sh"),
            &sh(r#"if [ "$RANK" = 2 ]; then exit 5; fi; sleep 60"#),
            &job(3, Duration::from_secs(60), false, &[1]),
        )
        .unwrap_err();
        assert_eq!(e.downcast_ref::<Failed>().map(|f| f.code), Some(5));
    }

    #[test]
    fn every_rank_gets_its_variables_and_success_is_success() {
        let script = r#"[ "$WORLD_SIZE" = 3 ] && [ "$LOCAL_RANK" = "$RANK" ] && [ -n "$MASTER_PORT" ] && [ -n "$UNICOMM_RENDEZVOUS_TOKEN" ]"#;
        run(
            Path::new("sh"),
            &sh(script),
            &job(3, Duration::from_secs(30), false, &[]),
        )
        .unwrap();
    }

    #[test]
    fn shared_gpu_ranks_are_on_gpu_0_each_with_a_host_id_of_its_own() {
        // Each rank writes its host id to a file named by its rank; the ids must differ.
        let dir = std::env::temp_dir().join(format!("xtask-share-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = format!(
            r#"[ "$LOCAL_RANK" = 0 ] && [ "$WORLD_SIZE" = 3 ] && [ -n "$NCCL_HOSTID" ] && printf %s "$NCCL_HOSTID" > {}/$RANK"#,
            dir.display()
        );
        run(
            Path::new("sh"),
            &sh(&script),
            &job(3, Duration::from_secs(30), true, &[]),
        )
        .unwrap();
        let ids: std::collections::BTreeSet<String> = (0..3)
            .map(|r| std::fs::read_to_string(dir.join(r.to_string())).unwrap())
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(ids.len(), 3, "{ids:?}");
    }

    #[test]
    fn the_first_failure_stops_the_others_and_gives_its_code() {
        let t = Instant::now();
        let e = run(
            Path::new("sh"),
            &sh(r#"if [ "$RANK" = 1 ]; then sleep 0.2; exit 3; fi; sleep 60"#),
            &job(3, Duration::from_secs(120), false, &[]),
        )
        .unwrap_err();
        let f = e.downcast_ref::<Failed>().expect("a rank's failure");
        assert_eq!((f.rank, f.code), (1, 3));
        // The sleeping ranks were stopped (SIGTERM), not waited for.
        assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    }

    #[test]
    fn ranks_past_the_deadline_are_stopped() {
        let e = run(
            Path::new("sh"),
            &sh("sleep 60"),
            &job(2, Duration::from_secs(1), false, &[]),
        )
        .unwrap_err();
        assert_eq!(e.downcast_ref::<Failed>().map(|f| f.code), Some(124));
    }
}
