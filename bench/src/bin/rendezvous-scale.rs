//! `rendezvous-scale` (`cargo xtask rendezvous`): how long N ranks take to hold rank 0's
//! unique id through unicomm's TCP rendezvous, started together, over loopback.
//!
//! Rank 0 runs alone in one process (its threads, open files, memory and CPU time are read
//! from `/proc/self` and `getrusage` while it serves); the other ranks are threads of
//! `--procs` processes, released at one instant (plus a uniform spread per rank, `--spread-ms`).
//! With two or more cores rank 0's process is pinned to the first and the ranks' to the
//! second (`--no-pin` to leave them). `--busy` adds a spinning thread beside the ranks.
//!
//! One JSON line per run: the time until every rank holds the id, each rank's join (from its
//! own start) at p50/p99/max, TCP connections opened per joining rank and the listen queue's
//! overflows (the kernel's counters in `/proc/net`: the machine should be otherwise quiet), the
//! connections rank 0 closed unserved, rank 0's peak threads and open files, its memory
//! growth and CPU time, and its log lines (warnings apart). Loopback only (127.0.0.1).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Parser;

#[path = "rendezvous_scale/roles.rs"]
mod roles;

#[derive(Parser, Debug, Clone)]
#[command(about = "N ranks joining unicomm's TCP rendezvous over loopback, timed")]
struct Args {
    /// Numbers of ranks, one run set each.
    #[arg(long, value_delimiter = ',', default_value = "1024")]
    ranks: Vec<usize>,
    /// Processes holding the joining ranks (as threads).
    #[arg(long, default_value_t = 4)]
    procs: usize,
    /// Each rank starts at a uniform random delay within this many milliseconds.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    spread_ms: Vec<u64>,
    /// Forward through each "host"'s first rank, this many ranks per host
    /// (`UNICOMM_RENDEZVOUS_FORWARD`; hosts simulated on this machine: each has its own local
    /// socket); 0: every rank joins rank 0.
    #[arg(long, default_value_t = 0)]
    forward: usize,
    /// A spinning thread beside the joining ranks (ranks busy loading, say).
    #[arg(long)]
    busy: bool,
    /// Runs of each setting.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// The rendezvous' deadline.
    #[arg(long, default_value_t = 120)]
    timeout_s: u64,
    /// Leave the processes unpinned.
    #[arg(long)]
    no_pin: bool,
    /// Fail (exit 1) when a run takes longer than this until every rank holds the id.
    #[arg(long)]
    max_seconds: Option<f64>,
    /// Fail (exit 1) when a run opens more TCP connections per joining rank than this.
    #[arg(long)]
    max_connections_per_rank: Option<f64>,
    /// Internal: this process's role ("serve" or "join FIRST LAST").
    #[arg(long, hide = true, num_args = 1..)]
    role: Vec<String>,
    /// Internal: the rendezvous port.
    #[arg(long, hide = true, default_value_t = 0)]
    port: u16,
    /// Internal: the job's token.
    #[arg(long, hide = true, default_value = "")]
    token: String,
    /// Internal: the world size of this run.
    #[arg(long, hide = true, default_value_t = 0)]
    world: usize,
}

fn main() -> Result<()> {
    let a = Args::parse();
    if !a.role.is_empty() {
        return roles::child(&a.role, a.port, &a.token, a.world, a.timeout_s);
    }
    let (mut worst, mut most): (f64, f64) = (0.0, 0.0);
    for &n in &a.ranks {
        for &spread in &a.spread_ms {
            for _ in 0..a.runs {
                let line = run_once(&a, n, spread)?;
                worst = worst.max(line["all_hold_id_s"].as_f64().unwrap_or(f64::INFINITY));
                most = most.max(line["connections_per_rank"].as_f64().unwrap_or(0.0));
                if line["failed"].as_u64() != Some(0) {
                    bail!("ranks failed to join: {line}");
                }
                println!("{line}");
            }
        }
    }
    if let Some(max) = a.max_seconds {
        if worst > max {
            bail!("a run took {worst:.3} s until every rank held the id (bound {max} s)");
        }
    }
    if let Some(max) = a.max_connections_per_rank {
        if most > max {
            bail!("a run opened {most:.3} connections per rank (bound {max})");
        }
    }
    Ok(())
}

