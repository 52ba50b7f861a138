//! The mock's markers ([`MockMarker`]): a point a stream's worker reaches, recorded once
//! ([`DeviceStream::record`](unicomm_core::DeviceStream::record)), or, as a collective's
//! launch marker, armed again by each collective that carries it and reached when the
//! stream's worker begins that collective (host time: the mock's "device").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use unicomm_core::{Error, Marker, MarkerTime, Result};

/// Points armed and reached, and when the last was reached.
pub(crate) struct Mark {
    armed: AtomicU64,
    reached: AtomicU64,
    at: Mutex<Option<Instant>>,
}

impl Mark {
    /// A mark with `armed` points to reach (0: a launch marker no collective recorded yet,
    /// which waits pass at once, as a CUDA event never recorded).
    pub(crate) fn new(armed: u64) -> Arc<Mark> {
        Arc::new(Mark {
            armed: AtomicU64::new(armed),
            reached: AtomicU64::new(0),
            at: Mutex::new(None),
        })
    }

    /// One more point to reach: its number.
    pub(crate) fn arm(&self) -> u64 {
        self.armed.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The points armed so far (what a wait made now waits for).
    pub(crate) fn armed(&self) -> u64 {
        self.armed.load(Ordering::SeqCst)
    }

    /// Point `n` reached now.
    pub(crate) fn reach(&self, n: u64) {
        if let Ok(mut at) = self.at.lock() {
            *at = Some(Instant::now());
        }
        self.reached.fetch_max(n, Ordering::SeqCst);
    }

    /// Whether point `n` was reached.
    pub(crate) fn passed(&self, n: u64) -> bool {
        self.reached.load(Ordering::SeqCst) >= n
    }

    fn at(&self) -> Option<Instant> {
        self.at.lock().ok().and_then(|a| *a)
    }
}

/// A marker of the mock's streams.
pub(crate) struct MockMarker(pub(crate) Arc<Mark>);

impl MockMarker {
    /// The mark of `marker`, `InvalidArgument` for another backend's.
    pub(crate) fn of(marker: &Marker) -> Result<Arc<Mark>> {
        marker
            .inner()
            .as_any()
            .downcast_ref::<MockMarker>()
            .map(|m| m.0.clone())
            .ok_or_else(|| Error::invalid("marker", "a marker of another backend"))
    }
}

impl MarkerTime for MockMarker {
    fn ms_until(&self, later: &dyn MarkerTime) -> Result<f64> {
        let later = later
            .as_any()
            .downcast_ref::<MockMarker>()
            .ok_or_else(|| Error::invalid("marker", "a marker of another backend"))?;
        match (self.0.at(), later.0.at()) {
            (Some(a), Some(b)) => Ok(b.saturating_duration_since(a).as_secs_f64() * 1e3),
            _ => Err(Error::invalid(
                "marker",
                "not reached yet: synchronize the stream before reading the time",
            )),
        }
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn reached(&self) -> Option<bool> {
        Some(self.0.passed(self.0.armed()))
    }
}
