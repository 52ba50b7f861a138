//! Settings of a mock world: deadline, injected faults, rank count, and the environment
//! variables that set them.

use std::time::Duration;

use unicomm_core::Result;
pub use unicomm_nccl_api::Target;

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
    /// The library and device the mock stands for: what that target refuses (fp8
    /// reductions before NCCL 2.24.3, below sm90 and on RCCL; windows before NCCL 2.27; a
    /// configuration field the version predates; ...) the mock refuses too, with the NCCL-API
    /// backends' words. Default: the newest NCCL on sm90 ([`Target::default`]).
    pub target: Target,
}

impl Default for MockConfig {
    /// [`DEFAULT_TIMEOUT`], no faults (the environment is read by [`MockConfig::from_env`]).
    fn default() -> Self {
        MockConfig {
            timeout: DEFAULT_TIMEOUT,
            faults: Vec::new(),
            target: Target::default(),
        }
    }
}

/// The most ranks a mock world has (each rank runs its own stream threads).
pub const MAX_RANKS: usize = 1024;

/// The longest deadline the mock accepts: one day (so no `Instant` arithmetic overflows).
pub const MAX_TIMEOUT: Duration = unicomm_core::env::MAX_TIMEOUT;

impl MockConfig {
    /// The defaults, standing for `target` (a library version on a device, as
    /// [`Target::parse`] reads it: `nccl-2.32.3`, `nccl-2.28.9-sm80`, `rccl-2.22.3`).
    pub fn standing_for(target: &str) -> Result<Self> {
        Ok(MockConfig {
            target: Target::parse(target)?,
            ..MockConfig::default()
        })
    }

    /// The same, every wait ending at `timeout`.
    pub fn within(self, timeout: Duration) -> Self {
        MockConfig { timeout, ..self }
    }

    /// The defaults with `UNICOMM_MOCK_TIMEOUT_MS` applied (a whole number of milliseconds
    /// in 1..=86400000) and `UNICOMM_MOCK_TARGET` (`nccl-2.23.4`, `nccl-2.28.9-sm80`,
    /// `rccl-2.22.3`: [`Target::parse`]); anything else is `InvalidArgument` naming the
    /// variable and what it takes.
    pub fn from_env() -> Result<Self> {
        let mut c = MockConfig::default();
        c.timeout = unicomm_core::env::millis("UNICOMM_MOCK_TIMEOUT_MS", c.timeout)?;
        if let Some(t) = std::env::var_os("UNICOMM_MOCK_TARGET") {
            let t = t
                .to_str()
                .map(Target::parse)
                .unwrap_or_else(|| Target::parse("?"));
            c.target =
                t.map_err(|e| unicomm_core::Error::invalid("UNICOMM_MOCK_TARGET", e.to_string()))?;
        }
        Ok(c)
    }
}

impl MockConfig {
    /// What every way of making a mock world checks first: the deadline within 1 ms..=1 day
    /// (no `Instant` arithmetic overflows), and `UNICOMM_CHECK_COLLECTIVES` read as the GPU
    /// backends read it at creation (a malformed value is an error, not the check silently
    /// off).
    pub(crate) fn check(&self) -> Result<()> {
        unicomm_core::env::switch("UNICOMM_CHECK_COLLECTIVES", false)?;
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return Err(unicomm_core::Error::invalid(
                "timeout",
                format!("{:?} is outside 1 ms..=1 day", self.timeout),
            ));
        }
        Ok(())
    }
}

/// The number of ranks from `UNICOMM_MOCK_RANKS`, or [`DEFAULT_RANKS`].
pub fn ranks_from_env() -> Result<usize> {
    let n = unicomm_core::env::whole_number(
        "UNICOMM_MOCK_RANKS",
        DEFAULT_RANKS as u64,
        1..=MAX_RANKS as u64,
        "ranks",
    )?;
    Ok(n as usize)
}
