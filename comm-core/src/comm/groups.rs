//! Process groups: a communicator split into children (`ncclCommSplit`), by color and key or
//! by rank lists, as PyTorch's `new_group`/`split_group` make them.

use crate::backend::Collective;
use crate::{Comm, CommConfig, Error, Result};

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
        Ok(self.raw.split(color, key, config)?.map(Comm::from_backend))
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
}
