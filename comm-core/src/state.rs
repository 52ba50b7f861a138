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

/// Where a communicator is in its life: the one state machine of every backend. Calls are
/// taken while live; a suspended one refuses them until resumed, and can still be ended;
/// finalized and aborted are final.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Life {
    /// Calls are taken.
    Live,
    /// Ended by finalize (collective).
    Finalized,
    /// Ended by an abort (local).
    Aborted,
    /// Suspended (`ncclCommSuspend`): calls are refused until it is resumed.
    Suspended,
}

impl Life {
    const fn code(self) -> u8 {
        match self {
            Life::Live => 0,
            Life::Finalized => 1,
            Life::Aborted => 2,
            Life::Suspended => 3,
        }
    }
    const fn of(code: u8) -> Life {
        match code {
            0 => Life::Live,
            1 => Life::Finalized,
            2 => Life::Aborted,
            _ => Life::Suspended,
        }
    }

    /// Whether it was finalized or aborted.
    pub const fn ended(self) -> bool {
        matches!(self, Life::Finalized | Life::Aborted)
    }
}

/// A [`Life`] read and changed atomically: every call reads it without a lock (acquire),
/// changes publish what came before them (release).
#[derive(Debug)]
pub struct AtomicLife(std::sync::atomic::AtomicU8);

impl AtomicLife {
    /// Starting at `life`.
    pub const fn new(life: Life) -> Self {
        AtomicLife(std::sync::atomic::AtomicU8::new(life.code()))
    }
    /// Now.
    #[inline]
    pub fn load(&self) -> Life {
        Life::of(self.0.load(std::sync::atomic::Ordering::Acquire))
    }
    /// Becomes `life`.
    #[inline]
    pub fn store(&self, life: Life) {
        self.0
            .store(life.code(), std::sync::atomic::Ordering::Release)
    }
    /// Becomes `life`; what it was.
    pub fn swap(&self, life: Life) -> Life {
        Life::of(
            self.0
                .swap(life.code(), std::sync::atomic::Ordering::AcqRel),
        )
    }
    /// Becomes `new` where it is `current`: `Ok(current)`, or `Err(what it is)`.
    pub fn compare_exchange(&self, current: Life, new: Life) -> Result<Life, Life> {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        self.0
            .compare_exchange(current.code(), new.code(), AcqRel, Acquire)
            .map(Life::of)
            .map_err(Life::of)
    }
}
