//! A communicator's teardown: the library calls that end it and its children, each given
//! the deadline on a thread of its own (NCCL's finalize waits for the peers, its abort for
//! every graph that captured the communicator's work).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use unicomm_core::{Error, Result};

use super::{End, LibComm, Owned};
use crate::sys::api::Api;
use crate::sys::calls::OwnedComm;
use crate::sys::runtime::Runtime;
use crate::wait::{bounded, settle_raw, Late};

/// How long an abort is waited for while a live graph holds the communicator (NCCL's abort
/// returns only once every graph that captured its work is destroyed: on 1x H200, NCCL
/// 2.32.3, 2 ranks in multi-rank mode, a peer SIGKILLed during the replays, waiting the
/// whole deadline for it doubled the survivor's time to its error, 40 s for a 20 s deadline).
/// The rest of the abort finishes when the last graph goes ([`LibComm::wait_late_end`]).
pub(crate) const ABORT_GRACE_UNDER_GRAPHS: Duration = Duration::from_secs(1);

impl<R: Runtime> LibComm<R> {
    /// The library calls of [`LibComm::destroy_locked`], on what the state held: the
    /// children first, then this communicator.
    pub(super) fn teardown(&self, owned: Owned, end: End) -> Result<()> {
        let api = self.api.clone();
        let all: Vec<OwnedComm> = owned.into_all();
        let timeout = self.timeout();
        // Calls with no deadline of their own, each given this communicator's on a thread of
        // its own: a blocking ncclCommFinalize waits for the peers (a dead peer: forever), and
        // ncclCommAbort returns only once every CUDA graph that captured the communicator's
        // work is destroyed (its teardown waits for the graphs' references to the
        // communicator: on 1x H200, NCCL 2.28.9, a peer SIGKILLed during a graph's replays,
        // the survivor's abort never returned while the graph lived; under live graphs the abort
        // is given ABORT_GRACE_UNDER_GRAPHS, not the deadline). Past the deadline the
        // communicator is left to that thread (the state says finalized or aborted already,
        // so nothing here touches it again), the caller gets `Timeout`, and the thread is
        // kept in `late_end` (`wait_late_end`: the graphs' end waits for it, so that a
        // process exiting next does not exit under the library's teardown).
        let unbounded: Option<(&str, EndOne)> = match end {
            End::Abort => Some((
                "ncclCommAbort (it returns once every CUDA graph that captured this communicator's work is destroyed)",
                |api, c| api.comm_abort(c),
            )),
            End::Finalize if !self.nonblocking => Some(("ncclCommFinalize", finalize_blocking)),
            End::Finalize => None,
        };
        if let Some((what, end_one)) = unbounded {
            let (rt, dev) = (self.rt.clone(), self.dev);
            let work = move || -> Result<()> {
                let all = all;
                rt.with_device(dev, || every(all.into_iter().map(|c| end_one(&api, c))))
            };
            let late = Arc::new(Late::default());
            let mark = late.clone();
            let bound = match end {
                End::Abort if self.graphs_held.load(Ordering::Acquire) => {
                    timeout.min(ABORT_GRACE_UNDER_GRAPHS)
                }
                _ => timeout,
            };
            let r = bounded(what, bound, work, move |_| mark.finish());
            // Given up at the deadline (not refused a thread): the call still runs.
            if let Err(Error::Timeout { .. }) = r {
                *self.late_end.lock().unwrap_or_else(|e| e.into_inner()) = Some(late);
            }
            return r?;
        }
        self.rt.with_device(self.dev, || {
            every(
                all.into_iter()
                    .map(|c| finalize_nonblocking(&api, c, timeout)),
            )
        })
    }
}

/// Runs every teardown (one failing must not leave the others' communicators alive) and
/// returns the first error.
fn every(results: impl Iterator<Item = Result<()>>) -> Result<()> {
    let mut first = Ok(());
    for r in results {
        if first.is_ok() {
            first = r;
        }
    }
    first
}

/// The library call that ends one communicator.
type EndOne = fn(&Api, OwnedComm) -> Result<()>;

/// `ncclCommFinalize` + `ncclCommDestroy` of a blocking communicator.
fn finalize_blocking(api: &Api, c: OwnedComm) -> Result<()> {
    api.comm_finalize(c.handle())?;
    api.comm_destroy(c)
}

/// `ncclCommFinalize` settled with the deadline, then `ncclCommDestroy`; a finalize that
/// cannot finish (a dead peer) ends in an abort.
fn finalize_nonblocking(api: &Api, c: OwnedComm, timeout: Duration) -> Result<()> {
    api.comm_finalize(c.handle())?;
    if let Err(e) = settle_raw(api, c.handle(), "ncclCommFinalize", timeout, &|| false) {
        let _ = api.comm_abort(c);
        return Err(e);
    }
    api.comm_destroy(c)
}
