//! One rank per process: who am I (from the launcher's variables) and the 128-byte unique id
//! every rank needs, exchanged over a small TCP rendezvous on `MASTER_ADDR:MASTER_PORT`.
//! Across machines NCCL/RCCL themselves carry the traffic; this only hands out the id.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// Where this process sits in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// Global rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Rank among the processes of this machine (the GPU to use).
    pub local_rank: usize,
    /// Rendezvous host and port (rank 0 listens there); unused (empty, 0) with a file
    /// rendezvous.
    pub master: (String, u16),
    /// `UNICOMM_RENDEZVOUS_FILE`: the id is handed out through this file on a filesystem
    /// every rank sees, instead of over TCP ([`exchange_unique_id`]).
    pub file: Option<std::path::PathBuf>,
    /// Which launcher's variables were read (a [`Launcher::name`]: "torchrun",
    /// "mpirun (Open MPI)", "srun (Slurm)", ...).
    pub launcher: &'static str,
    /// The job's secret for the rendezvous (both sides prove they hold it), and where it
    /// came from ([`LaunchEnv::token_source`]).
    pub token: Vec<u8>,
    /// `UNICOMM_RENDEZVOUS_TOKEN`, a launcher's job id, or "none" (then only the job's
    /// address and size: no secret; a process that knows them can join).
    pub token_source: &'static str,
}

/// One launcher's variables: the first of each list that is set is read.
#[derive(Debug)]
pub struct Launcher {
    /// As error messages and [`LaunchEnv::launcher`] name it.
    pub name: &'static str,
    /// The global rank.
    pub rank: &'static [&'static str],
    /// The number of ranks.
    pub size: &'static [&'static str],
    /// The rank on this machine (the GPU to use); 0 when none is set.
    pub local: &'static [&'static str],
}

/// The launchers [`LaunchEnv::from_vars`] recognises, in the order it tries them.
pub const LAUNCHERS: &[Launcher] = &[
    Launcher {
        name: "torchrun",
        rank: &["RANK"],
        size: &["WORLD_SIZE"],
        local: &["LOCAL_RANK"],
    },
    Launcher {
        name: "mpirun (Open MPI)",
        rank: &["OMPI_COMM_WORLD_RANK"],
        size: &["OMPI_COMM_WORLD_SIZE"],
        local: &["OMPI_COMM_WORLD_LOCAL_RANK"],
    },
    Launcher {
        name: "mpirun (MVAPICH2)",
        rank: &["MV2_COMM_WORLD_RANK"],
        size: &["MV2_COMM_WORLD_SIZE"],
        local: &["MV2_COMM_WORLD_LOCAL_RANK"],
    },
    Launcher {
        name: "mpiexec (MPICH / Intel MPI, PMI)",
        rank: &["PMI_RANK"],
        size: &["PMI_SIZE"],
        local: &["MPI_LOCALRANKID", "PMI_LOCAL_RANK"],
    },
    Launcher {
        name: "PMIx",
        rank: &["PMIX_RANK"],
        size: &["PMIX_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"],
        local: &[
            "PMIX_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "SLURM_LOCALID",
        ],
    },
    Launcher {
        name: "srun (Slurm)",
        rank: &["SLURM_PROCID"],
        size: &["SLURM_NTASKS"],
        local: &["SLURM_LOCALID"],
    },
];

/// The largest world the rendezvous accepts (its bookkeeping is per rank).
pub const MAX_WORLD: usize = 1 << 20;

const MAGIC: &[u8; 8] = b"UNICOMM1";

