//! The processes of a run: rank 0 serving (measured from inside), and the joining ranks as
//! threads. Each says "ready", waits for the release instant on stdin, runs, and prints one
//! JSON line.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use unicomm::bootstrap::{exchange_unique_id, LaunchEnv};

pub(crate) fn child(role: &[String], port: u16, token: &str, world: usize, t: u64) -> Result<()> {
    let opt = |k: &str| {
        role.iter()
            .find_map(|r| r.strip_prefix(&format!("{k}=")))
            .map(str::to_owned)
    };
    if let Some(cpu) = opt("cpu") {
        pin(cpu.parse()?)?;
    }
    let timeout = Duration::from_secs(t);
    match role.first().map(String::as_str) {
        Some("serve") => serve(port, token, world, timeout),
        Some("join") => {
            let first: usize = role.get(1).context("join FIRST")?.parse()?;
            let last: usize = role.get(2).context("join LAST")?.parse()?;
            let spread: u64 = opt("spread").map_or(Ok(0), |s| s.parse())?;
            let busy = role.iter().any(|r| r == "busy");
            join(first..last, (port, token, world), spread, busy, timeout)
        }
        _ => bail!("unknown role {role:?}"),
    }
}

fn pin(cpu: usize) -> Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)?;
    Ok(())
}

fn env(rank: usize, (port, token, world): (u16, &str, usize)) -> Result<LaunchEnv> {
    // `--forward L`: hosts of L ranks, placed by block.
    let per_host: usize = std::env::var("UNICOMM_SCALE_FORWARD").map_or(Ok(0), |v| v.parse())?;
    let vars = [
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", world.to_string()),
        ("LOCAL_RANK", (rank % per_host.max(1)).to_string()),
        ("LOCAL_WORLD_SIZE", per_host.max(1).to_string()),
        (
            "UNICOMM_RENDEZVOUS_FORWARD",
            u8::from(per_host > 0).to_string(),
        ),
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", port.to_string()),
        ("UNICOMM_RENDEZVOUS_TOKEN", token.into()),
    ];
    Ok(LaunchEnv::from_vars(|k| {
        vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    })?)
}

/// The id rank 0 hands out: derived from the token, so every rank can check what it got.
fn the_id(token: &str) -> [u8; 128] {
    let mut id = [0u8; 128];
    for (i, b) in id.iter_mut().enumerate() {
        *b = token.as_bytes()[i % token.len().max(1)] ^ i as u8;
    }
    id
}

/// Says ready, then reads the release instant (ns since the epoch) and returns it as an
/// `Instant` of this process.
fn ready_then_release(timeout: Duration) -> Result<Instant> {
    println!("ready");
    std::io::stdout().flush()?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut l = String::new();
        let _ = std::io::stdin().lock().read_line(&mut l);
        let _ = tx.send(l);
    });
    let l = rx.recv_timeout(timeout).context("no release instant")?;
    let at: u128 = l.trim().parse().context("release instant")?;
    let wait = at.saturating_sub(super::now_ns());
    Ok(Instant::now() + Duration::from_nanos(wait as u64))
}

fn sleep_until(t: Instant) {
    let left = t.saturating_duration_since(Instant::now());
    if !left.is_zero() {
        std::thread::sleep(left);
    }
}

/// The lines the libraries log, kept for the report.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut v) = self.0.lock() {
            v.extend_from_slice(b);
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Rank 0's peak threads and open files and its memory while it serves, sampled every
/// 2 ms by a thread of its own (left out of the counts and the CPU time).
struct Monitor {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<(usize, usize, u64, Duration)>,
}

fn status_field(s: &str, name: &str) -> u64 {
    s.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl Monitor {
    fn start() -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            let (mut threads, mut fds, mut rss) = (0, 0, 0);
            while !s.load(Ordering::Acquire) {
                let st = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
                threads = threads.max(status_field(&st, "Threads:") as usize);
                rss = rss.max(status_field(&st, "VmRSS:"));
                let n = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
                fds = fds.max(n);
                std::thread::sleep(Duration::from_millis(10));
            }
            let own = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
                .map_or(Duration::ZERO, Duration::from);
            (threads, fds, rss, own)
        });
        Monitor { stop, handle }
    }
}

fn process_cpu() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_SELF).map_or(Duration::ZERO, |u| {
        let t = |v: nix::sys::time::TimeVal| {
            Duration::new(v.tv_sec() as u64, v.tv_usec() as u32 * 1000)
        };
        t(u.user_time()) + t(u.system_time())
    })
}

