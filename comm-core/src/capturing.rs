//! This thread's place in a graph capture (eager, the warm-up pass, the capturing pass)
//! and the collectives the capturing pass enqueued: the state [`crate::graph`] sets and
//! the layers below it read (registration and allocation refuse, the flight recorder keeps
//! the captured collectives for the replays instead of recording calls).

use std::cell::{Cell, RefCell};

use crate::kind::What;
use crate::{Error, Result};

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Eager,
    /// The closure's eager pass on scratch buffers.
    Warm,
    /// The closure's pass under capture.
    Capture,
}

/// A collective as a capture saw it enqueued: for the flight recorder at each replay.
#[derive(Clone, Copy)]
pub(crate) struct Captured {
    /// The recorder's address (which communicator enqueued it).
    pub(crate) recorder: usize,
    pub(crate) what: What,
    pub(crate) path: &'static str,
}

thread_local! {
    static PHASE: Cell<Phase> = const { Cell::new(Phase::Eager) };
    /// Inside one of the [`Step`](crate::step::Step)'s calls (which borrows its buffers for
    /// the graph's life).
    static IN_STEP: Cell<bool> = const { Cell::new(false) };
    static CAPTURED: RefCell<Vec<Captured>> = const { RefCell::new(Vec::new()) };
}

/// Whether this thread is inside [`Graph::capture`](crate::graph::Graph::capture)'s capturing pass: backends leave out
/// the host-side exchanges (the ranks' agreement on a layout or a call) that the eager
/// warm-up pass of the same closure already made, since nothing may wait on the host while
/// a stream captures.
#[inline]
pub fn capturing() -> bool {
    PHASE.with(Cell::get) == Phase::Capture
}

/// `InvalidArgument` for `what` (registration, allocation) inside a capture's closure.
pub(crate) fn refuse_in_capture(what: &'static str) -> Result<()> {
    if PHASE.with(Cell::get) == Phase::Eager {
        return Ok(());
    }
    Err(Error::invalid(
        what,
        "called inside a graph capture: registering or allocating device memory while a stream captures is illegal in CUDA and HIP (and NCCL registers lazily on the device); register and allocate before Graph::capture",
    ))
}

/// Whether a collective or copy may be called on the communicator here: not inside a
/// capture's closure except through the closure's [`Step`](crate::step::Step) (`InvalidArgument`
/// otherwise, [`direct_call_refused`]): the
/// graph would replay it into buffers it does not borrow, which could be freed and reused
/// while the graph lives (a write into freed device memory at the next launch).
/// (A flag, not a `Result`: the check sits on every call's path, and a `Result` of the
/// crate's error is a 104-byte stack slot.)
#[inline]
pub(crate) fn direct_call_allowed() -> bool {
    PHASE.with(Cell::get) == Phase::Eager || IN_STEP.with(Cell::get)
}

/// The error where [`direct_call_allowed`] says no.
#[cold]
#[inline(never)]
pub(crate) fn direct_call_refused() -> Error {
    Error::invalid(
        "comm",
        "a collective or copy called on the communicator inside Graph::capture's closure: enqueue it through the closure's Step (`g.all_reduce(comm, ..)`), which borrows its buffers for the graph's life; a call made directly would be replayed into buffers that may be freed while the graph lives",
    )
}

/// Marks this thread as inside one of the step's calls for the guard's life.
pub(crate) struct StepCall(bool);

impl StepCall {
    pub(crate) fn enter() -> StepCall {
        StepCall(IN_STEP.with(|c| c.replace(true)))
    }
}

impl Drop for StepCall {
    fn drop(&mut self) {
        IN_STEP.with(|c| c.set(self.0));
    }
}

/// Called by a flight recorder for an operation enqueued while this thread captures:
/// kept for the graph's replays instead of recorded as a call. `false` when not capturing
/// (the common case, decided inline on every call's path).
#[inline]
pub(crate) fn note_captured(recorder: usize, what: What, path: &'static str) -> bool {
    if !capturing() {
        return false;
    }
    keep_captured(recorder, what, path);
    true
}

#[cold]
#[inline(never)]
fn keep_captured(recorder: usize, what: What, path: &'static str) {
    CAPTURED.with(|c| {
        c.borrow_mut().push(Captured {
            recorder,
            what,
            path,
        })
    });
}

/// Sets this thread's phase for the life of the guard (back to eager on drop, unwinding
/// included).
pub(crate) struct PhaseGuard;

impl PhaseGuard {
    pub(crate) fn enter(p: Phase) -> Result<PhaseGuard> {
        if PHASE.with(Cell::get) != Phase::Eager {
            return Err(Error::invalid(
                "capture",
                "a graph capture inside another on the same thread",
            ));
        }
        PHASE.with(|c| c.set(p));
        if p == Phase::Capture {
            CAPTURED.with(|c| c.borrow_mut().clear());
        }
        Ok(PhaseGuard)
    }
}

impl Drop for PhaseGuard {
    fn drop(&mut self) {
        PHASE.with(|c| c.set(Phase::Eager));
    }
}

/// The collectives the capturing pass of this thread enqueued, taken.
pub(crate) fn take_captured() -> Vec<Captured> {
    CAPTURED.with(|c| std::mem::take(&mut *c.borrow_mut()))
}
