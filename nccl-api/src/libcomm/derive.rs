//! A communicator made from another (a child, a grown or a shrunk world): the parent's
//! library, runtime and device.

use std::time::Duration;

use super::LibComm;
use crate::sys::calls::OwnedComm;
use crate::sys::runtime::Runtime;

impl<R: Runtime> LibComm<R> {
    /// `comm`, made from this communicator, as rank `rank` of `world` on its device.
    pub(crate) fn derived(
        &self,
        comm: OwnedComm,
        rank: usize,
        world: usize,
        nonblocking: bool,
        timeout: Duration,
    ) -> Self {
        let at = unicomm_core::Place::new(rank, world, self.dev);
        LibComm::new(
            self.api.clone(),
            self.rt.clone(),
            comm,
            at,
            nonblocking,
            timeout,
        )
    }
}