fn serve(port: u16, token: &str, world: usize, timeout: Duration) -> Result<()> {
    let lines = Lines::default();
    let w = lines.clone();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || w.clone())
        .init();
    let e = env(0, (port, token, world))?;
    let release = ready_then_release(timeout)?;
    let rss0 = status_field(
        &std::fs::read_to_string("/proc/self/status").unwrap_or_default(),
        "VmRSS:",
    );
    let mon = Monitor::start();
    sleep_until(release);
    let cpu0 = process_cpu();
    let r = exchange_unique_id(&e, || Ok(the_id(token)), timeout);
    let done = release.elapsed();
    let cpu = process_cpu().saturating_sub(cpu0);
    mon.stop.store(true, Ordering::Release);
    let (threads, fds, rss, mon_cpu) = mon.handle.join().unwrap_or_default();
    let text = String::from_utf8_lossy(&lines.0.lock().map(|v| v.clone()).unwrap_or_default())
        .into_owned();
    let all: Vec<&str> = text.lines().collect();
    let unserved = all
        .iter()
        .filter(|l| l.contains("handshakes already under way"))
        .count() as u64
        + all
            .iter()
            .filter_map(|l| l.split("closed_unserved=").nth(1))
            .filter_map(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .sum::<u64>();
    let out = serde_json::json!({
        "last_done_us": done.as_secs_f64() * 1e6,
        "ok": r.is_ok(),
        "errors": r.err().map(|e| vec![e.to_string()]).unwrap_or_default(),
        // The monitor thread is the harness's; the stdin reader has ended.
        "peak_threads": threads.saturating_sub(1),
        "peak_fds": fds,
        "rss_growth_kib": rss.saturating_sub(rss0),
        "cpu_ms": cpu.saturating_sub(mon_cpu).as_secs_f64() * 1e3,
        "log_lines": all.len(),
        "warn_lines": all.iter().filter(|l| l.contains(" WARN ")).count(),
        "closed_unserved": unserved,
        "first_lines": all.iter().take(3).collect::<Vec<_>>(),
    });
    println!("{out}");
    Ok(())
}

type Gate = Arc<(Mutex<Option<Instant>>, Condvar)>;

/// One rank: released by the gate, started at a uniform time within the spread, joined:
/// how long its join took, how long since the release it was done, and whether it received
/// the id (or why it failed).
fn one_rank(
    rank: usize,
    e: &unicomm::bootstrap::LaunchEnv,
    (gate, spread_ms): (&Gate, u64),
    want: [u8; 128],
    timeout: Duration,
) -> (Duration, Duration, std::result::Result<bool, String>) {
    let release = {
        let (m, cv) = &**gate;
        let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
        while g.is_none() {
            g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        g.unwrap_or_else(Instant::now)
    };
    // A uniform start within the spread (xorshift seeded by the rank).
    let mut x = (rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    let jitter = if spread_ms == 0 {
        0
    } else {
        x % (spread_ms * 1000)
    };
    sleep_until(release + Duration::from_micros(jitter));
    let start = Instant::now();
    let r = exchange_unique_id(e, || Err(unicomm::Error::invalid("rank", "not 0")), timeout);
    let done = Instant::now();
    (
        done - start,
        done - release,
        r.map(|id| id == want).map_err(|e| e.to_string()),
    )
}

fn join(
    ranks: std::ops::Range<usize>,
    job: (u16, &str, usize),
    spread_ms: u64,
    busy: bool,
    timeout: Duration,
) -> Result<()> {
    let gate: Gate = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let spinner = busy.then(|| {
        let s = stop.clone();
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    });
    let want = the_id(job.1);
    let mut handles = Vec::new();
    for rank in ranks {
        let (gate, e) = (gate.clone(), env(rank, job)?);
        let h = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || one_rank(rank, &e, (&gate, spread_ms), want, timeout))?;
        handles.push(h);
    }
    let release = ready_then_release(timeout)?;
    {
        let (m, cv) = &*gate;
        *m.lock().unwrap_or_else(|e| e.into_inner()) = Some(release);
        cv.notify_all();
    }
    let (mut joins, mut last, mut failed, mut errors) = (Vec::new(), 0.0f64, 0u64, Vec::new());
    for h in handles {
        match h.join() {
            Ok((took, since, Ok(true))) => {
                joins.push(took.as_secs_f64() * 1e6);
                last = last.max(since.as_secs_f64() * 1e6);
            }
            Ok((_, _, Ok(false))) => {
                failed += 1;
                errors.push("received another id".to_string());
            }
            Ok((_, _, Err(e))) => {
                failed += 1;
                errors.push(e);
            }
            Err(_) => failed += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(s) = spinner {
        let _ = s.join();
    }
    errors.truncate(3);
    let out = serde_json::json!({
        "joins_us": joins,
        "last_done_us": last,
        "failed": failed,
        "errors": errors,
    });
    println!("{out}");
    Ok(())
}
