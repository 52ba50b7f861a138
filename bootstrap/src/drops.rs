//! Rank 0's log of dropped connections: at most one line a second, a count and the last
//! reason, so that a storm of strangers or retries is a few lines, not one per connection.

use std::time::{Duration, Instant};

/// Dropped connections, logged at most once a second (a count and the last reason), so a
/// storm of strangers or retries is a few lines, not one per connection.
pub(crate) struct DropLog {
    addr: String,
    since: Instant,
    count: u64,
    last: String,
}

impl DropLog {
    pub(crate) fn new(addr: String) -> DropLog {
        DropLog {
            addr,
            since: Instant::now(),
            count: 0,
            last: String::new(),
        }
    }

    pub(crate) fn note(&mut self, why: String) {
        self.count += 1;
        self.last = why;
        if self.since.elapsed() >= Duration::from_secs(1) {
            self.flush();
        }
    }

    pub(crate) fn flush(&mut self) {
        if self.count > 0 {
            tracing::warn!(
                "unicomm rendezvous on {}: dropped {} connection(s) in {:.1?}; the last: {}",
                self.addr,
                self.count,
                self.since.elapsed(),
                self.last
            );
        }
        self.count = 0;
        self.since = Instant::now();
    }
}
