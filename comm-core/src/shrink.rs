//! How a communicator is shrunk after a failure (see `Comm::shrink`), and where its
//! survivors meet to re-form it ([`Rejoin`], implemented by the rendezvous and handed to a
//! backend from above, so the backends need no rendezvous of their own).

use std::sync::Arc;
use std::time::Duration;

use crate::Result;

/// The most unique ids one world's creation exchanges (NCCL's many-root creation takes one
/// per root): the rendezvous carries at most this many to each rank (32 KiB), and a backend
/// makes at most this many roots.
pub const MAX_IDS: usize = 256;

/// Where the ranks of a communicator meet to re-form it without it (after ranks are lost,
/// where the library has no `ncclCommShrink`): a 128-byte id from the first survivor to the
/// others, over a channel that does not need the failed communicator. `unicomm-bootstrap`'s
/// `Rejoin` is one (in this process, or over the job's rendezvous).
pub trait Rejoin: Send + Sync + std::fmt::Debug {
    /// Where the members of a communicator derived from this one meet: `step` names how (a
    /// split and its color, a shrink and its survivors), the same on every member; `ranks`
    /// the members, in this communicator's ranks (empty: not named).
    fn derived(&self, step: &[u8], ranks: &[usize]) -> Arc<dyn Rejoin>;

    /// The id every survivor gets (collective over `survivors`, in the new communicator's
    /// order): the first survivor calls `make`, the others receive it, within `timeout`.
    /// `round` numbers the re-formings of this communicator (the same on every survivor).
    fn exchange(
        &self,
        round: u64,
        survivors: &[usize],
        me: usize,
        make: &mut dyn FnMut() -> Result<[u8; 128]>,
        timeout: Duration,
    ) -> Result<[u8; 128]>;
}

/// How [`Comm::shrink`](crate::Comm::shrink) treats the communicator it shrinks (`NCCL_SHRINK_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShrinkMode {
    /// `NCCL_SHRINK_DEFAULT`: no operation is outstanding on the communicator; it stays
    /// usable (and is finalized when dropped).
    #[default]
    Default,
    /// `NCCL_SHRINK_ABORT`: operations in flight (waiting for the lost ranks) are aborted
    /// first; the communicator is aborted afterwards, not destroyed (NCCL's rule).
    Abort,
    /// Always re-form: the communicator is aborted and the survivors create a new one from
    /// a fresh unique id, as where the library has no `ncclCommShrink`.
    Reform,
}
