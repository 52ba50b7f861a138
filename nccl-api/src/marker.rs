//! The NCCL-API backends' markers: a runtime's timing event ([`DeviceStream::record`]
//! (unicomm_core::DeviceStream::record)) or a launch event (a call's launch marker, whose
//! handle `ncclCollConfig_t` carries).

use std::sync::Arc;

use unicomm_core::{Error, Marker, MarkerTime, Result};

use crate::sys::runtime::Runtime;

/// A timing event of a NCCL-API backend's runtime, or a launch event (`launch`: its handle,
/// 0 for a timing event).
pub(crate) struct ApiMarker<R: Runtime> {
    pub(crate) ev: R::Event,
    pub(crate) rt: Arc<R>,
    pub(crate) launch: usize,
}

/// The handle of a launch marker of this runtime (what `ncclCollConfig_t` carries), valid
/// while the marker lives; `InvalidArgument` for another backend's.
pub(crate) fn launch_handle<R: Runtime>(m: &Marker) -> Result<usize> {
    match m.inner().as_any().downcast_ref::<ApiMarker<R>>() {
        Some(a) if a.launch != 0 => Ok(a.launch),
        _ => Err(Error::invalid(
            "options",
            "a launch marker of another backend or device runtime",
        )),
    }
}

impl<R: Runtime> MarkerTime for ApiMarker<R> {
    fn ms_until(&self, later: &dyn MarkerTime) -> Result<f64> {
        let later = later
            .as_any()
            .downcast_ref::<ApiMarker<R>>()
            .ok_or_else(|| Error::invalid("marker", "a marker of another backend"))?;
        self.rt.elapsed_ms(&self.ev, &later.ev)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn reached(&self) -> Option<bool> {
        self.rt.event_done(&self.ev)
    }
}
