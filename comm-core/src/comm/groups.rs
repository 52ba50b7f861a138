//! Process groups: a communicator split into children (`ncclCommSplit`), by color and key or
//! by rank lists, as PyTorch's `new_group`/`split_group` make them.

use crate::backend::Collective;
use crate::{Comm, CommConfig, Error, Result, ShrinkMode};

impl<C: Collective> Comm<C> {
    /// Splits this communicator (collective: every rank calls it, in the same order as its
    /// other collectives). Ranks passing the same `color` form one child, ranked by `key`
    /// (ties broken by their rank here); `None` takes part and gets no child. The child
    /// inherits the parent's configuration; see [`Comm::split_with`].
    ///
    /// (Example: the facade's `guide`, "Process groups".)
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Comm<C>>> {
        self.split_with(color, key, &CommConfig::default())
    }

    /// [`Comm::split`] with the child's configuration. A field the loaded library predates
    /// is `Unsupported`, naming it. With `split_share: Some(true)` the child shares the
    /// parent's internal resources (NCCL >= 2.18): less memory, but parent and child must
    /// not run work at the same time. Either way the child is a communicator of its own:
    /// finalizing, aborting or dropping one leaves the other usable (unicomm ties no
    /// lifetimes between them; NCCL's resources shared with `splitShare` live until both
    /// are gone).
    pub fn split_with(
        &self,
        color: Option<u32>,
        key: i32,
        config: &CommConfig,
    ) -> Result<Option<Comm<C>>> {
        if color.is_some_and(|c| c > i32::MAX as u32) {
            return Err(Error::invalid(
                "color",
                "NCCL's colors are non-negative C ints (use None for no color)",
            ));
        }
        config.check_values()?;
        Ok(self
            .sole()?
            .split(color, key, config)?
            .map(Comm::from_backend))
    }

    /// Splits into the disjoint rank lists `groups` (collective, every rank passes the same
    /// lists): each list becomes a child ranked in its order; a rank in no list gets `None`.
    /// Ranks out of range or listed twice are `InvalidArgument`, before anything is called.
    pub fn split_groups(&self, groups: &[Vec<usize>]) -> Result<Option<Comm<C>>> {
        self.split_groups_with(groups, &CommConfig::default())
    }

    /// [`Comm::split_groups`] with the children's configuration.
    pub fn split_groups_with(
        &self,
        groups: &[Vec<usize>],
        config: &CommConfig,
    ) -> Result<Option<Comm<C>>> {
        let w = self.world_size();
        let mut seen = vec![false; w];
        let mut mine = None;
        for (g, ranks) in groups.iter().enumerate() {
            for (k, &r) in ranks.iter().enumerate() {
                if r >= w {
                    return Err(Error::invalid(
                        "groups",
                        format!("group {g} lists rank {r}, outside 0..{w}"),
                    ));
                }
                if std::mem::replace(&mut seen[r], true) {
                    return Err(Error::invalid(
                        "groups",
                        format!("rank {r} is listed twice (the groups must be disjoint)"),
                    ));
                }
                if r == self.rank() {
                    mine = Some((g, k));
                }
            }
        }
        let color = mine.map(|(g, _)| g as u32);
        let key = mine.map_or(0, |(_, k)| k as i32);
        if groups.len() > i32::MAX as usize || mine.is_some_and(|(_, k)| k > i32::MAX as usize) {
            return Err(Error::invalid(
                "groups",
                "more groups or ranks than a C int",
            ));
        }
        self.split_with(color, key, config)
    }

    /// The child of the one rank list `ranks` (collective over this communicator: ranks not
    /// in the list call it too and get `None`).
    pub fn split_ranks(&self, ranks: &[usize]) -> Result<Option<Comm<C>>> {
        self.split_groups(&[ranks.to_vec()])
    }

