//! A point in a stream's work ([`Marker`]) and what a backend's marker does.

use crate::Result;

/// A point in a stream's work, recorded by [`DeviceStream::record`](crate::DeviceStream::record); a GPU event, or on the
/// mock the instant its stream worker reached it.
pub struct Marker(Box<dyn MarkerTime>);

/// What a backend's marker does (implemented by each backend's event type).
pub trait MarkerTime: Send + Sync + 'static {
    /// Milliseconds from `self` to `later`, both of the same backend and stream; an error
    /// when either was not reached yet (synchronize the stream first) or they are of
    /// different kinds.
    fn ms_until(&self, later: &dyn MarkerTime) -> Result<f64>;
    /// For `ms_until` to recognise its own kind.
    fn as_any(&self) -> &dyn std::any::Any;
    /// Whether the stream has reached this point yet (`cudaEventQuery`), without waiting;
    /// `None` where the backend cannot tell.
    fn reached(&self) -> Option<bool> {
        None
    }
}

impl Marker {
    /// Wraps a backend's marker.
    pub fn new(m: impl MarkerTime) -> Self {
        Marker(Box::new(m))
    }
    /// Milliseconds from this marker to `later` (`cudaEventElapsedTime`).
    pub fn elapsed_ms(&self, later: &Marker) -> Result<f64> {
        self.0.ms_until(&*later.0)
    }
    /// The backend's marker.
    pub fn inner(&self) -> &dyn MarkerTime {
        &*self.0
    }
}
