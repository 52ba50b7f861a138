//! [`Collective::shrink`](unicomm_core::Collective::shrink) and `revoke` for [`ApiComm`]:
//! `ncclCommShrink` on a live communicator of a library that has it, else the survivors
//! re-form from a fresh unique id that meets them through the communicator's [`Rejoin`]
//! (in this process, or over the job's rendezvous).

use std::sync::Arc;

use unicomm_core::{CommConfig, Error, Rejoin, Result, ShrinkMode};

use super::ApiComm;
use crate::create::Mode;
use crate::libcomm::End;
use crate::shrink::{self, SHRINK_SINCE};
use crate::sys::api::UniqueId;
use crate::sys::runtime::Runtime;

/// Shrinks share the children's numbering of the copy-engine path's worlds from here on.
const SHRINK_WORLDS: u64 = 1 << 63;

impl<R: Runtime> ApiComm<R> {
    /// Where this communicator's survivors meet to re-form, handed in from above (the vendor
    /// crates' `local_comms` give a world of this process an in-process board, the facade's
    /// `from_env` the job's rendezvous); children derive theirs from it. Once per
    /// communicator.
    pub fn set_rejoin(&self, rejoin: Arc<dyn Rejoin>) -> Result<()> {
        self.rejoin
            .set(rejoin)
            .map_err(|_| Error::invalid("rejoin", "already set for this communicator"))
    }

    /// [`ApiComm::set_rejoin`] on every rank of a world made in this process, with one
    /// channel (its ranks meet on it).
    pub fn share_rejoin(comms: &[Self], rejoin: Arc<dyn Rejoin>) -> Result<()> {
        comms.iter().try_for_each(|c| c.set_rejoin(rejoin.clone()))
    }

    /// `shrink` (see [`unicomm_core::Comm::shrink`]); `exclude` sorted and checked.
    pub(crate) fn shrink_child(
        &self,
        exclude: &[usize],
        mode: ShrinkMode,
        config: &CommConfig,
    ) -> Result<Self> {
        let lc = &self.base.lc;
        let mode_c = self.child_mode(config, "shrinking a communicator")?;
        let survivors: Vec<usize> = (0..lc.world)
            .filter(|r| exclude.binary_search(r).is_err())
            .collect();
        // The re-forms that succeeded (an attempt that failed is retried under the same
        // number, so survivors whose attempts failed at different times still meet).
        let round = self.shrinks.load(std::sync::atomic::Ordering::Relaxed);
        let native = lc.api.fns.comm_shrink.is_some()
            && lc.api.version >= SHRINK_SINCE
            && mode != ShrinkMode::Reform
            && lc.live_now().is_ok();
        tracing::info!(
            rank = lc.rank,
            ?exclude,
            ?mode,
            how = if native {
                "ncclCommShrink"
            } else {
                "re-forming"
            },
            "shrinking the communicator"
        );
        let (raw, rank, world) = match native {
            true => {
                let cfg = crate::conv::to_config(config, false)?;
                let raw = shrink::shrink_raw(lc, exclude, cfg, crate::conv::shrink_flag(mode))?
                    .ok_or_else(|| {
                        Error::invalid("exclude", "ncclCommShrink made no communicator")
                    })?;
                let made = self.adopt_raw(raw, "ncclCommShrink", mode_c.nonblocking)?;
                if mode == ShrinkMode::Abort {
                    // NCCL's rule after the abort mode: the parent is aborted, not destroyed.
                    let _ = lc.destroy(End::Abort);
                }
                made
            }
            false => self.reform(&survivors, round, mode_c, config)?,
        };
        self.shrinks
            .fetch_max(round + 1, std::sync::atomic::Ordering::Relaxed);
        let lc = lc.derived(raw, rank, world, mode_c.nonblocking, mode_c.timeout);
        let sharing = self.ce.child_sharing(SHRINK_WORLDS + round, 0, world);
        // Its name, the same on every survivor: its recorder's and its rejoin's.
        let step = format!("shrink{round}");
        let rejoin = self
            .rejoin
            .get()
            .map(|r| r.derived(step.as_bytes(), &survivors));
        let flight = self.flight.derived(&step, rank, world);
        Self::compose(lc, mode_c, sharing, rejoin, flight)
    }

    /// Without `ncclCommShrink`, on a failed communicator, or asked for: this communicator
    /// is aborted, the first survivor makes a unique id, the others get it through the
    /// rejoin channel, and the survivors create their communicator.
    fn reform(
        &self,
        survivors: &[usize],
        round: u64,
        mode: Mode,
        config: &CommConfig,
    ) -> Result<(crate::sys::calls::OwnedComm, usize, usize)> {
        let lc = &self.base.lc;
        let Some(rejoin) = self.rejoin.get() else {
            return Err(Error::unsupported(
                "re-forming a communicator",
                "ncclCommShrink, or a way for the survivors to meet: a world from local_comms or from_env (ApiComm::set_rejoin)",
                "a communicator joined with init_rank and no rejoin channel",
            ));
        };
        // Its work may wait for the lost ranks forever: ended first (an error here means it
        // had ended already, which is what is wanted).
        let _ = lc.destroy(End::Abort);
        let api = lc.api.clone();
        let id = rejoin.exchange(
            round,
            survivors,
            lc.rank,
            &mut || Ok(api.unique_id()?.to_bytes()),
            lc.timeout(),
        )?;
        lc.among(&UniqueId::from_bytes(id), survivors, mode, config)
    }

    /// `revoke` (see [`unicomm_core::Comm::revoke`]).
    pub(crate) fn revoke_comm(&self) -> Result<()> {
        shrink::revoke(&self.base.lc)
    }
}
