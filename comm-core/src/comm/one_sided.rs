//! One-sided operations, typed: a put into a peer's part of a symmetric window, a bare
//! signal, and a stream's wait for signals (NCCL >= 2.29.2). Checked here (ranks, the
//! window's communicator and bounds, this rank's memory) before anything is enqueued.

use super::Comm;
use crate::backend::Collective;
use crate::buffer::DeviceSlice;
use crate::element::Element;
use crate::one_sided::{OneSided, Put, SignalWait};
use crate::registration::Window;
use crate::{Error, Result};

impl<C: Collective> Comm<C> {
    /// Writes `src` into `peer`'s part of the symmetric window `dst`, from element `at`,
    /// then signals `peer` once (`ncclPutSignal`, NCCL >= 2.29.2): one-sided, `peer` posts no
    /// receive. `src` must lie inside a symmetric window of this communicator (NCCL's rule;
    /// `dst` itself, or another), `dst` must be a window of this communicator, and
    /// `at + src.len()` must fit the window (every rank's part is the same size).
    ///
    /// What `peer` may read: its part of `dst` holds the bytes once its
    /// [`Comm::wait_signal`] that counts this put's signal has returned on its stream, not
    /// before (earlier reads see the old bytes or the new, as NCCL says nothing of them).
    /// On this rank, `src` may be written again by work enqueued after the put on `stream`.
    /// A library before 2.29.2, or a communicator whose library offers no host one-sided
    /// operations (NCCL's `hostRmaSupport`: symmetric memory and one NVLink domain, or its
    /// GIN proxy), refuses it.
    pub fn put_signal<T: Element>(
        &self,
        src: &impl DeviceSlice<T, C>,
        peer: usize,
        dst: &Window<'_, T, C>,
        at: usize,
        stream: &C::Stream,
    ) -> Result<()> {
        if !std::ptr::eq(dst.comm, self) {
            return Err(Error::invalid(
                "dst",
                "a window of another communicator (a put names a window of its own)",
            ));
        }
        let s = src.view();
        self.check(&s)?;
        let size = std::mem::size_of::<T>();
        let offset = at
            .checked_mul(size)
            .ok_or_else(|| Error::invalid("at", "element offset x element size overflows"))?;
        let op = OneSided::Put(Put {
            src: s.raw(),
            count: s.len(),
            dtype: T::DTYPE,
            peer,
            window: dst.handle,
            offset,
            window_bytes: dst.len() * size,
        });
        op.check(self.world_size())?;
        self.sole()?.work((&op).into(), stream)
    }

    /// Signals `peer` once with no data (`ncclSignal`, NCCL >= 2.29.2): counted by `peer`'s
    /// [`Comm::wait_signal`] like a put's signal, after every put this rank enqueued to
    /// `peer` before it on `stream`.
    pub fn signal(&self, peer: usize, stream: &C::Stream) -> Result<()> {
        super::direct_call()?;
        let op = OneSided::Signal(peer);
        op.check(self.world_size())?;
        self.sole()?.work((&op).into(), stream)
    }

    /// Work enqueued on `stream` after this waits until, for every entry, `count` signals
    /// of its `peer` arrived (puts and bare signals alike), and the data of those puts is
    /// in this rank's part of their windows (`ncclWaitSignal`, NCCL >= 2.29.2). Signals are
    /// consumed: a second wait counts new ones. A peer that never signals ends the stream's
    /// work at the communicator's deadline, as a collective whose peer never joins.
    pub fn wait_signal(&self, waits: &[SignalWait], stream: &C::Stream) -> Result<()> {
        super::direct_call()?;
        let op = OneSided::Wait(waits);
        op.check(self.world_size())?;
        self.sole()?.work((&op).into(), stream)
    }
}
