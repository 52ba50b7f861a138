//! Each backend crate's entry points behind the facade's [`Backend`] trait: the mock's, and
//! NCCL's and RCCL's from one macro (the shared NCCL-API layer gives them the same ones).

use std::time::Duration;

use unicomm_bootstrap::LaunchEnv;
use unicomm_core::{CommConfig, Place, Result};

#[cfg(feature = "mock")]
use super::unicomm_mock;
#[cfg(feature = "nccl")]
use super::unicomm_nccl;
#[cfg(feature = "rccl")]
use super::unicomm_rccl;
use super::{AnyComm, Backend};

#[cfg(feature = "mock")]
impl Backend for unicomm_mock::Facade {
    fn probe() -> Result<String> {
        Ok(format!(
            "CPU threads as ranks ({} by default, UNICOMM_MOCK_RANKS)",
            ::unicomm_mock::DEFAULT_RANKS
        ))
    }
    fn local(n: Option<usize>, config: &CommConfig) -> Result<Vec<AnyComm>> {
        // The mock has no SMs, networks or NCCL internals: a configuration is checked and
        // otherwise has no effect on it.
        config.check_values()?;
        let n = match n {
            Some(n) => n,
            None => ::unicomm_mock::ranks_from_env()?,
        };
        let world = ::unicomm_mock::world(n, ::unicomm_mock::MockConfig::from_env()?)?;
        Ok(world.into_iter().map(AnyComm::from).collect())
    }
    fn from_env(env: &LaunchEnv, timeout: Duration, config: &CommConfig) -> Result<AnyComm> {
        ::unicomm_mock::join(env, mock_config(config)?, timeout).map(AnyComm::from)
    }
    fn unique_id() -> Result<[u8; 128]> {
        ::unicomm_mock::unique_id()
    }
    fn init_rank(
        id: &[u8; 128],
        Place { rank, world, .. }: Place,
        config: &CommConfig,
    ) -> Result<AnyComm> {
        ::unicomm_mock::init_rank(id, rank, world, mock_config(config)?).map(AnyComm::from)
    }
    fn init_grown(
        id: &[u8; 128],
        Place { rank, world, .. }: Place,
        config: &CommConfig,
    ) -> Result<AnyComm> {
        ::unicomm_mock::init_grown(id, rank, world, mock_config(config)?).map(AnyComm::from)
    }
}

/// The mock's settings from the environment, once `config`'s values are checked (the mock
/// takes no NCCL settings, but refuses the values NCCL would).
#[cfg(feature = "mock")]
fn mock_config(config: &CommConfig) -> Result<::unicomm_mock::MockConfig> {
    config.check_values()?;
    ::unicomm_mock::MockConfig::from_env()
}

/// NCCL and RCCL have the same entry points (the shared NCCL-API layer).
macro_rules! gpu_backend {
    ($feature:literal, $krate:ident) => {
        #[cfg(feature = $feature)]
        impl Backend for $krate::Facade {
            fn probe() -> Result<String> {
                ::$krate::probe()
            }
            fn local(n: Option<usize>, config: &CommConfig) -> Result<Vec<AnyComm>> {
                Ok(::$krate::local_comms_with(n, config)?
                    .into_iter()
                    .map(AnyComm::from)
                    .collect())
            }
            fn from_env(
                env: &LaunchEnv,
                timeout: Duration,
                config: &CommConfig,
            ) -> Result<AnyComm> {
                // Above UNICOMM_RANKS_PER_ROOT ranks, one root per block of ranks (NCCL's
                // many-root creation), its ids made by rank 0 and handed out together; the
                // file rendezvous hands out one.
                let roots = match env.file {
                    Some(_) => 1,
                    None => ::$krate::roots_for(env.world_size)?,
                };
                let make = || {
                    (0..roots)
                        .map(|_| Ok(::$krate::unique_id()?.to_bytes()))
                        .collect::<Result<Vec<_>>>()
                };
                // Rank 0 enters the creation as soon as its ids exist, serving the others
                // meanwhile (the creation waits for every rank anyway).
                let (ids, serving) =
                    unicomm_bootstrap::exchange_unique_ids_serving(env, roots, make, timeout)?;
                let ids: Vec<_> = ids
                    .into_iter()
                    .map(::$krate::UniqueId::from_bytes)
                    .collect();
                let where_ = Place::new(env.rank, env.world_size, env.local_rank);
                let config = config.clone();
                // Rank 0's creation waits for every rank in the library; a rendezvous that
                // fails meanwhile (a rank refused) ends rank 0's wait at once.
                let comm = serving.create_beside(move || match ids.as_slice() {
                    [id] => ::$krate::init_rank_with(*id, where_, &config),
                    _ => ::$krate::init_rank_scalable_with(&ids, where_, &config),
                })?;
                // After a failure the survivors re-form over the job's rendezvous.
                comm.set_rejoin(std::sync::Arc::new(unicomm_bootstrap::Rejoin::job(env)))?;
                Ok(AnyComm::from(comm))
            }
            fn unique_id() -> Result<[u8; 128]> {
                Ok(::$krate::unique_id()?.to_bytes())
            }
            fn init_rank(id: &[u8; 128], at: Place, config: &CommConfig) -> Result<AnyComm> {
                let id = ::$krate::UniqueId::from_bytes(*id);
                ::$krate::init_rank_with(id, at, config).map(AnyComm::from)
            }
            fn init_grown(id: &[u8; 128], at: Place, config: &CommConfig) -> Result<AnyComm> {
                let id = ::$krate::UniqueId::from_bytes(*id);
                ::$krate::init_grown_with(id, at, config).map(AnyComm::from)
            }
        }
    };
}
gpu_backend!("nccl", unicomm_nccl);
gpu_backend!("rccl", unicomm_rccl);