impl LaunchEnv {
    /// Reads the process's environment (see [`LaunchEnv::from_vars`]).
    pub fn detect() -> Result<Self> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// Reads the first launcher whose variables are set ([`LAUNCHERS`], in that order):
    /// torchrun's `RANK`/`WORLD_SIZE`/`LOCAL_RANK`; Open MPI's `OMPI_COMM_WORLD_*`;
    /// MVAPICH2's `MV2_COMM_WORLD_*`; MPICH's and Intel MPI's PMI (`PMI_RANK`, `PMI_SIZE`,
    /// `MPI_LOCALRANKID`); PMIx's `PMIX_RANK` (its size from `PMIX_SIZE` or the launcher's);
    /// Slurm's `SLURM_PROCID`/`SLURM_NTASKS`/`SLURM_LOCALID`. The rendezvous is
    /// `MASTER_ADDR:MASTER_PORT` in every case (torchrun sets them; under the others,
    /// export them). When none is found the error lists every variable looked for.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let first = |names: &[&'static str]| names.iter().copied().find(|n| var(n).is_some());
        let found = LAUNCHERS.iter().find_map(|l| {
            let rank = first(l.rank)?;
            let size = first(l.size)?;
            Some((l.name, [rank, size, first(l.local).unwrap_or("")]))
        });
        let (launcher, names) = found.ok_or_else(|| Error::Bootstrap {
            reason: format!(
                "no launcher variables: looked for {}",
                LAUNCHERS
                    .iter()
                    .map(|l| format!("{} ({} and {})", l.name, l.rank.join("/"), l.size.join("/")))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        })?;
        let num = |name: &str| -> Result<Option<usize>> {
            if name.is_empty() {
                return Ok(None);
            }
            match var(name) {
                None => Ok(None),
                Some(v) => v.trim().parse().map(Some).map_err(|_| Error::Bootstrap {
                    reason: format!("{name}={v:?} is not a non-negative integer"),
                }),
            }
        };
        let rank = num(names[0])?.unwrap_or(0);
        let world_size = num(names[1])?.unwrap_or(1);
        let local_rank = num(names[2])?.unwrap_or(0);
        if world_size > MAX_WORLD {
            return Err(Error::Bootstrap {
                reason: format!(
                    "{}={world_size} is larger than the {MAX_WORLD} ranks unicomm accepts",
                    names[1]
                ),
            });
        }
        if world_size == 0 || rank >= world_size {
            return Err(Error::Bootstrap {
                reason: format!("rank {rank} does not fit a world of {world_size} ({launcher})"),
            });
        }
        let file = var("UNICOMM_RENDEZVOUS_FILE")
            .filter(|f| !f.is_empty())
            .map(std::path::PathBuf::from);
        if let Some(f) = &file {
            if f.file_name().is_none() || f.is_dir() {
                return Err(Error::invalid(
                    "UNICOMM_RENDEZVOUS_FILE",
                    format!(
                        "{} is not a file path (a path on a filesystem every rank sees)",
                        f.display()
                    ),
                ));
            }
        }
        let (addr, port) = if file.is_some() {
            (String::new(), 0)
        } else {
            let addr = var("MASTER_ADDR").ok_or_else(|| Error::Bootstrap {
                reason: format!(
                    "MASTER_ADDR is not set ({launcher}: export MASTER_ADDR and MASTER_PORT, or UNICOMM_RENDEZVOUS_FILE)"
                ),
            })?;
            let port = var("MASTER_PORT").ok_or_else(|| Error::Bootstrap {
                reason: "MASTER_PORT is not set".into(),
            })?;
            let port = port.trim().parse::<u16>().map_err(|_| Error::Bootstrap {
                reason: format!("MASTER_PORT={port:?} is not a port number"),
            })?;
            (addr, port)
        };
        // The job's secret: explicit, or an id the launcher gives every process of the job
        // and no other (torchrun's run id, Slurm's job and step, Open MPI's / PMIx's job).
        let sources: [(&'static str, &[&str]); 5] = [
            ("UNICOMM_RENDEZVOUS_TOKEN", &["UNICOMM_RENDEZVOUS_TOKEN"]),
            ("TORCHELASTIC_RUN_ID", &["TORCHELASTIC_RUN_ID"]),
            ("SLURM_JOB_ID", &["SLURM_JOB_ID", "SLURM_STEP_ID"]),
            ("OMPI_MCA_ess_base_jobid", &["OMPI_MCA_ess_base_jobid"]),
            ("PMIX_NAMESPACE", &["PMIX_NAMESPACE"]),
        ];
        let (token_source, secret) = sources
            .iter()
            .find_map(|(name, vars)| {
                let first = var(vars[0]).filter(|v| !v.is_empty() && v != "none")?;
                let rest: String = vars[1..].iter().filter_map(|v| var(v)).collect();
                Some((*name, format!("{first}/{rest}")))
            })
            .unwrap_or(("none", String::new()));
        let place = match &file {
            Some(f) => format!("file:{}", f.display()),
            None => format!("{addr}:{port}"),
        };
        let token = format!("{secret}|{place}|{world_size}").into_bytes();
        Ok(LaunchEnv {
            rank,
            world_size,
            local_rank,
            master: (addr, port),
            file,
            launcher,
            token,
            token_source,
        })
    }
}

fn resolve(env: &LaunchEnv) -> Result<SocketAddr> {
    let (h, p) = &env.master;
    (h.as_str(), *p)
        .to_socket_addrs()
        .map_err(|e| Error::Bootstrap {
            reason: format!("cannot resolve {h}:{p}: {e}"),
        })?
        .next()
        .ok_or_else(|| Error::Bootstrap {
            reason: format!("{h}:{p} resolves to nothing"),
        })
}

fn io(what: &str, e: std::io::Error) -> Error {
    Error::Bootstrap {
        reason: format!("{what}: {e}"),
    }
}

type Mac = hmac::Hmac<sha2::Sha256>;

/// `HMAC-SHA256(token, label || parts...)`.
fn mac(token: &[u8], label: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    use hmac::Mac as _;
    // HMAC takes keys of any length, so this cannot fail.
    let mut m = match <Mac as hmac::digest::KeyInit>::new_from_slice(token) {
        Ok(m) => m,
        Err(_) => return [0; 32],
    };
    m.update(label);
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// Constant-time comparison of two MACs.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

fn nonce() -> Result<[u8; 16]> {
    let mut n = [0u8; 16];
    getrandom::fill(&mut n).map_err(|e| Error::Bootstrap {
        reason: format!("no randomness for the rendezvous: {e}"),
    })?;
    Ok(n)
}

/// A client's first message: magic, rank, world size, nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The rank the client claims.
    pub rank: usize,
    /// The world size it claims.
    pub world: usize,
    /// Its nonce.
    pub nonce: [u8; 16],
}

/// The hello's size on the wire.
pub const HELLO_LEN: usize = 32;

impl Hello {
    fn bytes(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&(self.rank as u32).to_le_bytes());
        b[12..16].copy_from_slice(&(self.world as u32).to_le_bytes());
        b[16..].copy_from_slice(&self.nonce);
        b
    }

