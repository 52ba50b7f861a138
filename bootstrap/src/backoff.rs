//! Retries that spread out: exponential backoff with full jitter (each wait uniform below a
//! bound that doubles up to a cap), so ranks refused or started together do not come back
//! together.

use std::time::Duration;

use super::auth::nonce;

/// The n-th wait is uniform in [0, min(cap, first x 2^n)).
pub(crate) struct Backoff {
    bound: Duration,
    cap: Duration,
    state: u64,
}

impl Backoff {
    pub(crate) fn new(first: Duration, cap: Duration) -> Backoff {
        // Seeded from the OS (each rank its own sequence); a fixed seed if it has none
        // (then the ranks' different start times still spread them).
        let seed = nonce().map_or(0x9e37_79b9_7f4a_7c15, |n| {
            u64::from_le_bytes([n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7]])
        });
        Backoff {
            bound: first.max(Duration::from_micros(1)),
            cap,
            state: seed | 1,
        }
    }

    /// The next wait.
    pub(crate) fn next(&mut self) -> Duration {
        // xorshift64: enough to spread retries, not a secret.
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        let bound = self.bound.as_nanos() as u64;
        self.bound = (self.bound * 2).min(self.cap);
        Duration::from_nanos(self.state % bound.max(1))
    }
}
