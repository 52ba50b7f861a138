//! Growing a communicator (NCCL >= 2.29.2): `ncclCommGetUniqueId` on the rank that roots the
//! grow, and `ncclCommGrow` on every existing rank (the root with the id, the others with
//! none) and on every new one (no communicator, the id and its rank).

use std::ffi::c_int;

use unicomm_core::{Error, Result};

use super::check::rank_in;
use super::gates::GROW_SINCE;
use super::handles::{made, Handle, OwnedComm};
use crate::sys::api::{Api, NcclComm, UniqueId};
use crate::sys::config::OwnedConfig;
use crate::sys::target::GROW_TITLE;

/// Who calls `ncclCommGrow`, with what NCCL asks of each.
#[derive(Clone, Copy)]
pub enum Grower<'a> {
    /// An existing rank: the root passes the id it made, the others none.
    Existing(Handle<'a>, Option<&'a UniqueId>),
    /// A new rank of the grown world, with the root's id.
    New(&'a UniqueId, usize),
}

impl Api {
    /// `ncclCommGetUniqueId`: an id for one grow of `comm`'s world (NCCL: one at a time,
    /// each consumed by its grow).
    pub fn comm_get_unique_id(&self, comm: Handle<'_>) -> Result<UniqueId> {
        let f = self.gated(GROW_TITLE, GROW_SINCE, self.fns.comm_get_unique_id)?;
        let mut id = UniqueId::from_bytes([0; 128]);
        // SAFETY: a live communicator; `id` receives 128 bytes.
        let code = unsafe { f(comm.raw, &mut id) };
        self.check("ncclCommGetUniqueId", code, Some(comm.raw))?;
        Ok(id)
    }

    /// `ncclCommGrow` to a world of `world` ranks, for `who`.
    pub fn comm_grow(
        &self,
        who: Grower<'_>,
        world: usize,
        config: Option<&mut OwnedConfig>,
    ) -> Result<OwnedComm> {
        let f = self.gated(GROW_TITLE, GROW_SINCE, self.fns.comm_grow)?;
        let n = c_int::try_from(world)
            .map_err(|_| Error::invalid("world", format!("{world} ranks do not fit a C int")))?;
        let (comm, id, rank): (NcclComm, *const UniqueId, c_int) = match who {
            Grower::Existing(h, id) => (h.raw, id.map_or(std::ptr::null(), |i| i), -1),
            Grower::New(id, rank) => (std::ptr::null_mut(), id, rank_in(rank, world, "rank")?),
        };
        let cfg = config.map_or(std::ptr::null_mut(), |c| c.as_mut_ptr().cast());
        let mut out: NcclComm = std::ptr::null_mut();
        // SAFETY: `comm` is a live communicator or NULL (a new rank), `id` NULL or 128 bytes
        // read during the call, `out` receives the new communicator, `cfg` is NULL or an
        // ncclConfig_t owned by the caller across the call (nccl.h's parameter rules).
        let code = unsafe { f(comm, n, id, rank, &mut out, cfg) };
        self.done("ncclCommGrow", code, (!comm.is_null()).then_some(comm))?;
        made(out).ok_or_else(|| Error::invalid("comm", "ncclCommGrow returned no communicator"))
    }
}
