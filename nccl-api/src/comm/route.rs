//! The one place that decides where a call goes ([`Route`]): the copy engines, the
//! automatic registrations' second communicator, or the plain path on this communicator.
//! Only the automatic policy chooses between paths for registered buffers; without it, the
//! copy engines take what they can where the path is switched on.

use unicomm_core::{Op, Result};

use crate::auto::Auto;
use crate::base::Base;
use crate::copy_engine::{CopyEngine, Plan};
use crate::memory::{ApiMemory, ApiStream};
use crate::policy::Path;
use crate::sys::api::NcclComm;
use crate::sys::runtime::Runtime;

/// Where a call goes.
pub(crate) enum Route {
    /// The library, on this communicator.
    Plain,
    /// The library, on the second communicator of automatic registrations.
    Second(NcclComm),
    /// The copy engines, by this plan.
    CopyEngine(Plan),
}

/// The routes as the ranks' comparison names them (`UNICOMM_CHECK_COLLECTIVES`), by
/// [`code`].
pub(crate) const NAMES: [&str; 4] = [
    "this communicator",
    "the second communicator",
    "the copy engines",
    "a refusal (the rank's own error)",
];

/// A route's number in [`NAMES`]; a refused call has one too, so that its rank still takes
/// part in the comparison and its peers do not wait.
pub(crate) fn code(route: &Result<Route>) -> u64 {
    match route {
        Ok(Route::Plain) => 0,
        Ok(Route::Second(_)) => 1,
        Ok(Route::CopyEngine(_)) => 2,
        Err(_) => 3,
    }
}

/// Where `op` goes: for buffers registered for the automatic policy, the path it picks for
/// this size (the copy engines where they can take it, else the registered path);
/// otherwise the copy engines where the path is on and the output is a shared window, else
/// the library on this communicator.
#[inline]
pub(crate) fn route<R: Runtime>(
    base: &Base<R>,
    ce: &CopyEngine<R>,
    auto: &Auto,
    op: &Op<'_, ApiMemory<R>>,
) -> Result<Route> {
    let second = || auto.second_comm().map_or(Route::Plain, Route::Second);
    Ok(match auto.path(base, op)? {
        Some(Path::CopyEngine) => match ce.plan(base, op, true)? {
            Some(plan) => Route::CopyEngine(plan),
            // Not possible here (a group, one rank per process): the registered path.
            None => second(),
        },
        Some(Path::Registered) => second(),
        Some(Path::Window) => Route::Plain,
        None => match ce.plan(base, op, false)? {
            Some(plan) => Route::CopyEngine(plan),
            None => Route::Plain,
        },
    })
}

/// Where an all-to-all-v goes before the library's own call or its lowering: the copy
/// engines where the path is on and every rank's output is a shared window (agreed by the
/// ranks, `copy_engine/var.rs`), else `None`. The automatic policy never picks it: the ranks'
/// sizes differ, and the layouts' exchange costs a round trip that only large calls repay.
#[inline]
pub(crate) fn route_v<R: Runtime>(
    base: &Base<R>,
    ce: &CopyEngine<R>,
    op: &Op<'_, ApiMemory<R>>,
    stream: &ApiStream<R>,
) -> Result<Option<Plan>> {
    ce.plan_v(base, op, stream)
}
