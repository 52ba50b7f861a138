//! Settings of a mock world: deadline, injected faults, rank count, and the environment
//! variables that set them.

use std::time::Duration;

use unicomm_core::{Error, Result};

/// How many ranks `cargo xtask run --vendor mock` and `unicomm::local_comms(Vendor::Mock)` use
/// when `UNICOMM_MOCK_RANKS` is unset.
pub const DEFAULT_RANKS: usize = 4;

/// The deadline of every wait when `UNICOMM_MOCK_TIMEOUT_MS` is unset.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// A fault to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The operation fails on this rank (an error at its next synchronize); peers time out.
    Fail,
    /// The rank never arrives at the operation; peers time out, and so does this rank once
    /// a peer's timeout poisons the communicator.
    Hang,
}

/// Injects `kind` into operation number `op` (counting from 0, every enqueued operation of
/// the rank) of rank `rank`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// The faulty rank.
    pub rank: usize,
    /// Index of the operation among the rank's enqueued operations.
    pub op: u64,
    /// What happens.
    pub kind: FaultKind,
}

/// Settings of a mock world.
#[derive(Debug, Clone)]
pub struct MockConfig {
    /// Deadline of every wait (peers arriving, buffers becoming free, a stream making
    /// progress).
    pub timeout: Duration,
    /// Faults to inject.
    pub faults: Vec<Fault>,
}

impl Default for MockConfig {
    /// `UNICOMM_MOCK_TIMEOUT_MS` or [`DEFAULT_TIMEOUT`]; no faults.
    fn default() -> Self {
        let timeout = std::env::var("UNICOMM_MOCK_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis)
            .unwrap_or(DEFAULT_TIMEOUT);
        MockConfig {
            timeout,
            faults: Vec::new(),
        }
    }
}

/// The number of ranks from `UNICOMM_MOCK_RANKS`, or [`DEFAULT_RANKS`].
pub fn ranks_from_env() -> Result<usize> {
    match std::env::var("UNICOMM_MOCK_RANKS") {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(Error::invalid(
                "UNICOMM_MOCK_RANKS",
                format!("{v:?} is not a positive integer"),
            )),
        },
        Err(_) => Ok(DEFAULT_RANKS),
    }
}
