//! How a communicator is shrunk after a failure (see `Comm::shrink`).

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
