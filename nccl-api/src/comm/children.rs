//! Children of a communicator ([`Collective::split`]): `ncclCommSplit` where the library has
//! it, else a fresh unique id carried to the members by the parent, each child composed
//! like any communicator (its own registrations, agreement, deadlines).

use std::ffi::c_int;

use unicomm_core::{CommConfig, Result};

use super::ApiComm;
use crate::create::Mode;
use crate::split::{self, NO_COLOR, SPLIT_SINCE};
use crate::sys::calls::OwnedComm;
use crate::sys::runtime::Runtime;
use crate::wait::settle_raw;

impl<R: Runtime> ApiComm<R> {
    /// `split` (see [`unicomm_core::Collective::split`]).
    pub(crate) fn split_child(
        &self,
        color: Option<u32>,
        key: i32,
        config: &CommConfig,
    ) -> Result<Option<Self>> {
        let b = &self.base;
        let lc = &b.lc;
        let mode = self.child_mode(config, "splitting a communicator")?;
        let nonblocking = mode.nonblocking;
        // Every rank splits in the same order, so the number names this split on every rank.
        let split = self
            .splits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let native = lc.api.fns.comm_split.is_some() && lc.api.version >= SPLIT_SINCE;
        let (raw, rank, world) = match native {
            true => {
                let color = color.map_or(NO_COLOR, |c| c as c_int);
                let cfg = crate::conv::to_config(config, false)?;
                let Some(raw) = split::split_raw(lc, color, key as c_int, cfg)? else {
                    return Ok(None);
                };
                self.adopt_raw(raw, "ncclCommSplit", nonblocking)?
            }
            false => match self.split_by_unique_id(color, key, config, mode)? {
                Some(c) => c,
                None => return Ok(None),
            },
        };
        let lc = lc.derived(raw, rank, world, mode.nonblocking, mode.timeout);
        // The child reaches its peers' memory where the parent does (the copy-engine path).
        let sharing = self.ce.child_sharing(split, color.unwrap_or(0), world);
        // The child's name, the same on its every member: its recorder's and its rejoin's.
        let step = format!("split{split}.c{}", color.unwrap_or(0));
        let rejoin = self.rejoin.get().map(|r| r.derived(step.as_bytes(), &[]));
        let flight = self.flight.derived(&step, rank, world);
        Self::compose(lc, mode, sharing, rejoin, flight).map(Some)
    }

    /// How a communicator derived from this one is made (`what` names the call in errors):
    /// `config` checked against the library, outside a group, blocking as `config` says
    /// or as this one is, with this one's deadline and checks.
    pub(super) fn child_mode(&self, config: &CommConfig, what: &str) -> Result<Mode> {
        let b = &self.base;
        let lc = &b.lc;
        crate::conv::check_config(config, lc.api.flavor.library, lc.api.version)?;
        b.not_in_group(what)?;
        Ok(Mode {
            nonblocking: config.blocking.map_or(lc.nonblocking, |blocking| !blocking),
            timeout: lc.timeout(),
            check: b.agree.checking(),
        })
    }

    /// A communicator the library derived from this one by `name` (`ncclCommSplit`,
    /// `ncclCommShrink`), ready to wrap: settled where it is non-blocking and this one is not
    /// (a non-blocking parent's call settled it already), its rank and size read; on any
    /// failure aborted, never wrapped half-made.
    pub(super) fn adopt_raw(
        &self,
        made: OwnedComm,
        name: &str,
        nonblocking: bool,
    ) -> Result<(OwnedComm, usize, usize)> {
        let lc = &self.base.lc;
        let settled = if nonblocking && !lc.nonblocking {
            settle_raw(&lc.api, made.handle(), name, lc.timeout(), &|| false)
        } else {
            Ok(())
        };
        match settled.and_then(|()| lc.api.comm_shape(made.handle())) {
            Ok((n, r)) => Ok((made, r, n)),
            Err(e) => {
                // Never wrapped: aborted here.
                let _ = lc.api.comm_abort(made);
                Err(e)
            }
        }
    }

    /// Without `ncclCommSplit`: every rank's (color, key) and, per group, its first rank's
    /// fresh unique id go through the parent's all-reduce; the members then create the
    /// child (`ncclCommInitRank[Config]`) among themselves, bounded by the deadline.
    fn split_by_unique_id(
        &self,
        color: Option<u32>,
        key: i32,
        config: &CommConfig,
        mode: Mode,
    ) -> Result<Option<(OwnedComm, usize, usize)>> {
        let b = &self.base;
        let lc = &b.lc;
        let all_max = |w: &[u64]| b.all_max(w);
        let all = split::exchange_colors(&all_max, lc.world, lc.rank, color, key)?;
        // One id per group, in the order of the colors, made by the group's first member.
        let mut colors: Vec<u32> = all.iter().filter_map(|(c, _)| *c).collect();
        colors.sort_unstable();
        colors.dedup();
        let mut mine = None;
        for c in colors {
            let members = split::members(&all, c);
            let first = members.first().copied();
            let id = if first == Some(lc.rank) {
                Some(lc.api.unique_id()?)
            } else {
                None
            };
            let shared = split::share_id(&all_max, id)?;
            if color == Some(c) {
                mine = Some((shared, members));
            }
        }
        let Some((id, members)) = mine else {
            return Ok(None);
        };
        lc.among(&id, &members, mode, config).map(Some)
    }
}
