//! The one place that decides where a call goes ([`decide`] returns a [`Route`]): this
//! communicator's library call, the registered path on the automatic registrations' second
//! communicator, the copy engines with their plan, or a lowering where the library has no
//! call of its own. The routes carry the automatic policy's words ([`Path`]); only the policy
//! chooses between paths for registered buffers; without it, the copy engines take what
//! they can where the path is switched on.

use unicomm_core::{Kind, Op, Result};

use crate::auto::Auto;
use crate::base::Base;
use crate::copy_engine::{CopyEngine, Plan};
use crate::memory::{ApiMemory, ApiStream};
use crate::policy::Path;
use crate::sys::api::NcclComm;
use crate::sys::runtime::Runtime;

/// Where a call goes.
pub(crate) enum Route {
    /// The library's call, on this communicator.
    Library,
    /// The automatic policy's registered path ([`Path::Registered`]): the library's call on
    /// the automatic registrations' second communicator.
    Registered(NcclComm),
    /// The copy engines, by this plan.
    CopyEngine(Plan),
    /// No call of the library's own: NCCL's documented composition (grouped send/recv,
    /// broadcasts, reduces), in one group of this communicator.
    Lowered,
}

/// The routes as the ranks' comparison and the flight recorder name them, by [`code`]:
/// the library's call on this communicator, the automatic policy's words for its paths
/// (also unicomm-bench's modes), a refusal (the rank's own error), and a lowering.
pub(crate) const NAMES: [&str; 5] = [
    "library",
    Path::Registered.name(),
    Path::CopyEngine.name(),
    "refused",
    "lowered",
];

/// A route's number in [`NAMES`]; a refused call has one too, so that its rank still takes
/// part in the comparison and its peers do not wait.
pub(crate) fn code(route: &Result<Route>) -> u64 {
    match route {
        Ok(Route::Library) => 0,
        Ok(Route::Registered(_)) => 1,
        Ok(Route::CopyEngine(_)) => 2,
        Err(_) => 3,
        Ok(Route::Lowered) => 4,
    }
}

/// Whether `kind` runs as a composition of other calls on this library.
#[inline]
fn lowered(api: &crate::sys::api::Api, kind: Kind) -> bool {
    match kind {
        Kind::Gather { .. } | Kind::Scatter { .. } => !api.native_gather_scatter(),
        Kind::AllToAllV => api.fns.all_to_allv.is_none(),
        Kind::AllGatherV | Kind::ReduceScatterV { .. } => true,
        _ => false,
    }
}

/// Where `op` goes, the whole decision:
/// 1. an all-to-all-v goes to the copy engines where the path is on and every rank's
///    output is a shared window (the ranks agree on it and on the layouts first,
///    `copy_engine/var.rs`; the automatic policy never picks it: the ranks' sizes differ);
/// 2. a collective the library has no call for is lowered;
/// 3. for buffers registered for the automatic policy, the path it picks for this size
///    (the copy engines where they can take it, else the registered path on the second
///    communicator); otherwise the copy engines where the path is on and the output is a
///    shared window; else the library's call on this communicator.
#[inline]
pub(crate) fn decide<R: Runtime>(
    base: &Base<R>,
    ce: &CopyEngine<R>,
    auto: &Auto,
    op: &Op<'_, ApiMemory<R>>,
    stream: &ApiStream<R>,
) -> Result<Route> {
    if let Some(plan) = ce.plan_v(base, op, stream)? {
        return Ok(Route::CopyEngine(plan));
    }
    if lowered(&base.lc.api, op.kind) {
        return Ok(Route::Lowered);
    }
    let registered = || auto.second_comm().map_or(Route::Library, Route::Registered);
    Ok(match auto.path(base, op)? {
        Some(Path::CopyEngine) => match ce.plan(base, op, true)? {
            Some(plan) => Route::CopyEngine(plan),
            // Not possible here (a group, one rank per process): the registered path.
            None => registered(),
        },
        Some(Path::Registered) => registered(),
        Some(Path::Window) => Route::Library,
        None => match ce.plan(base, op, false)? {
            Some(plan) => Route::CopyEngine(plan),
            None => Route::Library,
        },
    })
}
