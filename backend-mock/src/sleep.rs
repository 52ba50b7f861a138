//! The mock's sleep mode, memory statistics and properties, with NCCL's rules and words:
//! gated by the target's release (NCCL 2.29.7 and 2.29.2), a suspended communicator refuses
//! every call but resume, its statistics, finalize and abort. The mock's library holds no
//! device memory of its own (its buffers are the user's), so its statistics are zeros.

use unicomm_core::{Error, MemStats, Properties, Result};

use crate::comm::MockComm;
use unicomm_core::state::Life;

impl MockComm {
    /// `suspend`: live to suspended.
    pub(crate) fn suspend_comm(&self) -> Result<()> {
        self.ctx.target.suspend()?;
        self.live()?;
        self.state
            .compare_exchange(Life::Live, Life::Suspended)
            .map(|_| ())
            .or_else(|_| self.live())
    }

    /// `resume`: suspended to live.
    pub(crate) fn resume_comm(&self) -> Result<()> {
        self.ctx.target.suspend()?;
        match self.state.compare_exchange(Life::Suspended, Life::Live) {
            Ok(_) => Ok(()),
            Err(Life::Live) => Err(Error::invalid("comm", "the communicator is not suspended")),
            Err(_) => self.live(),
        }
    }

    /// `mem_stats`, live or suspended.
    pub(crate) fn mem_stats_comm(&self) -> Result<MemStats> {
        self.ctx.target.suspend()?;
        let suspended = self.state.load() == Life::Suspended;
        if !suspended {
            self.live()?;
        }
        Ok(MemStats {
            suspended,
            ..MemStats::default()
        })
    }

    /// `properties`: the rank's place and device; no device API or multicast memory.
    pub(crate) fn properties_comm(&self) -> Result<Properties> {
        self.ctx.target.properties()?;
        self.live()?;
        Ok(Properties {
            rank: self.ctx.rank,
            world: self.ctx.world,
            device: self.device.1,
            device_api: false,
            multimem: false,
            host_rma: Some(false),
            lsa_teams: Some(1),
        })
    }
}