    /// Parses a hello; anything but this exact format is an error (never a panic: the
    /// rendezvous listens on the network).
    pub fn parse(b: &[u8]) -> Result<Hello> {
        let bad = |why: &str| Error::Bootstrap {
            reason: format!("malformed hello: {why}"),
        };
        if b.len() != HELLO_LEN {
            return Err(bad(&format!("{} bytes, not {HELLO_LEN}", b.len())));
        }
        if &b[..8] != MAGIC {
            return Err(bad("not unicomm's"));
        }
        let word = |r: std::ops::Range<usize>| -> Result<usize> {
            let a: [u8; 4] = b[r].try_into().map_err(|_| bad("short field"))?;
            Ok(u32::from_le_bytes(a) as usize)
        };
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(&b[16..32]);
        Ok(Hello {
            rank: word(8..12)?,
            world: word(12..16)?,
            nonce,
        })
    }
}

/// The server's answers after a hello.
const REFUSED: u8 = 0;
const CHALLENGE: u8 = 1;

/// Reads exactly `buf.len()` bytes before `deadline` (each read's timeout is what is left).
fn read_until(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn write_until(s: &mut TcpStream, buf: &[u8], deadline: Instant) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::ErrorKind::TimedOut.into());
    }
    s.set_write_timeout(Some(left))?;
    s.write_all(buf)
}

/// How long one connection may take on the server before it is dropped (so one silent or
/// dripping client cannot hold the others back for long); never past the deadline.
const PER_CONNECTION: Duration = Duration::from_secs(2);

