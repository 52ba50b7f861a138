//! A communicator made from another (a child, a grown or a shrunk world, one re-formed
//! among some of its ranks): the parent's library, runtime and device.

use std::time::Duration;

use unicomm_core::{CommConfig, Place, Result};

use super::LibComm;
use crate::create::{self, Mode};
use crate::sys::api::UniqueId;
use crate::sys::calls::OwnedComm;
use crate::sys::runtime::Runtime;

impl<R: Runtime + 'static> LibComm<R> {
    /// `comm`, made from this communicator, as rank `rank` of `world` on its device.
    pub(crate) fn derived(
        &self,
        comm: OwnedComm,
        rank: usize,
        world: usize,
        nonblocking: bool,
        timeout: Duration,
    ) -> Self {
        let at = Place::new(rank, world, self.dev);
        LibComm::new(
            self.api.clone(),
            self.rt.clone(),
            comm,
            at,
            nonblocking,
            timeout,
        )
    }

    /// A new communicator among `members` of this one's world (this rank among them), from
    /// `id` (`ncclCommInitRank[Config]`, bounded by `mode`'s deadline): it, this rank's
    /// place in it and its world.
    pub(crate) fn among(
        &self,
        id: &UniqueId,
        members: &[usize],
        mode: Mode,
        config: &CommConfig,
    ) -> Result<(OwnedComm, usize, usize)> {
        let rank = members.iter().position(|&r| r == self.rank).unwrap_or(0);
        let world = members.len();
        let at = Place::new(rank, world, self.dev);
        let raw = create::one_rank(&self.api, &self.rt, create::Ids::one(id), at, mode, config)?;
        Ok((raw, rank, world))
    }
}
