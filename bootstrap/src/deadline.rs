//! One rendezvous' time as one value ([`Deadline`]), handed down its calls instead of a
//! positional `(start, deadline, timeout)`.

use std::time::{Duration, Instant};

/// When a rendezvous began (for its reports), when it must end, and the whole time it was
/// given (for its messages).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    /// When it began.
    pub start: Instant,
    /// When every wait of it ends.
    pub at: Instant,
    /// `at - start`, as the caller gave it.
    pub timeout: Duration,
}
