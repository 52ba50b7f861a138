//! The algorithms of unicomm's own all-reduce over symmetric memory.

/// How unicomm's own all-reduce moves the data over symmetric memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SymmetricAlgorithm {
    /// Every rank reads every peer's input and reduces it all: one barrier before (the
    /// inputs are ready) and one after (no rank reads an input any more). Latency-bound
    /// sizes.
    OneShot,
    /// Reduce-scatter by peer loads (rank `r` reduces chunk `r` of every input into its own
    /// input's chunk `r`), a barrier, then all-gather by peer loads: less traffic per rank
    /// for larger sizes. The input's chunks are overwritten by their sums.
    TwoShot,
    /// Every rank stores its input into each peer's slot of a workspace filled with a
    /// poison value (negative zero), and each reduces its slots once none holds the poison:
    /// no barrier (safe to replay from a graph back to back), three workspaces in turn. An
    /// input's negative zeros are sent as positive zeros. Float types only; the allocation
    /// must carry the workspace ([`Comm::alloc_symmetric_lamport`](crate::Comm::alloc_symmetric_lamport)).
    Lamport,
}

impl SymmetricAlgorithm {
    /// Its name, for logs and benchmark modes.
    pub fn name(self) -> &'static str {
        match self {
            SymmetricAlgorithm::OneShot => "one-shot",
            SymmetricAlgorithm::TwoShot => "two-shot",
            SymmetricAlgorithm::Lamport => "lamport",
        }
    }
}
