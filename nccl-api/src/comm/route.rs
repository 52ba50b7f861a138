//! The one place that decides where a call goes ([`decide`] returns a [`Route`]): this
//! communicator's library call, the registered path on the automatic registrations' second
//! communicator, the copy engines with their plan, or a lowering where the library has no
//! call of its own. The routes carry the automatic policy's words ([`Path`]); only the policy
//! chooses between paths for registered buffers; without it, the copy engines take what
//! they can where the path is switched on.

use unicomm_core::{Kind, Op, ReduceOp, Result};

use crate::auto::Auto;
use crate::base::Base;
use crate::copy_engine::{CopyEngine, Plan};
use crate::libcomm::Child;
use crate::memory::{ApiMemory, ApiStream};
use crate::policy::Path;
use crate::sys::runtime::Runtime;

/// Where a call goes: the library's call (the common case, matched first by the caller)
/// or elsewhere.
pub(crate) enum Route {
    /// The library's call: on this communicator (`None`), or on the automatic
    /// registrations' second communicator (`Some`: the policy's registered path,
    /// [`Path::Registered`]).
    Library(Option<Child>),
    /// A path of unicomm's own.
    Elsewhere(Elsewhere),
}

/// The paths other than the library's call.
pub(crate) enum Elsewhere {
    /// The copy engines, by this plan (the ranks compare the call first).
    CopyEngine(Plan),
    /// An all-to-all-v by the copy engines, its plan agreed by the ranks while planned.
    CopyEngineV(Plan),
    /// No call of the library's own: NCCL's documented composition (grouped send/recv,
    /// broadcasts, reduces), in one group of this communicator.
    Lowered,
}

/// Whether `kind` runs as a composition of other calls on this library.
#[inline]
fn lowered(api: &crate::sys::api::Api, kind: Kind) -> bool {
    match kind {
        Kind::Gather { .. } | Kind::Scatter { .. } => !api.native_gather_scatter(),
        // NCCL before 2.28 has no all-to-all: one send and one receive per peer.
        Kind::AllToAll => api.all_to_all.is_none(),
        Kind::AllToAllV => api.fns.all_to_allv.is_none(),
        Kind::AllGatherV | Kind::ReduceScatterV { .. } => true,
        _ => false,
    }
}

/// Whether the library's own call of `op` refuses whatever [`Op::check`] would: a kind whose
/// call checks each side's range against the same extent (no root-only side, no per-rank
/// counts), no pre-multiplied sum (its scalar's type is `Op::check`'s), both sides present
/// and aligned to the element (what the call layer does not check).
#[inline]
fn checked_by_its_call<R: Runtime>(api: &crate::sys::api::Api, op: &Op<'_, ApiMemory<R>>) -> bool {
    let plain = |r: ReduceOp| !matches!(r, ReduceOp::PreMulSum(_));
    let kind = match op.kind {
        Kind::AllReduce { op } | Kind::ReduceScatter { op } => plain(op),
        Kind::AllGather => true,
        Kind::AllToAll => api.all_to_all.is_some(),
        _ => false,
    };
    let mask = op.dtype.size() - 1;
    let aligned = |s: &Option<unicomm_core::Slice<'_, ApiMemory<R>>>| {
        s.as_ref().is_some_and(|s| s.address() & mask == 0)
    };
    kind && aligned(&op.send) && aligned(&op.recv)
}

/// Where `op` goes, the whole decision (the operation checked against the world,
/// [`Op::check`], wherever unicomm plans or moves anything itself):
/// 0. the common call, a fixed-size collective of a kind the library has, both buffers
///    present and aligned, with neither the copy engines switched on nor an automatic
///    registration live, is the library's call at once: its call layer (`sys::calls`)
///    checks the ranges it hands the library (inside their allocations, holding what the
///    call reads and writes), as `Op::check` would (about 75 instructions of a call's 600
///    under callgrind, the largest single part of unicomm's cost);
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
    if checked_by_its_call(&base.lc.api, op) && !ce.enabled() && auto.idle() {
        return Ok(Route::Library(None));
    }
    op.check(base.lc.rank, base.lc.world)?;
    if let Some(plan) = ce.plan_v(base, op, stream)? {
        return Ok(Route::Elsewhere(Elsewhere::CopyEngineV(plan)));
    }
    if lowered(&base.lc.api, op.kind) {
        return Ok(Route::Elsewhere(Elsewhere::Lowered));
    }
    let copy_engine = |plan| Route::Elsewhere(Elsewhere::CopyEngine(plan));
    let registered = || Route::Library(auto.second_comm());
    Ok(match auto.path(base, op)? {
        Some(Path::CopyEngine) => match ce.plan(base, op, true)? {
            Some(plan) => copy_engine(plan),
            // Not possible here (a group, one rank per process): the registered path.
            None => registered(),
        },
        Some(Path::Registered) => registered(),
        Some(Path::Window) => Route::Library(None),
        None => match ce.plan(base, op, false)? {
            Some(plan) => copy_engine(plan),
            None => Route::Library(None),
        },
    })
}
