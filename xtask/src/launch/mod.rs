//! `cargo xtask run --procs N`: a launcher for development, in the manner of torchrun. It
//! starts N processes of one program with torchrun's variables (`RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR=127.0.0.1`, a free `MASTER_PORT`, and a
//! fresh `UNICOMM_RENDEZVOUS_TOKEN` so that only its own processes can join), prefixes each
//! line they print with `[rank r]`, stops the others when one fails, and exits with the
//! first failure's code.
//!
//! Each rank runs in a process group of its own, and stopping a rank signals its group, so
//! the processes a rank started stop with it. SIGINT or SIGTERM to the launcher stops every
//! rank the same way (SIGTERM, then SIGKILL after a grace period) and the launcher exits
//! with 128 + the signal. A rank's output is read as bytes (a line that is not UTF-8 is
//! printed lossily, never closing the rank's pipe), at most 64 KiB per printed line.
//!
//! `--share-gpu` puts every rank on GPU 0 (`LOCAL_RANK=0`) and picks how NCCL joins them
//! (`share.rs`, said in one line): where the NCCL the ranks load (`UNICOMM_NCCL_LIBRARY`,
//! asked for its version) is 2.30.3 or newer, NCCL's own multi-rank mode (one host,
//! `NCCL_MULTI_RANK_GPU_ENABLE=1`, `NCCL_MAX_CTAS=8`, at most 2 ranks); below it, or where
//! the library is not named, a host id per process (`NCCL_HOSTID`): NCCL refuses two ranks
//! of one host on one GPU ("Duplicate GPU detected", 2.28.9), so it then takes them for ranks
//! of different hosts and joins them over its network transport, while unicomm's own
//! exchanges (the copy-engine path's abstract Unix sockets, the rendezvous) still find each
//! other on this machine. A machine with one GPU so runs one-rank-per-process programs for
//! correctness; not for speed (the ranks' contexts time-share the GPU).

#![allow(unsafe_code, reason = "signals to the ranks' process groups")]

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

mod port;
mod share;
use port::free_port;
use share::Share;

/// How long the others get to end after a failure before they are killed.
const GRACE: Duration = Duration::from_secs(5);
/// The longest piece of a rank's output printed as one line (a longer line is cut into
/// pieces of this size, so a line without end is never buffered whole).
const MAX_LINE: usize = 64 << 10;

/// Prints what `out` carries, a line at a time with the rank's prefix, as bytes.
fn prefix(rank: usize, out: impl Read + Send + 'static, err: bool) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(out);
        let mut line = Vec::with_capacity(256);
        loop {
            line.clear();
            match (&mut r).take(MAX_LINE as u64).read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.strip_suffix('\n').unwrap_or(&text);
            if err {
                eprintln!("[rank {rank}] {text}");
            } else {
                println!("[rank {rank}] {text}");
            }
        }
    })
}

