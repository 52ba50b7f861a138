//! Who this rank is, from its launcher's variables (torchrun, Open MPI, Slurm), and where
//! the rendezvous is.

use std::net::{SocketAddr, ToSocketAddrs};

use unicomm_core::{Error, Result};

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
    /// every rank sees, instead of over TCP ([`exchange_unique_id`](super::exchange_unique_id)).
    pub file: Option<std::path::PathBuf>,
    /// Which launcher's variables were read (a [`Launcher::name`]: "torchrun",
    /// "mpirun (Open MPI)", "srun (Slurm)", ...).
    pub launcher: &'static str,
    /// The job's secret for the rendezvous (both sides prove they hold it), and where it
    /// came from ([`LaunchEnv::token_source`]).
    pub token: Vec<u8>,
    /// Where the secret comes from: `UNICOMM_RENDEZVOUS_TOKEN`; "key file" (the
    /// [`LaunchEnv::secret_file`], with the launcher's job id as a label: a job id is public,
    /// never a secret); or "none" (no token and no home directory for a key file: only the
    /// job's address, size and id, which a stranger can learn, and so join).
    pub token_source: &'static str,
    /// The key file that authenticates the rendezvous when `UNICOMM_RENDEZVOUS_TOKEN` is not
    /// set: `UNICOMM_RENDEZVOUS_SECRET_FILE`, else `$HOME/.unicomm/rendezvous.key`; readable
    /// by this user only, created by rank 0 if absent (a job across nodes needs it on a file
    /// system they share).
    pub secret_file: Option<std::path::PathBuf>,
    /// `UNICOMM_RENDEZVOUS_FORWARD=1`: the number of ranks per host, whose first rank joins
    /// rank 0 and serves the host's other ranks over a local socket (fewer connections to
    /// rank 0); `None`: every rank joins rank 0 ([`FORWARD_LOCAL_SIZE`] says where the size
    /// is read).
    pub forward: Option<usize>,
}

/// Where the ranks per host are read for `UNICOMM_RENDEZVOUS_FORWARD`, the first set:
/// torchrun, Open MPI, MVAPICH2, MPICH and Intel MPI, Slurm (its one-number form).
pub const FORWARD_LOCAL_SIZE: &[&str] = &[
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MV2_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "SLURM_NTASKS_PER_NODE",
];

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

impl LaunchEnv {
    /// Reads the process's environment (see [`LaunchEnv::from_vars`]).
    pub fn detect() -> Result<Self> {
        // A variable that is set but not UTF-8 is an error naming it, never "unset" (a
        // non-UTF-8 LOCAL_RANK would otherwise mean GPU 0, a token "no token").
        for name in read_names() {
            if let Err(std::env::VarError::NotUnicode(_)) = std::env::var(name) {
                return Err(Error::invalid(name, "is set but not UTF-8"));
            }
        }
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
        let var = &var as &dyn Fn(&str) -> Option<String>;
        let (launcher, rank, world_size, local_rank) = who_am_i(var)?;
        let (file, addr, port) = rendezvous_place(var, launcher)?;
        let (token_source, secret, secret_file) = job_secret(var)?;
        let place = match &file {
            Some(f) => format!("file:{}", f.display()),
            None => format!("{addr}:{port}"),
        };
        // A relaunch of the same job (torchrun's or Slurm's restart) is another rendezvous:
        // a file or a listener of the attempt before is not this one's.
        let attempt: String = ["TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"]
            .iter()
            .filter_map(|v| var(v).map(|x| format!("{v}={x}")))
            .collect::<Vec<_>>()
            .join(",");
        // Not the world size: every message proves it under the token, so a rank told
        // another size is authenticated and refused naming both sizes (with the size in
        // the token it would be a stranger, waiting out its deadline unanswered).
        let token = format!("{secret}|{place}|{attempt}").into_bytes();
        let forward = forwarding(var, (rank, world_size, local_rank), file.is_some())?;
        Ok(LaunchEnv {
            rank,
            world_size,
            local_rank,
            master: (addr, port),
            file,
            launcher,
            token,
            token_source,
            secret_file,
            forward,
        })
    }
}