/// Rank 0's side of one connection: the handshake, then the id. `Ok(rank)` when the rank
/// joined; `Err(why)` when the connection was dropped (logged by the caller).
fn serve(
    s: &mut TcpStream,
    env: &LaunchEnv,
    id: &[u8; 128],
    served: &[bool],
    deadline: Instant,
) -> std::result::Result<usize, String> {
    let deadline = deadline.min(Instant::now() + PER_CONNECTION);
    let mut hb = [0u8; HELLO_LEN];
    read_until(s, &mut hb, deadline).map_err(|e| format!("no complete hello: {e}"))?;
    let h = Hello::parse(&hb).map_err(|e| e.to_string())?;
    if h.world != env.world_size || h.rank == 0 || h.rank >= env.world_size || served[h.rank] {
        let _ = write_until(s, &[REFUSED], deadline);
        return Err(format!(
            "refused: claims rank {} of {}; this job is {} ranks{}",
            h.rank,
            h.world,
            env.world_size,
            if h.rank < served.len() && served[h.rank] {
                " and that rank already joined"
            } else {
                ""
            }
        ));
    }
    let ns = nonce().map_err(|e| e.to_string())?;
    let (r, w) = (
        (h.rank as u32).to_le_bytes(),
        (h.world as u32).to_le_bytes(),
    );
    let server_proof = mac(&env.token, b"server", &[&r, &w, &h.nonce, &ns]);
    let mut msg = vec![CHALLENGE];
    msg.extend_from_slice(&ns);
    msg.extend_from_slice(&server_proof);
    write_until(s, &msg, deadline).map_err(|e| format!("challenge: {e}"))?;
    let mut client_proof = [0u8; 32];
    read_until(s, &mut client_proof, deadline).map_err(|e| format!("no proof: {e}"))?;
    if !same(
        &client_proof,
        &mac(&env.token, b"client", &[&r, &w, &h.nonce, &ns]),
    ) {
        return Err("the client does not hold this job's token".into());
    }
    // The id travels encrypted with a keystream only holders of the token can derive.
    let mut sealed = *id;
    for (k, chunk) in sealed.chunks_mut(32).enumerate() {
        let ks = mac(&env.token, b"key", &[&h.nonce, &ns, &[k as u8]]);
        chunk.iter_mut().zip(ks).for_each(|(b, k)| *b ^= k);
    }
    write_until(s, &sealed, deadline).map_err(|e| format!("sending the id: {e}"))?;
    Ok(h.rank)
}

/// Why a join failed: final (the real rank 0 refused this rank) or worth retrying (a
/// stranger on the port, a broken connection).
#[derive(Debug)]
enum JoinError {
    Refused(Error),
    Retry(Error),
}

impl From<Error> for JoinError {
    fn from(e: Error) -> Self {
        JoinError::Retry(e)
    }
}

/// A client's side: hello, check rank 0's proof, prove itself, receive the id.
fn join(
    s: &mut TcpStream,
    env: &LaunchEnv,
    deadline: Instant,
) -> std::result::Result<[u8; 128], JoinError> {
    let ioe = |what: &str, e: std::io::Error| io(what, e);
    let h = Hello {
        rank: env.rank,
        world: env.world_size,
        nonce: nonce()?,
    };
    write_until(s, &h.bytes(), deadline).map_err(|e| ioe("hello", e))?;
    let mut kind = [0u8; 1];
    read_until(s, &mut kind, deadline).map_err(|e| ioe("rank 0's answer", e))?;
    if kind[0] != CHALLENGE {
        return Err(JoinError::Refused(Error::Bootstrap {
            reason: format!(
                "rank 0 refused rank {} of {} (another world size, or this rank already joined)",
                env.rank, env.world_size
            ),
        }));
    }
    let mut ch = [0u8; 48];
    read_until(s, &mut ch, deadline).map_err(|e| ioe("rank 0's challenge", e))?;
    let mut ns = [0u8; 16];
    ns.copy_from_slice(&ch[..16]);
    let mut proof = [0u8; 32];
    proof.copy_from_slice(&ch[16..]);
    let (r, w) = (
        (h.rank as u32).to_le_bytes(),
        (h.world as u32).to_le_bytes(),
    );
    if !same(
        &proof,
        &mac(&env.token, b"server", &[&r, &w, &h.nonce, &ns]),
    ) {
        return Err(Error::Bootstrap {
            reason: "the process on the rendezvous port does not hold this job's token \
                     (another job, or a stranger on the port)"
                .into(),
        }
        .into());
    }
    let mine = mac(&env.token, b"client", &[&r, &w, &h.nonce, &ns]);
    write_until(s, &mine, deadline).map_err(|e| ioe("proof", e))?;
    let mut id = [0u8; 128];
    read_until(s, &mut id, deadline).map_err(|e| ioe("receiving the id", e))?;
    for (k, chunk) in id.chunks_mut(32).enumerate() {
        let ks = mac(&env.token, b"key", &[&h.nonce, &ns, &[k as u8]]);
        chunk.iter_mut().zip(ks).for_each(|(b, k)| *b ^= k);
    }
    Ok(id)
}

