//! [`Collective::grow`](unicomm_core::Collective::grow) for [`ApiComm`] (`ncclCommGrow`,
//! NCCL >= 2.29.2): the existing ranks' side, bounded like a split, and the new ranks'
//! ([`ApiComm::init_grown_with`]).

use std::sync::Arc;

use unicomm_core::flight::FlightRecorder;
use unicomm_core::{CommConfig, Error, Result};

use super::ApiComm;
use crate::copy_engine::Sharing;
use crate::create;
use crate::split::derive_raw;
use crate::sys::api::{Api, UniqueId};
use crate::sys::calls::Grower;
use crate::sys::runtime::Runtime;

impl<R: Runtime> ApiComm<R> {
    /// `ncclCommGetUniqueId` (see `Comm::grow_id`).
    pub(crate) fn grow_id_comm(&self) -> Result<[u8; 128]> {
        let lc = &self.base.lc;
        lc.call(|c| lc.api.comm_get_unique_id(c.handle()))
            .map(|id| id.to_bytes())
    }

    /// `ncclCommGrow` on an existing rank (see `Comm::grow`): the root with its id, the
    /// others with none.
    pub(crate) fn grow_comm(
        &self,
        world: usize,
        id: Option<&[u8; 128]>,
        config: &CommConfig,
    ) -> Result<Self> {
        let lc = &self.base.lc;
        let mode = self.child_mode(config, "growing a communicator")?;
        let id = id.map(|b| UniqueId::from_bytes(*b));
        let cfg = crate::conv::to_config(config, false)?;
        let api = lc.api.clone();
        let raw = derive_raw(lc, "ncclCommGrow", cfg, move |c, cfg| {
            api.comm_grow(Grower::Existing(c, id.as_ref()), world, cfg)
                .map(Some)
        })?
        .ok_or_else(|| Error::invalid("world", "ncclCommGrow made no communicator"))?;
        let (raw, rank, world) = self.adopt_raw(raw, "ncclCommGrow", mode.nonblocking)?;
        let grown = lc.derived(raw, rank, world, mode.nonblocking, mode.timeout);
        let flight = FlightRecorder::from_env("grown", rank, world)?;
        // No copy-engine sharing: the non-root ranks never see the id that would key it.
        Self::compose(grown, mode, Sharing::default(), None, flight)
    }

    /// Joins a grown world as new rank `rank` of `world` on device `dev`, with the id the
    /// root made (`ncclCommGrow` with no communicator, NCCL >= 2.29.2), while every rank
    /// of the world calls [`unicomm_core::Comm::grow`].
    pub fn init_grown_with(
        api: Arc<Api>,
        rt: Arc<R>,
        id: UniqueId,
        at: unicomm_core::Place,
        config: &CommConfig,
    ) -> Result<Self> {
        api.target(None).grow()?;
        Self::init_rank_ids(api, rt, create::Ids::grown(&id), at, config)
    }
}