/// `UNICOMM_RENDEZVOUS_FORWARD=1`: the ranks per host, checked. Forwarding needs the same
/// number of ranks on every host, placed by block (a host's ranks are consecutive, its first
/// has local rank 0: torchrun's, Open MPI's and Slurm's default), which every rank checks of
/// itself, so a job placed otherwise fails at once, naming the rule. Nothing to forward
/// (one rank per host, or one host) is `None`.
fn forwarding(
    var: &dyn Fn(&str) -> Option<String>,
    (rank, world, local): (usize, usize, usize),
    file: bool,
) -> Result<Option<usize>> {
    match var("UNICOMM_RENDEZVOUS_FORWARD").as_deref() {
        None | Some("0") | Some("") => return Ok(None),
        Some("1") => {}
        Some(v) => {
            return Err(Error::invalid(
                "UNICOMM_RENDEZVOUS_FORWARD",
                format!("{v:?}: 0 or 1"),
            ))
        }
    }
    let rule = "UNICOMM_RENDEZVOUS_FORWARD needs";
    if file || !cfg!(target_os = "linux") {
        return Err(Error::invalid(
            "UNICOMM_RENDEZVOUS_FORWARD",
            format!("{rule} the TCP rendezvous on Linux (its hosts' local sockets)"),
        ));
    }
    let (name, size) = FORWARD_LOCAL_SIZE
        .iter()
        .find_map(|n| var(n).map(|v| (*n, v)))
        .ok_or_else(|| {
            Error::invalid(
                "UNICOMM_RENDEZVOUS_FORWARD",
                format!("{rule} the ranks per host: none of {FORWARD_LOCAL_SIZE:?} is set"),
            )
        })?;
    let l: usize = size
        .trim()
        .parse()
        .map_err(|_| Error::invalid(name, format!("{size:?} is not a number of ranks per host")))?;
    if l == 0 || world % l != 0 || rank % l != local {
        return Err(Error::invalid(
            "UNICOMM_RENDEZVOUS_FORWARD",
            format!(
                "{rule} {l} ranks on every host placed by block: rank {rank} of {world} has local rank {local} ({name}={l})"
            ),
        ));
    }
    Ok((l > 1 && l < world).then_some(l))
}

/// The launcher, this rank, the world size and the local rank, from the first launcher
/// whose variables are set.
fn who_am_i(var: &dyn Fn(&str) -> Option<String>) -> Result<(&'static str, usize, usize, usize)> {
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
    Ok((launcher, rank, world_size, local_rank))
}

