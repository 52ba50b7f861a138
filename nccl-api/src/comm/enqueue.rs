//! How [`ApiComm`] enqueues one operation: the route taken, the library's call or the
//! path that runs it instead, and the refusals of lent buffers in a capture.

use std::sync::Arc;

use unicomm_core::backend::grouped;
use unicomm_core::{Error, Op, Result, Zeros};

use super::route::{self, Elsewhere, Route};
use super::ApiComm;
use crate::memory::{ApiMemory, ApiStream};
use crate::policy::Taken;
use crate::sys::runtime::Runtime;

impl<R: Runtime> ApiComm<R> {
    /// One operation, recorded once by the caller (a lowered one's parts are not recorded
    /// again); the path it took, by name. The common call (the library's) runs straight
    /// through here; the paths of unicomm's own and a refusal are out of line.
    #[inline]
    pub(super) fn enqueue_op(
        &self,
        op: &Op<'_, ApiMemory<R>>,
        stream: &ApiStream<R>,
    ) -> Result<&'static str> {
        let b = &self.base;
        if stream.dev != b.lc.dev {
            return Err(crate::base::foreign_stream(stream.dev, b.lc.dev));
        }
        let route = route::decide(b, &self.ce, &self.auto, op, stream);
        if op.options.is_some() {
            options_route(b, op, &route, stream)?;
        }
        // The one match on the route.
        let child = match route {
            Ok(Route::Library(child)) => child,
            Ok(Route::Elsewhere(path)) => return self.elsewhere(path, op, stream),
            Err(e) => return self.refused(e, op, stream),
        };
        let taken = match child {
            None => Taken::Library,
            Some(_) => Taken::Registered,
        };
        self.compared(op, taken, stream)?;
        // One call site of the library's path, so that it is inlined here.
        b.library
            .enqueue(&b.lc, &b.registry, child, op, stream.lend())
            .map(|()| taken.name())
    }

    /// What every call does before it runs, refused ones too: the layouts of a
    /// variable-size exchange agreed (not for a refused call), the stream watched, and
    /// (with `UNICOMM_CHECK_COLLECTIVES=1`) the call and the path it takes compared across
    /// ranks.
    #[inline]
    fn compared(
        &self,
        op: &Op<'_, ApiMemory<R>>,
        taken: Taken,
        stream: &ApiStream<R>,
    ) -> Result<()> {
        let b = &self.base;
        if op.kind.is_var() && taken != Taken::Refused {
            b.agree.check_layout(&b.lc, op, stream)?;
        }
        stream.watched_by(&b.lc);
        b.agree
            .check_collective(&b.lc, op, || (taken.code(), &Taken::NAMES[..]), stream)
    }

    /// A call the route refused: with `UNICOMM_CHECK_COLLECTIVES=1` the rank still takes
    /// part in the ranks' comparison (as refused), so that its peers do not wait; the
    /// route's error is the call's.
    #[cold]
    #[inline(never)]
    fn refused(
        &self,
        e: unicomm_core::Error,
        op: &Op<'_, ApiMemory<R>>,
        stream: &ApiStream<R>,
    ) -> Result<&'static str> {
        // The route's error comes first; the comparison's, if any, is the peers' to see.
        let _ = self.compared(op, Taken::Refused, stream);
        Err(e)
    }

    /// The paths of unicomm's own: the copy engines (compared across ranks first, as the
    /// library's call is), an all-to-all-v by them (agreed while planned) and a lowering.
    #[inline(never)]
    fn elsewhere(
        &self,
        path: Elsewhere,
        op: &Op<'_, ApiMemory<R>>,
        stream: &ApiStream<R>,
    ) -> Result<&'static str> {
        match path {
            Elsewhere::CopyEngine(plan) => {
                self.compared(op, Taken::CopyEngine, stream)?;
                self.ce
                    .run(&self.base, plan, &stream.s)
                    .map(|()| Taken::CopyEngine.name())
            }
            Elsewhere::CopyEngineV(plan) => self.copy_engine_v(plan, stream),
            Elsewhere::Lowered => self.lowered(op, stream),
        }
    }

    /// An all-to-all-v by copy engine, its plan agreed by the ranks.
    #[inline(never)]
    fn copy_engine_v(
        &self,
        plan: crate::copy_engine::Plan,
        stream: &ApiStream<R>,
    ) -> Result<&'static str> {
        stream.watched_by(&self.base.lc);
        self.ce
            .run(&self.base, plan, &stream.s)
            .map(|()| Taken::CopyEngine.name())
    }

    /// A collective the library has no call for: its parts (empty ones left out), in one
    /// group of this communicator.
    #[inline(never)]
    fn lowered(&self, op: &Op<'_, ApiMemory<R>>, stream: &ApiStream<R>) -> Result<&'static str> {
        let b = &self.base;
        b.agree.check_layout(&b.lc, op, stream)?;
        let ops = op.lower(b.lc.rank, b.lc.world, Zeros::Skip)?;
        grouped(self, || {
            ops.into_iter()
                .try_for_each(|o| self.enqueue_op(&o, stream).map(drop))
        })
        .map(|()| Taken::Lowered.name())
    }
}