/// One child process and its output lines.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    fn spawn(a: &Args, role: &[String], port: u16, token: &str, world: usize) -> Result<Proc> {
        let exe = std::env::current_exe()?;
        let mut c = Command::new(exe);
        c.arg("--role")
            .args(role)
            .args(["--port", &port.to_string(), "--token", token])
            .args(["--world", &world.to_string()])
            .args(["--timeout-s", &a.timeout_s.to_string()])
            .env("UNICOMM_SCALE_FORWARD", a.forward.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = c.spawn().context("starting a rank process")?;
        let out = child.stdout.take().context("the child's stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(|l| l.ok()) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Ok(Proc { child, lines })
    }

    fn line(&self, deadline: Instant, what: &str) -> Result<String> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.lines
            .recv_timeout(left)
            .with_context(|| format!("no {what} from a rank process in time"))
    }

    fn send(&mut self, s: &str) -> Result<()> {
        let i = self.child.stdin.as_mut().context("the child's stdin")?;
        writeln!(i, "{s}")?;
        i.flush()?;
        Ok(())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_once(a: &Args, n: usize, spread: u64) -> Result<serde_json::Value> {
    if n < 2 {
        bail!("--ranks: at least 2");
    }
    let port = free_port()?;
    let token = format!("{:032x}", now_ns() ^ u128::from(std::process::id()) << 64);
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    let pin = !a.no_pin && cpus >= 2;
    let deadline = Instant::now() + Duration::from_secs(a.timeout_s + 30);
    let mut role = vec!["serve".to_string()];
    if pin {
        role.push("cpu=0".into());
    }
    let mut procs = vec![Proc::spawn(a, &role, port, &token, n)?];
    let per = (n - 1).div_ceil(a.procs.max(1));
    for first in (1..n).step_by(per) {
        let last = (first + per).min(n);
        let mut role = vec!["join".to_string(), first.to_string(), last.to_string()];
        role.push(format!("spread={spread}"));
        if pin {
            role.push("cpu=1".into());
        }
        if a.busy && first == 1 {
            role.push("busy".into());
        }
        procs.push(Proc::spawn(a, &role, port, &token, n)?);
    }
    for p in &procs {
        let l = p.line(deadline, "ready line")?;
        if l != "ready" {
            bail!("a rank process said {l:?} instead of ready");
        }
    }
    let before = Kernel::read();
    // Every rank released at one instant, 50 ms from now (the same clock in every process).
    let release = now_ns() + 50_000_000;
    for p in &mut procs {
        p.send(&release.to_string())?;
    }
    let outs: Vec<serde_json::Value> = procs
        .iter()
        .map(|p| {
            let l = p.line(deadline, "result")?;
            serde_json::from_str(&l).with_context(|| format!("a rank process printed {l:?}"))
        })
        .collect::<Result<_>>()?;
    let after = Kernel::read();
    Ok(summarize(n, spread, a, &outs, &before, &after))
}

fn summarize(
    n: usize,
    spread: u64,
    a: &Args,
    outs: &[serde_json::Value],
    before: &Kernel,
    after: &Kernel,
) -> serde_json::Value {
    let server = &outs[0];
    let mut joins: Vec<f64> = outs[1..]
        .iter()
        .flat_map(|o| o["joins_us"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_f64())
        .collect();
    joins.sort_by(f64::total_cmp);
    let q = |p: f64| {
        joins
            .get(((joins.len() as f64 - 1.0) * p).round() as usize)
            .map_or(f64::NAN, |v| v / 1e3)
    };
    let all_hold = outs
        .iter()
        .filter_map(|o| o["last_done_us"].as_f64())
        .fold(0.0, f64::max);
    let failed: u64 = outs[1..].iter().filter_map(|o| o["failed"].as_u64()).sum();
    let errors: Vec<serde_json::Value> = outs
        .iter()
        .flat_map(|o| o["errors"].as_array().cloned().unwrap_or_default())
        .take(3)
        .collect();
    let d = |f: fn(&Kernel) -> u64| f(after).saturating_sub(f(before));
    serde_json::json!({
        "ranks": n,
        "spread_ms": spread,
        "forward": a.forward,
        "busy": a.busy,
        "procs": a.procs,
        "all_hold_id_s": all_hold / 1e6,
        "join_ms": {"p50": q(0.5), "p99": q(0.99), "max": q(1.0)},
        "joined": joins.len(),
        "failed": failed,
        "errors": errors,
        "connections_per_rank": d(|k| k.active_opens) as f64 / (n - 1) as f64,
        "listen_overflows": d(|k| k.listen_overflows),
        "listen_drops": d(|k| k.listen_drops),
        "closed_unserved": server["closed_unserved"],
        "rank0": {
            "peak_threads": server["peak_threads"],
            "peak_open_files": server["peak_fds"],
            "memory_growth_kib": server["rss_growth_kib"],
            "cpu_ms": server["cpu_ms"],
            "cpu_us_per_rank": server["cpu_ms"].as_f64().map(|c| c * 1e3 / (n - 1) as f64),
            "log_lines": server["log_lines"],
            "warning_lines": server["warn_lines"],
            "first_lines": server["first_lines"],
        },
    })
}

/// The kernel's TCP counters (system-wide).
struct Kernel {
    active_opens: u64,
    listen_overflows: u64,
    listen_drops: u64,
}

impl Kernel {
    fn read() -> Kernel {
        let netstat = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
        let snmp = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
        Kernel {
            active_opens: counter(&snmp, "Tcp:", "ActiveOpens"),
            listen_overflows: counter(&netstat, "TcpExt:", "ListenOverflows"),
            listen_drops: counter(&netstat, "TcpExt:", "ListenDrops"),
        }
    }
}

/// A counter of `/proc/net/{snmp,netstat}`: a line of names, then a line of values.
fn counter(text: &str, prefix: &str, name: &str) -> u64 {
    let mut lines = text.lines().filter(|l| l.starts_with(prefix));
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        if let Some(i) = names.split_whitespace().position(|n| n == name) {
            return values
                .split_whitespace()
                .nth(i)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
        }
    }
    0
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

pub(crate) fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}
