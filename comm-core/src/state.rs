//! What a communicator says of itself and of the device memory its library holds, and its
//! sleep mode: [`Properties`] (`ncclCommQueryProperties`, NCCL 2.29.2), [`MemStats`]
//! (`ncclCommMemStats`) and suspend/resume (`ncclCommSuspend`/`ncclCommResume`, NCCL
//! 2.29.7): an engine that sleeps frees the library's dynamic device memory and gets it back
//! without re-creating its communicators.

/// A communicator's properties as its library reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Properties {
    /// This rank.
    pub rank: usize,
    /// The number of ranks.
    pub world: usize,
    /// The device's ordinal (CUDA's or HIP's; the mock's rank-local device).
    pub device: usize,
    /// Whether NCCL's device API (symmetric memory, `ncclDevComm`) can be used on it.
    pub device_api: bool,
    /// Whether multicast memory (NVLink SHARP) can be used on it.
    pub multimem: bool,
    /// Whether one-sided operations from the host reach its peers (`ncclPutSignal`);
    /// `None` where the library reports it not (before NCCL 2.29.4).
    pub host_rma: Option<bool>,
    /// The teams of ranks that reach each other's memory by loads and stores (NVLink
    /// domains); `None` where the library reports it not (before NCCL 2.29.4).
    pub lsa_teams: Option<usize>,
}

/// Device memory a communicator's library holds, in bytes (`ncclCommMemStats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemStats {
    /// What [`Comm::suspend`](crate::Comm::suspend) frees.
    pub suspendable: u64,
    /// What stays while suspended.
    pub persistent: u64,
    /// All the device memory the library tracks for it.
    pub total: u64,
    /// Whether it is suspended now.
    pub suspended: bool,
}

/// The refusal of a call on a suspended communicator, one sentence for every backend.
#[cold]
pub fn suspended_error() -> crate::Error {
    crate::Error::invalid(
        "comm",
        "the communicator is suspended (Comm::suspend): resume it (Comm::resume) before calling it",
    )
}