    /// A communicator of the ranks that are left after a failure: every rank of this one
    /// except `exclude` (which must not call it: they are gone), ranked in the order of
    /// their ranks here. Collective over the survivors, who must pass the same list.
    ///
    /// [`ShrinkMode::Default`] and [`ShrinkMode::Abort`] are `ncclCommShrink`'s modes (from
    /// NCCL 2.27): no work outstanding on this communicator, or work in flight aborted first
    /// (this communicator is then aborted, NCCL's rule after the abort mode, and must not be
    /// used again). Where the library has no `ncclCommShrink` (older NCCL, RCCL), where this
    /// communicator has already failed (a deadline passed and aborted it, or `abort` was
    /// called), and with [`ShrinkMode::Reform`], the survivors re-form instead: this
    /// communicator is aborted, the first survivor makes a fresh unique id and shares it
    /// over the job's rendezvous (ranks of a launched job) or in this process (a
    /// `local_comms` world), and the survivors create a new communicator among themselves.
    /// Re-forming a launched job needs its rendezvous address to be bindable by the first
    /// survivor (the original rank 0, or a rank on the same host).
    ///
    /// This communicator afterwards, one rule per mode for eager calls and for replays of
    /// graphs captured before: after [`ShrinkMode::Default`] it stays usable (the mock,
    /// which always re-forms, keeps it so too, as NCCL's in-place shrink does), so a
    /// collective that needs an excluded rank that is gone ends as any collective with a
    /// silent peer, `Timeout` at the deadline, and every call after that fails at once; after
    /// [`ShrinkMode::Abort`], [`ShrinkMode::Reform`] or a re-form where the library has no
    /// shrink, it was aborted: every later call is `Aborted` at once.
    pub fn shrink(&self, exclude: &[usize], mode: ShrinkMode) -> Result<Comm<C>> {
        self.shrink_with(exclude, mode, &CommConfig::default())
    }

    /// [`Comm::shrink`] with the new communicator's configuration.
    pub fn shrink_with(
        &self,
        exclude: &[usize],
        mode: ShrinkMode,
        config: &CommConfig,
    ) -> Result<Comm<C>> {
        let w = self.world_size();
        let mut gone = vec![false; w];
        for &r in exclude {
            if r >= w {
                return Err(Error::invalid(
                    "exclude",
                    format!("rank {r} is outside 0..{w}"),
                ));
            }
            if std::mem::replace(&mut gone[r], true) {
                return Err(Error::invalid(
                    "exclude",
                    format!("rank {r} is listed twice"),
                ));
            }
        }
        if gone[self.rank()] {
            return Err(Error::invalid(
                "exclude",
                format!(
                    "rank {} excludes itself: excluded ranks do not call shrink (NCCL's rule)",
                    self.rank()
                ),
            ));
        }
        config.check_values()?;
        let mut sorted = exclude.to_vec();
        sorted.sort_unstable();
        Ok(Comm::from_backend(self.raw.shrink(&sorted, mode, config)?))
    }

    /// An id for growing this world ([`Comm::grow`]), made on rank 0 and sent to the new
    /// ranks, which join with it (`init_grown` of the backend, `unicomm::init_grown`).
    /// NCCL's rules (`ncclCommGetUniqueId`, NCCL >= 2.29.2): one id at a time, each used by
    /// one grow.
    pub fn grow_id(&self) -> Result<[u8; 128]> {
        if self.rank() != 0 {
            return Err(Error::invalid(
                "comm",
                format!(
                    "rank {} made a grow id: rank 0 makes it (and passes it to grow; the other ranks pass none)",
                    self.rank()
                ),
            ));
        }
        self.raw.grow_id()
    }

    /// This rank's communicator in the world grown to `world` ranks (`ncclCommGrow`, NCCL >=
    /// 2.29.2): an engine adding replicas, the inverse of [`Comm::shrink`]. Every rank of
    /// this world calls it, rank 0 with the id it made ([`Comm::grow_id`]), the others with
    /// `None`; the new ranks, `world_size()..world`, join at the same time with that id.
    /// Ranks keep their numbers; this communicator stays usable and independent of the new
    /// one. `Unsupported` naming the release where the library predates it.
    pub fn grow(&self, world: usize, id: Option<&[u8; 128]>) -> Result<Comm<C>> {
        self.grow_with(world, id, &CommConfig::default())
    }

    /// [`Comm::grow`] with the new communicator's configuration.
    pub fn grow_with(
        &self,
        world: usize,
        id: Option<&[u8; 128]>,
        config: &CommConfig,
    ) -> Result<Comm<C>> {
        let (r, w) = (self.rank(), self.world_size());
        if world <= w {
            return Err(Error::invalid(
                "world",
                format!("a world of {w} grows to more ranks, not {world}"),
            ));
        }
        match (r, id) {
            (0, None) => {
                return Err(Error::invalid(
                    "id",
                    "rank 0 passes the id it made with grow_id (NCCL's root of the grow)",
                ))
            }
            (r, Some(_)) if r != 0 => {
                return Err(Error::invalid(
                    "id",
                    format!("rank {r} passed an id: only rank 0 does (NCCL's rule: the other existing ranks pass none)"),
                ))
            }
            _ => {}
        }
        config.check_values()?;
        Ok(Comm::from_backend(self.raw.grow(world, id, config)?))
    }
}
