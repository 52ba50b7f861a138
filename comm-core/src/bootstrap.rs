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
    /// Rendezvous host and port (rank 0 listens there).
    pub master: (String, u16),
    /// Which launcher's variables were read: "torchrun", "mpirun (Open MPI)" or "srun (Slurm)".
    pub launcher: &'static str,
}

const MAGIC: &[u8; 8] = b"UNICOMM1";

impl LaunchEnv {
    /// Reads the process's environment (see [`LaunchEnv::from_vars`]).
    pub fn detect() -> Result<Self> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// Reads torchrun's `RANK`, `WORLD_SIZE`, `LOCAL_RANK`; or Open MPI's
    /// `OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK`; or Slurm's `SLURM_PROCID`, `SLURM_NTASKS`,
    /// `SLURM_LOCALID`. The rendezvous is `MASTER_ADDR:MASTER_PORT` in every case (torchrun
    /// sets them; under mpirun or srun, export them).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let launchers: [(&'static str, [&str; 3]); 3] = [
            ("torchrun", ["RANK", "WORLD_SIZE", "LOCAL_RANK"]),
            (
                "mpirun (Open MPI)",
                [
                    "OMPI_COMM_WORLD_RANK",
                    "OMPI_COMM_WORLD_SIZE",
                    "OMPI_COMM_WORLD_LOCAL_RANK",
                ],
            ),
            (
                "srun (Slurm)",
                ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"],
            ),
        ];
        let (launcher, names) = launchers
            .iter()
            .find(|(_, n)| var(n[0]).is_some() && var(n[1]).is_some())
            .ok_or_else(|| Error::Bootstrap {
                reason: "no launcher variables: expected torchrun's RANK/WORLD_SIZE, Open MPI's \
                         OMPI_COMM_WORLD_RANK/SIZE or Slurm's SLURM_PROCID/SLURM_NTASKS"
                    .into(),
            })?;
        let num = |name: &str| -> Result<Option<usize>> {
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
        if world_size == 0 || rank >= world_size {
            return Err(Error::Bootstrap {
                reason: format!("rank {rank} does not fit a world of {world_size} ({launcher})"),
            });
        }
        let addr = var("MASTER_ADDR").ok_or_else(|| Error::Bootstrap {
            reason: format!(
                "MASTER_ADDR is not set ({launcher}: export MASTER_ADDR and MASTER_PORT)"
            ),
        })?;
        let port = var("MASTER_PORT").ok_or_else(|| Error::Bootstrap {
            reason: "MASTER_PORT is not set".into(),
        })?;
        let port = port.trim().parse::<u16>().map_err(|_| Error::Bootstrap {
            reason: format!("MASTER_PORT={port:?} is not a port number"),
        })?;
        Ok(LaunchEnv {
            rank,
            world_size,
            local_rank,
            master: (addr, port),
            launcher,
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

/// Hands rank 0's unique id to every rank: rank 0 calls `make_id` and serves the id to the
/// other `world_size - 1` ranks; the others connect (retrying until rank 0 listens) and
/// receive it. Every wait ends by `timeout` with a `Timeout` error; a rank that claims
/// another world size is a `Bootstrap` error.
pub fn exchange_unique_id(
    env: &LaunchEnv,
    make_id: impl FnOnce() -> Result<[u8; 128]>,
    timeout: Duration,
) -> Result<[u8; 128]> {
    let deadline = Instant::now() + timeout;
    let addr = resolve(env)?;
    if env.rank == 0 {
        let id = make_id()?;
        let any = SocketAddr::new(
            if addr.is_ipv4() {
                [0, 0, 0, 0].into()
            } else {
                std::net::Ipv6Addr::UNSPECIFIED.into()
            },
            addr.port(),
        );
        let listener =
            TcpListener::bind(any).map_err(|e| io(&format!("rank 0 cannot listen on {any}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| io("listener", e))?;
        let mut served = vec![false; env.world_size];
        served[0] = true;
        while served.iter().any(|s| !s) {
            match listener.accept() {
                Ok((mut s, peer)) => {
                    s.set_nonblocking(false).map_err(|e| io("socket", e))?;
                    s.set_read_timeout(Some(Duration::from_secs(5)))
                        .map_err(|e| io("socket", e))?;
                    let mut hello = [0u8; 16];
                    s.read_exact(&mut hello)
                        .map_err(|e| io(&format!("hello from {peer}"), e))?;
                    let rank =
                        u32::from_le_bytes(hello[8..12].try_into().unwrap_or_default()) as usize;
                    let world =
                        u32::from_le_bytes(hello[12..16].try_into().unwrap_or_default()) as usize;
                    if &hello[..8] != MAGIC || world != env.world_size || rank == 0 || rank >= world
                    {
                        return Err(Error::Bootstrap {
                            reason: format!(
                                "{peer} says rank {rank} of {world}; this job is {} ranks",
                                env.world_size
                            ),
                        });
                    }
                    s.write_all(&id)
                        .map_err(|e| io(&format!("sending the id to rank {rank}"), e))?;
                    served[rank] = true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<usize> =
                            (0..env.world_size).filter(|&r| !served[r]).collect();
                        return Err(Error::Timeout {
                            what: format!("ranks {missing:?} to join the rendezvous on {any}"),
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
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout {
                what: format!("rank 0's rendezvous on {addr}"),
                after: timeout,
            });
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(1))) {
            Ok(mut s) => {
                s.set_read_timeout(Some(left.max(Duration::from_millis(10))))
                    .map_err(|e| io("socket", e))?;
                let mut hello = [0u8; 16];
                hello[..8].copy_from_slice(MAGIC);
                hello[8..12].copy_from_slice(&(env.rank as u32).to_le_bytes());
                hello[12..16].copy_from_slice(&(env.world_size as u32).to_le_bytes());
                s.write_all(&hello).map_err(|e| io("hello", e))?;
                let mut id = [0u8; 128];
                s.read_exact(&mut id)
                    .map_err(|e| io(&format!("receiving the id from {addr}"), e))?;
                return Ok(id);
            }
            // Rank 0 is not listening yet: try again until the deadline.
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

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

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn env(rank: usize, world: usize, port: u16) -> LaunchEnv {
        LaunchEnv {
            rank,
            world_size: world,
            local_rank: rank,
            master: ("127.0.0.1".into(), port),
            launcher: "test",
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
                        exchange_unique_id(
                            &env(r, 4, port),
                            || Ok([42; 128]),
                            Duration::from_secs(10),
                        )
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
        assert!(
            matches!(out[0], Err(Error::Bootstrap { .. })),
            "{:?}",
            out[0]
        );
        assert!(out[1].is_err());
    }
}
