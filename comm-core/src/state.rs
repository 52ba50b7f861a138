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

/// A [`Life`] that owns what lives with it: `T` (a library's communicator and the children
/// made from it) is held while live or suspended and gone once ended, so nothing ended can be
/// named. A communicator's lock guards one: the state and what it owns change together.
#[derive(Debug)]
pub enum Held<T> {
    /// Calls are taken.
    Live(T),
    /// Suspended: calls are refused until it is resumed; it can still be ended.
    Suspended(T),
    /// Ended by finalize.
    Finalized,
    /// Ended by an abort, or given up (what it owned left with whoever still uses it).
    Aborted,
}

impl<T> Held<T> {
    /// Its [`Life`].
    #[inline]
    pub fn life(&self) -> Life {
        match self {
            Held::Live(_) => Life::Live,
            Held::Suspended(_) => Life::Suspended,
            Held::Finalized => Life::Finalized,
            Held::Aborted => Life::Aborted,
        }
    }
    /// What it owns, while live.
    #[inline]
    pub fn live(&self) -> Option<&T> {
        match self {
            Held::Live(t) => Some(t),
            _ => None,
        }
    }
    /// What it owns, live or suspended (not ended).
    #[inline]
    pub fn not_ended(&self) -> Option<&T> {
        match self {
            Held::Live(t) | Held::Suspended(t) => Some(t),
            _ => None,
        }
    }
    /// Ends it (`to` finalized or aborted; any other is taken as aborted): what it owned,
    /// where it was not ended already.
    pub fn end(&mut self, to: Life) -> Option<T> {
        let next = match to {
            Life::Finalized => Held::Finalized,
            _ => Held::Aborted,
        };
        match std::mem::replace(self, next) {
            Held::Live(t) | Held::Suspended(t) => Some(t),
            ended => {
                *self = ended;
                None
            }
        }
    }
    /// Moves between live and suspended (`to` one of them); `false` (unchanged) where it
    /// was ended or `to` is an end.
    pub fn rest(&mut self, to: Life) -> bool {
        if !matches!(to, Life::Live | Life::Suspended) {
            return false;
        }
        let t = match std::mem::replace(self, Held::Aborted) {
            Held::Live(t) | Held::Suspended(t) => t,
            ended => {
                *self = ended;
                return false;
            }
        };
        *self = match to {
            Life::Live => Held::Live(t),
            _ => Held::Suspended(t),
        };
        true
    }
}

#[cfg(test)]
mod tests {
    use super::{Held, Life};

    #[test]
    fn an_ended_state_owns_nothing_and_stays_ended() {
        let mut h = Held::Live(7);
        assert!(h.rest(Life::Suspended));
        assert_eq!(
            (h.life(), h.live(), h.not_ended()),
            (Life::Suspended, None, Some(&7))
        );
        assert!(!h.rest(Life::Finalized), "an end is not a resting state");
        assert_eq!(h.not_ended(), Some(&7));
        assert_eq!(h.end(Life::Aborted), Some(7));
        assert_eq!(h.life(), Life::Aborted);
        // A second end takes nothing and does not turn an abort into a finalize.
        assert_eq!(h.end(Life::Finalized), None);
        assert_eq!(h.life(), Life::Aborted);
        assert!(!h.rest(Life::Live));
        assert_eq!(h.life(), Life::Aborted);
    }
}
