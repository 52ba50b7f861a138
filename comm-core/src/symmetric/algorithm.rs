//! The algorithms of unicomm's own all-reduce over symmetric memory, and the settings of its
//! calls.

use crate::element::ReduceOp;

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

/// How a fused all-reduce + residual add + RMSNorm runs
/// ([`Comm::all_reduce_rms_norm`](crate::Comm::all_reduce_rms_norm)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RmsNormOptions {
    /// Added to the mean of squares: finite and non-negative (every rank the same).
    pub eps: f32,
    /// The all-reduce's algorithm (every rank the same).
    pub algorithm: SymmetricAlgorithm,
}

impl RmsNormOptions {
    /// `eps` over the all-reduce of `algorithm`.
    pub fn new(eps: f32, algorithm: SymmetricAlgorithm) -> Self {
        RmsNormOptions { eps, algorithm }
    }
}

/// How a symmetric all-reduce runs
/// ([`Comm::all_reduce_symmetric`](crate::Comm::all_reduce_symmetric)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymmetricOptions {
    /// Sum, max or min (every rank the same).
    pub op: ReduceOp,
    /// How the data moves (every rank the same).
    pub algorithm: SymmetricAlgorithm,
}

impl SymmetricOptions {
    /// `op` by `algorithm`.
    pub fn new(op: ReduceOp, algorithm: SymmetricAlgorithm) -> Self {
        SymmetricOptions { op, algorithm }
    }
}