/// Hands rank 0's unique id to every rank: rank 0 calls `make_id`, listens on exactly
/// `MASTER_ADDR:MASTER_PORT` and serves the id to each other rank once; the others connect
/// (retrying until rank 0 listens) and receive it.
///
/// Security: both sides prove they hold the job's token (`LaunchEnv::token`, HMAC-SHA256
/// over fresh nonces), so a stray client gets nothing and a process squatting on the port
/// cannot hand out a forged id; the id travels encrypted. A malformed or partial hello, a
/// wrong token or a rank claimed twice is dropped (logged on stderr) and the rendezvous goes
/// on. Without a launcher job id or `UNICOMM_RENDEZVOUS_TOKEN` the token is only the job's
/// address and size: say so with [`LaunchEnv::token_source`] "none".
///
/// One deadline, `timeout`, bounds the whole exchange, every read and write included; its
/// `Timeout` names the ranks still missing and the time really waited.
pub fn exchange_unique_id(
    env: &LaunchEnv,
    make_id: impl FnOnce() -> Result<[u8; 128]>,
    timeout: Duration,
) -> Result<[u8; 128]> {
    let start = Instant::now();
    let deadline = start
        .checked_add(timeout)
        .ok_or_else(|| Error::invalid("timeout", format!("{timeout:?} overflows the clock")))?;
    if env.world_size == 0 || env.world_size > MAX_WORLD || env.rank >= env.world_size {
        return Err(Error::Bootstrap {
            reason: format!("rank {} of {} is not a valid job", env.rank, env.world_size),
        });
    }
    if let Some(path) = &env.file {
        return file_exchange(env, path, make_id, start, deadline, timeout);
    }
    let addr = resolve(env)?;
    if env.rank == 0 {
        let id = make_id()?;
        let listener = TcpListener::bind(addr)
            .map_err(|e| io(&format!("rank 0 cannot listen on {addr}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| io("listener", e))?;
        let mut served = vec![false; env.world_size];
        served[0] = true;
        let mut joined = 1;
        while joined < env.world_size {
            match listener.accept() {
                Ok((mut s, peer)) => {
                    s.set_nonblocking(false).map_err(|e| io("socket", e))?;
                    match serve(&mut s, env, &id, &served, deadline) {
                        Ok(rank) => {
                            served[rank] = true;
                            joined += 1;
                        }
                        Err(why) => {
                            eprintln!("unicomm rendezvous on {addr}: dropped {peer}: {why}")
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(Error::Timeout {
                            what: format!(
                                "rank(s) {} to join the rendezvous on {addr} (waited {:.1?})",
                                missing(&served),
                                start.elapsed()
                            ),
                            after: timeout,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(io("accept", e)),
            }
        }
        return Ok(id);
    }
    let mut last = String::from("rank 0 never answered");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout {
                what: format!(
                    "rank 0's rendezvous on {addr} (waited {:.1?}; last: {last})",
                    start.elapsed()
                ),
                after: timeout,
            });
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(1))) {
            Ok(mut s) => match join(&mut s, env, deadline) {
                Ok(id) => return Ok(id),
                // Refused by the real rank 0 (wrong size, rank taken): final.
                Err(JoinError::Refused(e)) => return Err(e),
                // A stranger or a broken connection: try again until the deadline.
                Err(JoinError::Retry(e)) => {
                    last = e.to_string();
                    std::thread::sleep(Duration::from_millis(50));
                }
            },
            // Rank 0 is not listening yet: try again until the deadline.
            Err(e) => {
                last = e.to_string();
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The ranks not yet arrived (`arrived[r]` false), at most 32 of them listed.
fn missing(arrived: &[bool]) -> String {
    let all: Vec<String> = (0..arrived.len())
        .filter(|&r| !arrived[r])
        .map(|r| r.to_string())
        .collect();
    if all.len() > 32 {
        format!("{}, ...", all[..32].join(", "))
    } else {
        all.join(", ")
    }
}

const FILE_MAGIC: &[u8; 8] = b"UNICFID1";
const ACK_MAGIC: &[u8; 8] = b"UNICFAK1";
const FILE_LEN: usize = 8 + 16 + 4 + 128 + 32;
const ACK_LEN: usize = 8 + 16 + 4 + 32;

/// Writes `bytes` to `path` all at once: a private temporary file beside it (mode 0600,
/// created new), synced, then renamed over `path`, so a reader sees all of it or nothing.
fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    let n = nonce()?;
    let hex: String = n.iter().map(|b| format!("{b:02x}")).collect();
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}.{hex}", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    let write = || -> std::io::Result<()> {
        let mut f = o.open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(&format!("writing {}", path.display()), e)
    })
}

fn ack_path(path: &std::path::Path, rank: usize) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".ack.{rank}"));
    p.into()
}

/// The file rendezvous (`UNICOMM_RENDEZVOUS_FILE`, a filesystem every rank sees): rank 0
/// writes the id there, sealed and authenticated with the job's token under a fresh nonce
/// (mode 0600, written atomically); each other rank polls for a file that proves the token,
/// takes the id and leaves an authenticated acknowledgement (`<file>.ack.<rank>`); rank 0
/// returns once every rank has acknowledged and removes the files. A file that fails the
/// checks (another job's, a torn or foreign one) is ignored and the wait goes on; one
/// deadline bounds it all. Use a path of this job only (with its job id in it): without a
/// token, a leftover file of an earlier job of the same size at the same path would be
/// taken.
fn file_exchange(
    env: &LaunchEnv,
    path: &std::path::Path,
    make_id: impl FnOnce() -> Result<[u8; 128]>,
    start: Instant,
    deadline: Instant,
    timeout: Duration,
) -> Result<[u8; 128]> {
    let world = (env.world_size as u32).to_le_bytes();
    let keystream = |n: &[u8; 16], k: usize| mac(&env.token, b"file-key", &[n, &world, &[k as u8]]);
    if env.rank == 0 {
        let id = make_id()?;
        let n = nonce()?;
        let mut sealed = id;
        for (k, chunk) in sealed.chunks_mut(32).enumerate() {
            chunk
                .iter_mut()
                .zip(keystream(&n, k))
                .for_each(|(b, k)| *b ^= k);
        }
        let tag = mac(&env.token, b"file-id", &[&n, &world, &sealed]);
        let mut bytes = Vec::with_capacity(FILE_LEN);
        for part in [&FILE_MAGIC[..], &n, &world, &sealed, &tag] {
            bytes.extend_from_slice(part);
        }
        write_atomically(path, &bytes)?;
        let mut acked = vec![false; env.world_size];
        acked[0] = true;
        loop {
            for (r, a) in acked.iter_mut().enumerate().filter(|(_, a)| !**a) {
                if let Ok(b) = std::fs::read(ack_path(path, r)) {
                    let rb = (r as u32).to_le_bytes();
                    *a = b.len() == ACK_LEN
                        && &b[..8] == ACK_MAGIC
                        && b[8..24] == n
                        && b[24..28] == rb
                        && b[28..].try_into().is_ok_and(|t: [u8; 32]| {
                            same(&t, &mac(&env.token, b"file-ack", &[&n, &world, &rb]))
                        });
                }
            }
            if acked.iter().all(|&a| a) {
                break;
            }
            if Instant::now() >= deadline {
                let _ = std::fs::remove_file(path);
                return Err(Error::Timeout {
                    what: format!(
                        "rank(s) {} to take the id from {} (waited {:.1?})",
                        missing(&acked),
                        path.display(),
                        start.elapsed()
                    ),
                    after: timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_file(path);
        for r in 1..env.world_size {
            let _ = std::fs::remove_file(ack_path(path, r));
        }
        return Ok(id);
    }
    let mut last = String::from("no file yet");
    loop {
        match std::fs::read(path) {
            Ok(b) if b.len() == FILE_LEN && &b[..8] == FILE_MAGIC => {
                let mut n = [0u8; 16];
                n.copy_from_slice(&b[8..24]);
                let mut tag = [0u8; 32];
                tag.copy_from_slice(&b[156..]);
                if b[24..28] != world {
                    last = "a file for a world of another size".into();
                } else if !same(
                    &tag,
                    &mac(&env.token, b"file-id", &[&n, &world, &b[28..156]]),
                ) {
                    last = "a file that does not prove this job's token (another job's?)".into();
                } else {
                    let mut id = [0u8; 128];
                    id.copy_from_slice(&b[28..156]);
                    for (k, chunk) in id.chunks_mut(32).enumerate() {
                        chunk
                            .iter_mut()
                            .zip(keystream(&n, k))
                            .for_each(|(b, k)| *b ^= k);
                    }
                    let rb = (env.rank as u32).to_le_bytes();
                    let mut ack = Vec::with_capacity(ACK_LEN);
                    for part in [
                        &ACK_MAGIC[..],
                        &n,
                        &rb,
                        &mac(&env.token, b"file-ack", &[&n, &world, &rb]),
                    ] {
                        ack.extend_from_slice(part);
                    }
                    write_atomically(&ack_path(path, env.rank), &ack)?;
                    return Ok(id);
                }
            }
            Ok(b) => last = format!("a file that is not unicomm's ({} bytes)", b.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => last = e.to_string(),
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: format!(
                    "rank 0's id in {} (waited {:.1?}; last: {last})",
                    path.display(),
                    start.elapsed()
                ),
                after: timeout,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
#[path = "bootstrap_tests.rs"]
mod tests;