fn token() -> Result<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("no randomness for the job token: {e}"))?;
    Ok(format!(
        "xtask-{}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    ))
}

/// One rank: its process (the leader of its process group), whether it was reaped (its pid
/// may then belong to another program: never signalled again), its output readers.
struct Rank {
    rank: usize,
    child: Child,
    reaped: bool,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Rank {
    /// The rank's exit status once it has ended. Before it is reaped (so its pid and group id
    /// are still its own), what it left running in its group is killed.
    fn ended(&mut self) -> Result<Option<ExitStatus>> {
        if self.reaped {
            return Ok(None);
        }
        #[cfg(unix)]
        {
            // SAFETY: an all-zero siginfo_t is valid; waitid with WNOWAIT only looks at the
            // child (left a zombie, not reaped), WNOHANG returns at once.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            let pid = self.child.id();
            // SAFETY: as above; `info` is a valid out-parameter.
            let r = unsafe {
                libc::waitid(
                    libc::P_PID,
                    pid,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                )
            };
            if r != 0 {
                return Err(std::io::Error::last_os_error()).context("waitid on a rank");
            }
            // SAFETY: filled by waitid (zero while the child runs).
            if unsafe { info.si_pid() } == 0 {
                return Ok(None);
            }
            // SAFETY: the group of a child not yet reaped (its id cannot have been reused).
            unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
        }
        let st = self.child.wait()?;
        self.reaped = true;
        Ok(Some(st))
    }

    /// Sends `sig` to the rank's process group (the rank and what it started), SIGTERM first
    /// as torchrun does so the program can end cleanly. Never to a reaped rank.
    fn signal(&mut self, sig: i32) {
        if self.reaped {
            return;
        }
        #[cfg(unix)]
        // SAFETY: kill(2) on the process group this launcher created for a child it has not
        // reaped (so the group id is still that child's).
        unsafe {
            libc::kill(-(self.child.id() as i32), sig);
        }
        #[cfg(not(unix))]
        {
            let _ = sig;
            let _ = self.child.kill();
        }
    }
}

#[cfg(unix)]
const SIGTERM: i32 = libc::SIGTERM;
#[cfg(unix)]
const SIGKILL: i32 = libc::SIGKILL;
#[cfg(not(unix))]
const SIGTERM: i32 = 15;
#[cfg(not(unix))]
const SIGKILL: i32 = 9;

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

/// The signal the launcher received (0: none), set by the handlers `run` installs.
pub(crate) struct Stop(pub(crate) Arc<AtomicI32>);

#[cfg(unix)]
type Hook = signal_hook::SigId;
#[cfg(not(unix))]
type Hook = ();

impl Stop {
    /// Notes SIGINT, SIGTERM and SIGHUP to this process instead of dying of them.
    fn install() -> Result<(Stop, Vec<Hook>)> {
        let got = Arc::new(AtomicI32::new(0));
        let mut ids = Vec::new();
        #[cfg(unix)]
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            let got = got.clone();
            // SAFETY: the handler only stores into an atomic (async-signal-safe).
            let id = unsafe {
                signal_hook::low_level::register(sig, move || got.store(sig, Ordering::SeqCst))
            }
            .context("installing the launcher's signal handlers")?;
            ids.push(id);
        }
        Ok((Stop(got), ids))
    }

    fn received(&self) -> i32 {
        self.0.load(Ordering::SeqCst)
    }
}

pub fn run(program: &Path, args: &[String], job: &Job<'_>) -> Result<()> {
    let (stop, ids) = Stop::install()?;
    let r = run_until(program, args, job, &stop);
    #[cfg(unix)]
    for id in ids {
        signal_hook::low_level::unregister(id);
    }
    #[cfg(not(unix))]
    let _ = ids;
    r
}

/// [`run`], stopping every rank once `stop` notes a signal.
pub(crate) fn run_until(program: &Path, args: &[String], job: &Job<'_>, stop: &Stop) -> Result<()> {
    let Job {
        n,
        timeout,
        expect_lost,
        ..
    } = *job;
    if n == 0 || n > 1024 {
        bail!("--procs {n}: 1..=1024 processes");
    }
    // Three pipes per rank (stdin, stdout, stderr): past the usual soft limit of 1,024
    // files near 340 ranks.
    raise_open_files_limit();
    let port = free_port()?;
    let token = token()?;
    eprintln!(
        "==> launching {n} processes of {} (MASTER_ADDR=127.0.0.1 MASTER_PORT={port})",
        program.display()
    );
    let share = shared(job)?;
    let mut kids = spawn_ranks(program, args, (job, share.as_ref()), port, &token)?;
    let start = Instant::now();
    let mut first_failure: Option<(usize, i32)> = None;
    let mut stopping_since: Option<Instant> = None;
    let mut lost = std::collections::BTreeSet::new();
    loop {
        let mut running = 0;
        for k in kids.iter_mut().filter(|k| !k.reaped) {
            match k.ended()? {
                Some(st) => {
                    let r = k.rank;
                    if !st.success() && expect_lost.contains(&r) {
                        if lost.insert(r) {
                            eprintln!("==> rank {r} lost ({st}), as expected; the others go on");
                        }
                    } else if !st.success() && first_failure.is_none() {
                        eprintln!("==> rank {r} failed ({st}); stopping the others");
                        first_failure = Some((r, code(st)));
                    }
                }
                None => running += 1,
            }
        }
        if running == 0 {
            break;
        }
        let sig = stop.received();
        if first_failure.is_none() && sig != 0 {
            eprintln!("==> the launcher got signal {sig}; stopping every rank");
            first_failure = Some((usize::MAX - 1, 128 + sig));
        }
        if first_failure.is_some() || start.elapsed() > timeout {
            if first_failure.is_none() {
                eprintln!("==> still running after {timeout:?}; stopping every rank");
                first_failure = Some((usize::MAX, 124));
            }
            let since = *stopping_since.get_or_insert_with(|| {
                kids.iter_mut().for_each(|k| k.signal(SIGTERM));
                Instant::now()
            });
            if since.elapsed() > GRACE {
                kids.iter_mut().for_each(|k| k.signal(SIGKILL));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drain(kids, start.checked_add(timeout));
    outcome(n, first_failure, &lost)
}

/// The ranks' last lines: their pipes close when they exit (a process they started and left
/// behind may hold one open: waited for at most 2 s, and never past the job's deadline, if
/// one can be represented).
fn drain(kids: Vec<Rank>, deadline: Option<Instant>) {
    // A deadline too far to represent (`--timeout-s` of u64::MAX) is no deadline here.
    let until = (Instant::now() + Duration::from_secs(2))
        .min(deadline.unwrap_or(until_far()))
        .max(Instant::now());
    for h in kids.into_iter().flat_map(|k| k.readers) {
        while !h.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        if h.is_finished() {
            let _ = h.join();
        }
    }
}

/// The job's result: every rank succeeded (but those expected lost), or the first failure.
fn outcome(
    n: usize,
    first_failure: Option<(usize, i32)>,
    lost: &std::collections::BTreeSet<usize>,
) -> Result<()> {
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

/// Every rank started with its launcher variables, in a process group of its own, its
/// output read line by line; if one cannot start, those started are killed and reaped.
fn spawn_ranks(
    program: &Path,
    args: &[String],
    (job, share): (&Job<'_>, Option<&Share>),
    port: u16,
    token: &str,
) -> Result<Vec<Rank>> {
    let Job {
        n, share_gpu, env, ..
    } = *job;
    let mut kids: Vec<Rank> = Vec::new();
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
            .env("UNICOMM_RENDEZVOUS_TOKEN", token)
            .envs(env.iter().copied());
        if let Some(s) = share {
            s.apply(&mut cmd, token, r);
        }
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let spawned = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting rank {r}: {}", program.display()));
        let mut c = match spawned {
            Ok(c) => c,
            Err(e) => {
                for k in &mut kids {
                    k.signal(SIGKILL);
                    let _ = k.child.wait();
                }
                return Err(e);
            }
        };
        let mut readers = Vec::new();
        if let Some(o) = c.stdout.take() {
            readers.push(prefix(r, o, false));
        }
        if let Some(e) = c.stderr.take() {
            readers.push(prefix(r, e, true));
        }
        kids.push(Rank {
            rank: r,
            child: c,
            reaped: false,
            readers,
        });
    }
    Ok(kids)
}

/// A rank failed: the launcher exits with its code.
#[derive(Debug)]
pub struct Failed {
    pub rank: usize,
    pub code: i32,
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.rank == usize::MAX - 1 {
            write!(
                f,
                "the launcher was stopped by a signal (exit {})",
                self.code
            )
        } else if self.rank == usize::MAX {
            write!(f, "the ranks did not finish in time (exit {})", self.code)
        } else {
            write!(f, "rank {} failed with exit code {}", self.rank, self.code)
        }
    }
}

impl std::error::Error for Failed {}

#[cfg(all(test, unix))]
mod tests;

/// Two seconds from now: the pipes' wait when the run's own deadline is too far to
/// represent.
fn until_far() -> Instant {
    Instant::now() + Duration::from_secs(2)
}

/// The soft limit of open files raised to the hard one (NCCL's root does the same).
#[cfg(unix)]
fn raise_open_files_limit() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `l` is a valid rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } == 0 && l.rlim_cur < l.rlim_max {
        l.rlim_cur = l.rlim_max;
        // SAFETY: a valid rlimit; a refusal leaves the limit as it was.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) };
    }
}

#[cfg(not(unix))]
fn raise_open_files_limit() {}

/// `--share-gpu`'s mode for this job, said in one line; `None` without `--share-gpu`.
fn shared(job: &Job<'_>) -> Result<Option<Share>> {
    if !job.share_gpu {
        return Ok(None);
    }
    let (share, line) = share::decide(
        job.n,
        nccl_version().as_ref().map(|(p, c)| (p.as_str(), *c)),
        std::env::var("NCCL_MULTI_RANK_GPU_ENABLE").ok().as_deref(),
    )?;
    eprintln!("==> {line}");
    Ok(Some(share))
}

/// The path and version code of the NCCL named by `UNICOMM_NCCL_LIBRARY` (what the ranks
/// load), where it can be read: loaded here and asked (`ncclGetVersion`).
#[cfg(not(unix))]
fn nccl_version() -> Option<(String, i32)> {
    None
}

/// See the other platforms' [`nccl_version`].
#[cfg(unix)]
fn nccl_version() -> Option<(String, i32)> {
    let path = std::env::var("UNICOMM_NCCL_LIBRARY").ok()?;
    // SAFETY: NCCL's initialisers are safe to run on load (every NCCL program loads it); the
    // symbol is called with its declared signature (`ncclResult_t ncclGetVersion(int*)`)
    // while the library is held.
    unsafe {
        let lib = libloading::Library::new(&path).ok()?;
        let get: libloading::Symbol<unsafe extern "C" fn(*mut i32) -> i32> =
            lib.get(b"ncclGetVersion\0").ok()?;
        let mut code = 0i32;
        (get(&mut code) == 0).then_some((path, code))
    }
}
