//! A communicator's sleep mode (`ncclCommSuspend`/`ncclCommResume`), its memory statistics
//! and its properties: the state moves between live and suspended under the lock, so a
//! suspended communicator refuses every call but these, `finalize` and `abort`.

use std::sync::Arc;

use unicomm_core::{MemStats, Properties, Result};

use super::LibComm;
use crate::sys::runtime::Runtime;
use unicomm_core::state::Life;

impl<R: Runtime> LibComm<R> {
    /// `ncclCommSuspend(NCCL_SUSPEND_MEM)`: live to suspended.
    pub(crate) fn suspend(self: &Arc<Self>) -> Result<()> {
        let api = self.api.clone();
        self.call_in_state(Life::Live, Life::Suspended, |c| {
            api.comm_suspend(c.handle())
        })
    }

    /// `ncclCommResume`: suspended to live.
    pub(crate) fn resume(self: &Arc<Self>) -> Result<()> {
        let api = self.api.clone();
        self.call_in_state(Life::Suspended, Life::Live, |c| api.comm_resume(c.handle()))
    }

    /// `ncclCommMemStats`, live or suspended.
    pub(crate) fn mem_stats(self: &Arc<Self>) -> Result<MemStats> {
        let api = self.api.clone();
        match self.life.load() {
            Life::Suspended => self.call_in_state(Life::Suspended, Life::Suspended, |c| {
                api.comm_mem_stats(c.handle())
            }),
            _ => self.call(|c| api.comm_mem_stats(c.handle())),
        }
    }

    /// `ncclCommQueryProperties`, live.
    pub(crate) fn properties(self: &Arc<Self>) -> Result<Properties> {
        let api = self.api.clone();
        self.call(|c| api.comm_query_properties(c.handle()))
    }
}