/// A call with per-call options: refused where they would not reach NCCL's kernels (a
/// kind NCCL has no `nccl*Config` for, a release before it, unicomm's copy-engine path),
/// never run without them.
#[cold]
#[inline(never)]
fn options_route<R: Runtime>(
    b: &crate::base::Base<R>,
    op: &Op<'_, ApiMemory<R>>,
    route: &Result<Route>,
    stream: &ApiStream<R>,
) -> Result<()> {
    b.library.target.call_options(op.kind)?;
    if op
        .options
        .as_ref()
        .is_some_and(|o| o.launch_marker.is_some())
        && (crate::group::in_group() || b.lc.rt.capturing(stream.inner())?)
    {
        return Err(unicomm_core::LaunchMarker::refused_here());
    }
    if let Ok(Route::Elsewhere(Elsewhere::CopyEngine(_) | Elsewhere::CopyEngineV(_))) = route {
        return Err(Error::invalid(
            "options",
            format!(
                "per-call options configure NCCL's kernels, and this {} takes unicomm's copy-engine path (set_copy_engine(false) around it, or no options)",
                op.name()
            ),
        ));
    }
    Ok(())
}

/// Whether a side of `op` is memory lent from a stream other than `stream` (a cudarc slice
/// used on another stream): two loads where nothing is lent.
#[inline]
pub(super) fn lent_elsewhere<R: Runtime>(op: &Op<'_, ApiMemory<R>>, stream: &ApiStream<R>) -> bool {
    let foreign = |s: &Option<unicomm_core::Slice<'_, ApiMemory<R>>>| {
        s.as_ref()
            .and_then(|s| s.mem.home.as_ref())
            .is_some_and(|h| R::raw_stream(h) != R::raw_stream(&stream.s))
    };
    foreign(&op.send) || foreign(&op.recv)
}

/// Lent memory is captured only on its lender's stream: a replay on another stream could
/// outlive the lender's stream-ordered free once the graph is leaked, and a capture cannot
/// order a stream outside it.
#[cold]
#[inline(never)]
pub(super) fn refuse_lent_capture<R: Runtime>(op: &Op<'_, ApiMemory<R>>) -> Result<()> {
    if !unicomm_core::graph::capturing() {
        return Ok(());
    }
    Err(Error::invalid(
        "stream",
        format!(
            "a {} captured on a stream other than the one its lent memory belongs to (a cudarc slice's stream): capture it on that stream (stream_from_cudarc(slice.stream()))",
            op.name()
        ),
    ))
}

/// Makes each lent side's home stream wait for the collective just enqueued on `stream`,
/// so the lender's stream-ordered free follows it whatever the caller leaks.
#[cold]
#[inline(never)]
pub(super) fn order_homes<R: Runtime>(
    rt: &Arc<R>,
    op: &Op<'_, ApiMemory<R>>,
    stream: &ApiStream<R>,
) -> Result<()> {
    let done = rt.record(&stream.s)?;
    let mut waited = None;
    for side in [&op.send, &op.recv].into_iter().flatten() {
        if let Some(home) = side.mem.home.as_ref() {
            let raw = R::raw_stream(home);
            // In place, both sides are one lender's: one wait.
            if raw != R::raw_stream(&stream.s) && waited != Some(raw) {
                rt.wait_event(side.mem.dev, home, &done)?;
                waited = Some(raw);
            }
        }
    }
    Ok(())
}