/// Where the ranks meet: a file every rank sees, or `MASTER_ADDR:MASTER_PORT`.
fn rendezvous_place(
    var: &dyn Fn(&str) -> Option<String>,
    launcher: &str,
) -> Result<(Option<std::path::PathBuf>, String, u16)> {
    let file = var("UNICOMM_RENDEZVOUS_FILE").map(std::path::PathBuf::from);
    if let Some(f) = &file {
        let text = f.to_string_lossy();
        if text.is_empty() || text.ends_with('/') || f.file_name().is_none() || f.is_dir() {
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
        let port = match port.trim().parse::<u16>() {
            // Port 0 would bind a port nobody else knows: no rank could reach it.
            Ok(p) if p > 0 => p,
            _ => {
                return Err(Error::Bootstrap {
                    reason: format!(
                        "MASTER_PORT={:?} is not a port number in 1..=65535",
                        short(&port)
                    ),
                })
            }
        };
        (addr, port)
    };
    Ok((file, addr, port))
}

/// The job's secret and where it comes from, and the key file that is mixed into it.
fn job_secret(
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<(&'static str, String, Option<std::path::PathBuf>)> {
    // The job's secret: explicit, or an id the launcher gives every process of the job
    // and no other (torchrun's run id, Slurm's job and step, Open MPI's / PMIx's job).
    let sources: [(&'static str, &[&str]); 5] = [
        ("UNICOMM_RENDEZVOUS_TOKEN", &["UNICOMM_RENDEZVOUS_TOKEN"]),
        ("TORCHELASTIC_RUN_ID", &["TORCHELASTIC_RUN_ID"]),
        ("SLURM_JOB_ID", &["SLURM_JOB_ID", "SLURM_STEP_ID"]),
        ("OMPI_MCA_ess_base_jobid", &["OMPI_MCA_ess_base_jobid"]),
        ("PMIX_NAMESPACE", &["PMIX_NAMESPACE"]),
    ];
    if let Some(t) = var("UNICOMM_RENDEZVOUS_TOKEN") {
        if t.is_empty() || t.eq_ignore_ascii_case("none") {
            return Err(Error::invalid(
                "UNICOMM_RENDEZVOUS_TOKEN",
                format!(
                    "{:?} is no secret: unset it, or set a secret the job's ranks share",
                    short(&t)
                ),
            ));
        }
    }
    let (token_source, secret) = sources
        .iter()
        .find_map(|(name, vars)| {
            let first = var(vars[0]).filter(|v| !v.is_empty() && v != "none")?;
            let rest: String = vars[1..].iter().filter_map(|v| var(v)).collect();
            Some((*name, format!("{first}/{rest}")))
        })
        .unwrap_or(("none", String::new()));
    let secret_file = match (token_source, var("UNICOMM_RENDEZVOUS_SECRET_FILE")) {
        ("UNICOMM_RENDEZVOUS_TOKEN", _) => None,
        (_, Some(f)) if f.is_empty() || f.ends_with('/') => {
            return Err(Error::invalid(
                "UNICOMM_RENDEZVOUS_SECRET_FILE",
                format!("{:?} is not a file path", short(&f)),
            ))
        }
        (_, Some(f)) => Some(std::path::PathBuf::from(f)),
        (_, None) => var("HOME")
            .filter(|h| !h.is_empty())
            .map(|h| std::path::Path::new(&h).join(".unicomm/rendezvous.key")),
    };
    let token_source = match (&secret_file, token_source) {
        (Some(_), _) => "key file",
        (None, "UNICOMM_RENDEZVOUS_TOKEN") => token_source,
        (None, _) => "none",
    };
    Ok((token_source, secret, secret_file))
}

use unicomm_core::env::short;

/// Every variable `from_vars` may read.
fn read_names() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = LAUNCHERS
        .iter()
        .flat_map(|l| l.rank.iter().chain(l.size).chain(l.local).copied())
        .collect();
    v.extend(FORWARD_LOCAL_SIZE);
    v.extend([
        "MASTER_ADDR",
        "MASTER_PORT",
        "UNICOMM_RENDEZVOUS_FILE",
        "UNICOMM_RENDEZVOUS_TOKEN",
        "UNICOMM_RENDEZVOUS_SECRET_FILE",
        "UNICOMM_RENDEZVOUS_FORWARD",
        "HOME",
        "TORCHELASTIC_RESTART_COUNT",
        "SLURM_RESTART_COUNT",
        "TORCHELASTIC_RUN_ID",
        "SLURM_JOB_ID",
        "SLURM_STEP_ID",
        "OMPI_MCA_ess_base_jobid",
        "PMIX_NAMESPACE",
    ]);
    v
}

pub(crate) fn resolve(env: &LaunchEnv) -> Result<SocketAddr> {
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

impl LaunchEnv {
    /// This environment with its key file's key mixed into the token (rank 0 creates the
    /// file if absent; the others wait for it until `deadline`), or as it is without one.
    pub(crate) fn keyed(&self, deadline: std::time::Instant) -> Result<LaunchEnv> {
        let Some(path) = &self.secret_file else {
            return Ok(self.clone());
        };
        let key = super::secret::key(path, self.rank == 0, deadline)?;
        Ok(LaunchEnv {
            token: super::auth::mac(&key, b"job", &[&self.token]).to_vec(),
            ..self.clone()
        })
    }
}

/// The fewest bytes [`LaunchEnv::shared_file`] takes as a job's secret.
pub const MIN_SECRET: usize = 16;

impl LaunchEnv {
    /// An engine's own bootstrap through a file every rank sees (its own launcher, its own
    /// variables): [`crate::exchange_unique_id`] over it applies the rendezvous' file rules.
    /// Rank 0 writes the id sealed and authenticated under `secret` (mode 0600, a fresh
    /// private temporary file renamed into place, so nothing at `<file>.tmp` is followed or
    /// waited on); each other rank takes only a file that proves the secret (a stranger's
    /// planted id is ignored and the wait goes on), opened without blocking (a FIFO there
    /// is not waited on) and read up to the file's size (`/dev/zero` is not read without
    /// end), and acknowledges it; one deadline bounds it all. `secret` is shared by the
    /// job's ranks only (at least [`MIN_SECRET`] bytes; a job id is public, not a secret).
    pub fn shared_file(
        path: impl Into<std::path::PathBuf>,
        unicomm_core::Place {
            rank,
            world: world_size,
            device: local_rank,
        }: unicomm_core::Place,
        secret: &[u8],
    ) -> Result<Self> {
        if world_size == 0 || world_size > MAX_WORLD || rank >= world_size {
            return Err(Error::invalid(
                "rank",
                format!("rank {rank} of {world_size}: a world has 1..={MAX_WORLD} ranks and rank < world"),
            ));
        }
        if secret.len() < MIN_SECRET {
            return Err(Error::invalid(
                "secret",
                format!(
                    "{} bytes: a job's secret has at least {MIN_SECRET} (share a random one with the job's ranks)",
                    secret.len()
                ),
            ));
        }
        let file: std::path::PathBuf = path.into();
        let mut token = secret.to_vec();
        token.extend_from_slice(format!("|file:{}|", file.display()).as_bytes());
        Ok(LaunchEnv {
            rank,
            world_size,
            local_rank,
            master: (String::new(), 0),
            file: Some(file),
            launcher: "the engine's own",
            token,
            token_source: "the engine's secret",
            secret_file: None,
            forward: None,
        })
    }
}
