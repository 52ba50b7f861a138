//! One-sided operations (NCCL >= 2.29.2's `ncclPutSignal`, `ncclSignal`, `ncclWaitSignal`):
//! a rank writes into a peer's symmetric window without the peer posting a receive, and
//! signals order what the peer may read. As a backend receives them ([`OneSided`]); the
//! typed calls are [`Comm::put_signal`](crate::Comm::put_signal),
//! [`Comm::signal`](crate::Comm::signal) and [`Comm::wait_signal`](crate::Comm::wait_signal).

use crate::device::DeviceMemory;
use crate::op::Slice;
use crate::registry::{RawHandle, RegKind, Registry};
use crate::{DataType, Error, Result};

/// One entry of a wait (`ncclWaitSignalDesc_t`): `count` signals from `peer`. Every put of
/// `peer` to this rank and every bare signal counts one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SignalWait {
    /// The rank whose signals are waited for.
    pub peer: usize,
    /// How many (at least 1).
    pub count: u32,
}

impl SignalWait {
    /// `count` signals from `peer`.
    pub fn new(peer: usize, count: u32) -> Self {
        SignalWait { peer, count }
    }
}

/// A put: `count` elements of `dtype` from `src` (inside one of this communicator's
/// symmetric windows) into `peer`'s part of `window` at byte `offset`, then one signal to
/// `peer`.
#[derive(Debug)]
pub struct Put<'a, M> {
    /// What is written (this rank's memory, inside a window of the communicator).
    pub src: Slice<'a, M>,
    /// Elements.
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// The rank written to.
    pub peer: usize,
    /// The window written into (this rank's handle of it: a window is registered by every
    /// rank, and NCCL finds the peer's part from it).
    pub window: RawHandle,
    /// Where in the peer's part of the window, in bytes.
    pub offset: usize,
    /// This rank's part of the window, in bytes (every rank's is the same size).
    pub window_bytes: usize,
}

impl<M: DeviceMemory> Put<'_, M> {
    /// NCCL's rules for the source on this rank, asked of the backend's `registry`: it holds
    /// `count` elements and lies inside a symmetric window of the communicator (NCCL finds
    /// its window by address, `ncclDevrFindWindow`). Its bytes.
    pub fn checked_source(&self, registry: &Registry) -> Result<usize> {
        self.src.holds(self.count, self.dtype, "src")?;
        let bytes = self.count * self.dtype.size();
        let covering = registry.covering(self.src.address(), bytes)?;
        if !covering.is_some_and(RegKind::is_window) {
            return Err(Error::invalid(
                "src",
                "a put's source must lie inside a symmetric window of the communicator (NCCL's rule)",
            ));
        }
        Ok(bytes)
    }
}

impl<M> Clone for Put<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for Put<'_, M> {}

/// One one-sided operation, as a backend receives it.
#[derive(Debug)]
pub enum OneSided<'a, M> {
    /// `ncclPutSignal`.
    Put(Put<'a, M>),
    /// `ncclSignal` to the peer.
    Signal(usize),
    /// `ncclWaitSignal`: the stream waits until every entry's signals arrived.
    Wait(&'a [SignalWait]),
}

impl<M> Clone for OneSided<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for OneSided<'_, M> {}

impl<'a, M> OneSided<'a, M> {
    /// NCCL's name of the call.
    pub fn name(&self) -> &'static str {
        match self {
            OneSided::Put(_) => "PutSignal",
            OneSided::Signal(_) => "Signal",
            OneSided::Wait(_) => "WaitSignal",
        }
    }

    /// Checks the ranks named against `world` and what the put moves against its window
    /// (every backend checks this before anything is enqueued).
    pub fn check(&self, world: usize) -> Result<()> {
        let peer_in = |peer: usize, arg: &'static str| {
            if peer < world {
                Ok(())
            } else {
                Err(Error::invalid(
                    arg,
                    format!("rank {peer} is not in a world of {world} (peer < {world})"),
                ))
            }
        };
        match self {
            OneSided::Signal(peer) => peer_in(*peer, "peer"),
            OneSided::Wait(waits) => {
                if waits.is_empty() {
                    return Err(Error::invalid("waits", "a wait names at least one peer"));
                }
                for w in waits.iter() {
                    peer_in(w.peer, "waits")?;
                    if w.count == 0 || w.count > i32::MAX as u32 {
                        return Err(Error::invalid(
                            "waits",
                            format!(
                                "{} signals from rank {}: a wait counts 1..={} (ncclWaitSignalDesc_t's opCnt)",
                                w.count,
                                w.peer,
                                i32::MAX
                            ),
                        ));
                    }
                }
                Ok(())
            }
            OneSided::Put(p) => {
                peer_in(p.peer, "peer")?;
                let bytes = p
                    .count
                    .checked_mul(p.dtype.size())
                    .ok_or_else(|| Error::invalid("src", "count x element size overflows"))?;
                if p.src.bytes < bytes {
                    return Err(Error::invalid(
                        "src",
                        format!(
                            "{} bytes hold fewer than {} x {}",
                            p.src.bytes, p.count, p.dtype
                        ),
                    ));
                }
                if p.offset
                    .checked_add(bytes)
                    .is_none_or(|end| end > p.window_bytes)
                {
                    return Err(Error::invalid(
                        "offset",
                        format!(
                            "{bytes} bytes at byte {} of the peer's part of a {}-byte window",
                            p.offset, p.window_bytes
                        ),
                    ));
                }
                Ok(())
            }
        }
    }

    /// The same operation over another memory type (`None`: memory of another backend, an
    /// `InvalidArgument` error).
    pub fn map_mem<N>(self, f: impl Fn(&'a M) -> Option<&'a N>) -> Result<OneSided<'a, N>> {
        Ok(match self {
            OneSided::Signal(p) => OneSided::Signal(p),
            OneSided::Wait(w) => OneSided::Wait(w),
            OneSided::Put(p) => OneSided::Put(Put {
                src: p.src.map_mem(f, "src")?,
                count: p.count,
                dtype: p.dtype,
                peer: p.peer,
                window: p.window,
                offset: p.offset,
                window_bytes: p.window_bytes,
            }),
        })
    }
}
