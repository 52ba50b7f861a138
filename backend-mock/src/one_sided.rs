//! One-sided operations on the mock (NCCL 2.29.2's `ncclPutSignal`, `ncclSignal`,
//! `ncclWaitSignal`), with NCCL's rules: the release the mock stands for, a put's source
//! inside a symmetric window, its destination a window of the communicator. A put's bytes
//! travel in its message and land in the peer's window when the peer's wait takes them:
//! never later than NCCL would show them, so a program that reads only after its wait (as
//! NCCL requires) sees the same bytes. Captured in a graph (NCCL >= 2.30.3) they are a
//! graph's: its signals count only in graphs' waits, as NCCL keeps them apart; NCCL's
//! acknowledgement (a graph's second put to a peer waits until the peer's graph took the
//! first's signal) is not modelled: the mock's puts never wait.

use unicomm_core::one_sided::OneSided;
use unicomm_core::{Collective, Error, Result};

use crate::comm::MockComm;
use crate::exec::{Span, Work};
use crate::memory::MockMemory;
use crate::stream::MockStream;

impl MockComm {
    /// One one-sided operation, checked as NCCL checks it, as one task of `stream`.
    pub(crate) fn one_sided_op(
        &self,
        op: OneSided<'_, MockMemory>,
        stream: &MockStream,
    ) -> Result<()> {
        self.live()?;
        self.check_stream(stream)?;
        self.ctx.target.one_sided()?;
        op.check(self.ctx.world)?;
        let graph = stream.inner.capturing();
        if graph {
            self.ctx.target.one_sided_captured()?;
        }
        let work = match op {
            OneSided::Signal(peer) => Work::Signal {
                put: None,
                peer,
                graph,
            },
            OneSided::Wait(waits) => Work::Wait {
                waits: waits.to_vec(),
                windows: self.windows.clone(),
                graph,
            },
            OneSided::Put(p) => {
                self.check_memory(p.src.mem)?;
                let bytes = p.checked_source(&self.registry)?;
                let ord = self
                    .windows
                    .ordinal(p.window)
                    .ok_or_else(|| Error::invalid("dst", "not a window of this communicator"))?;
                let span = Span {
                    alloc: p.src.mem.inner.clone(),
                    offset: p.src.offset,
                    write: false,
                };
                Work::Signal {
                    put: Some((span, bytes, (ord, p.offset))),
                    peer: p.peer,
                    graph,
                }
            }
        };
        self.enqueue_work(work, false, stream)
    }
}
