//! The one-sided operations on an NCCL-API communicator: checked as NCCL checks them (the
//! release, a put's source inside a window of the communicator, its destination a live
//! window it fits), then called with the window held live for the call.

use unicomm_core::one_sided::{OneSided, Put};
use unicomm_core::{Error, Result};

use super::ApiComm;
use crate::base::{foreign_stream, is_empty_handle};
use crate::memory::{ApiMemory, ApiStream};
use crate::sys::calls::StreamRef;
use crate::sys::runtime::Runtime;

impl<R: Runtime> ApiComm<R> {
    pub(super) fn one_sided_op(
        &self,
        op: OneSided<'_, ApiMemory<R>>,
        stream: &ApiStream<R>,
    ) -> Result<()> {
        let b = &self.base;
        if stream.dev != b.lc.dev {
            return Err(foreign_stream(stream.dev, b.lc.dev));
        }
        b.library.target.one_sided()?;
        op.check(b.lc.world)?;
        if b.lc.rt.capturing(stream.inner())? {
            b.library.target.one_sided_captured()?;
        }
        stream.watched_by(&b.lc);
        let st = stream.lend();
        let api = &b.lc.api;
        let r = match op {
            OneSided::Put(p) => self.put(&p, st),
            OneSided::Signal(peer) => b.lc.call_enqueue(None, |c| api.signal(peer, c, st)),
            OneSided::Wait(waits) => b.lc.call_enqueue(None, |c| api.wait_signal(waits, c, st)),
        };
        r.map_err(|e| self.host_rma_refusal(e))
    }

    fn put(&self, p: &Put<'_, ApiMemory<R>>, st: StreamRef<'_>) -> Result<()> {
        let b = &self.base;
        b.check_memory(p.src.mem)?;
        let bytes = p.checked_source(&b.registry)?;
        if is_empty_handle(p.window) {
            return Err(Error::invalid(
                "dst",
                "a window of no bytes receives no puts",
            ));
        }
        let src = unicomm_core::Slice { bytes, ..p.src };
        b.lc.call_enqueue(None, |c| {
            b.with_window(p.window, |win, size| {
                if p.offset.checked_add(bytes).is_none_or(|end| end > size) {
                    return Err(Error::invalid(
                        "offset",
                        format!("{bytes} bytes at byte {} of a {size}-byte window", p.offset),
                    ));
                }
                b.lc.api.put_signal(&src, p.peer, win, p.offset, c, st)
            })
        })
    }

    /// NCCL refuses a one-sided call on a communicator without host RMA support (symmetric
    /// memory and one NVLink domain, or its GIN proxy) as an invalid argument: named as the
    /// support it lacks where the communicator's properties say so.
    #[cold]
    fn host_rma_refusal(&self, e: Error) -> Error {
        use unicomm_core::Collective;
        let Error::Library { code: 4, .. } = e else {
            return e;
        };
        match self.properties() {
            Ok(p) if p.host_rma == Some(false) => Error::unsupported(
                "one-sided operations on this communicator",
                "NCCL's host RMA support (symmetric memory within one NVLink domain, or its GIN proxy)",
                format!("{e}"),
            ),
            _ => e,
        }
    }
}
