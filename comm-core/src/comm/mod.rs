//! [`Comm`]: one rank's communicator with typed collectives and the ownership rules of
//! registered memory. It validates what the caller controls (lengths, overflow, roots,
//! peers, memory of another device) and hands one [`Collective`] call to the backend.

mod collectives;
pub mod device_api;
pub mod fused;
mod groups;
mod one_sided;
mod register;
pub mod symmetric;
mod var;
pub use var::packed_displs;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::backend::{Capabilities, Collective};
use crate::buffer::{elem_bytes, Buffer, DeviceSlice, DeviceSliceMut, View, ViewMut};
use crate::call_options::{self, CallOptions};
use crate::element::Element;
use crate::op::Op;
use crate::work::Work;
use crate::{Error, Result};

static NEXT_COMM_ID: AtomicU64 = AtomicU64::new(1);

/// One rank's communicator over a backend `C`, with typed collectives and ownership rules
/// for registered memory.
///
/// `Comm` is `Sync` where its backend is (every backend here): any thread may call `abort`,
/// `poll_async_error` or `revoke` while another is in a collective. Collectives themselves
/// are the caller's to order: calls of one communicator from several threads at once pair
/// up across the ranks by arrival, not by program order (NCCL's rule: one thread at a time
/// per communicator), so rank 0's first call may meet rank 1's second. Memory stays safe;
/// the results do not. `UNICOMM_CHECK_COLLECTIVES=1` refuses a collective that overlaps
/// another of the same communicator on this rank (`InvalidArgument`).
pub struct Comm<C: Collective> {
    raw: C,
    id: u64,
    /// Calls in a collective right now (counted with `UNICOMM_CHECK_COLLECTIVES=1`).
    busy: AtomicU32,
    /// Live graphs that captured this communicator's work ([`crate::graph::Graph`]).
    graphs: AtomicU32,
    /// `UNICOMM_CHECK_COLLECTIVES=1`, read once per process: a field beside `raw`, so a
    /// call reads no other line for it.
    checked: bool,
    /// Scopes of per-call options open for this communicator ([`Comm::with_options`]), on
    /// any thread: a call looks for its thread's only while one is, so the common call
    /// reads this field and no global or thread-local.
    scoped: AtomicU32,
}

/// Whether collectives are checked (`UNICOMM_CHECK_COLLECTIVES=1`; a value that does not
/// parse is the backends' error at creation).
fn checking() -> bool {
    static CHECK: OnceLock<bool> = OnceLock::new();
    *CHECK.get_or_init(|| crate::env::switch("UNICOMM_CHECK_COLLECTIVES", false).unwrap_or(false))
}

/// The backend for one collective call; with the check on, the only one in progress on the
/// communicator while it lives.
pub(crate) struct Sole<'a, C> {
    raw: &'a C,
    busy: Option<&'a AtomicU32>,
    /// This thread's scope of options for the communicator ([`Comm::with_options`]).
    options: Option<Arc<CallOptions>>,
}

impl<C: Collective> Sole<'_, C> {
    /// The backend's `enqueue`, the call carrying the scope's options.
    #[inline]
    pub(crate) fn enqueue<'b>(
        &'b self,
        mut op: Op<'b, C::Memory>,
        stream: &C::Stream,
    ) -> Result<()> {
        if let Some(o) = &self.options {
            op.options = Some(o);
        }
        self.raw.enqueue(Work::Collective(&op), stream)
    }

    /// The backend's `enqueue` of work that is not a collective (it takes no call options).
    pub(crate) fn work(&self, work: Work<'_, C::Memory>, stream: &C::Stream) -> Result<()> {
        self.raw.enqueue(work, stream)
    }
}

impl<C> std::ops::Deref for Sole<'_, C> {
    type Target = C;
    fn deref(&self) -> &C {
        self.raw
    }
}

impl<C> Drop for Sole<'_, C> {
    fn drop(&mut self) {
        if let Some(b) = self.busy {
            b.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl<C: Collective> Comm<C> {
    /// This thread's options for this communicator, where a scope of them is open.
    #[inline]
    fn scoped_options(&self) -> Option<Arc<CallOptions>> {
        if self.scoped.load(Ordering::Relaxed) == 0 {
            return None;
        }
        call_options::current(self.id)
    }

    /// Whether this process checks collectives across ranks (`UNICOMM_CHECK_COLLECTIVES=1`):
    /// an integration with arguments of its own (a tensor's shape and type) compares those
    /// across the ranks too where it is set.
    pub fn checks_collectives(&self) -> bool {
        self.checked
    }

    /// Wraps a backend communicator.
    pub fn from_backend(raw: C) -> Self {
        Comm {
            raw,
            id: NEXT_COMM_ID.fetch_add(1, Ordering::Relaxed),
            busy: AtomicU32::new(0),
            graphs: AtomicU32::new(0),
            checked: checking(),
            scoped: AtomicU32::new(0),
        }
    }
    /// The backend for a collective call. Collectives of one communicator called from
    /// several threads at once pair up across the ranks by arrival, not by the program's
    /// order (NCCL's rule: one thread at a time per communicator); with
    /// `UNICOMM_CHECK_COLLECTIVES=1` a call that overlaps another is refused
    /// (`InvalidArgument`), where the overlap happens while this rank is in the call.
    #[inline]
    pub(crate) fn sole(&self) -> Result<Sole<'_, C>> {
        if !self.checked {
            return Ok(Sole {
                raw: &self.raw,
                busy: None,
                options: self.scoped_options(),
            });
        }
        if self.busy.fetch_add(1, Ordering::AcqRel) > 0 {
            self.busy.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::invalid(
                "comm",
                "another thread is in a collective of this communicator: calls from several threads at once pair up across the ranks by arrival, not in program order (one thread at a time per communicator, as NCCL requires)",
            ));
        }
        Ok(Sole {
            raw: &self.raw,
            busy: Some(&self.busy),
            options: self.scoped_options(),
        })
    }

    /// Runs `f` with `options` on every collective this thread calls on this communicator
    /// inside it (NCCL 2.32's per-collective configuration, `ncclCollConfig_t`): CTA counts
    /// and policy, the algorithms a call may use, a profiler tag. One scope for every
    /// collective, not a second method per collective; scopes nest (the innermost wins) and
    /// end with `f`, also by an unwind. Graphs captured inside keep the options in their
    /// replays. Every rank must run the same calls with the same options.
    ///
    /// The options are checked first (`InvalidArgument` naming the field); a call inside
    /// that cannot carry them is refused, not run without them: `Unsupported` naming the
    /// release on a library before NCCL 2.32 (RCCL has none), `InvalidArgument` for a call
    /// NCCL has no per-call options for (send, receive, the variable-size exchanges, a
    /// barrier) or one that takes unicomm's copy-engine path.
    pub fn with_options<R>(
        &self,
        options: &CallOptions,
        f: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        let _scope = call_options::Scope::open(self.id, &self.scoped, options)?;
        f()
    }

    /// The backend communicator.
    pub fn backend(&self) -> &C {
        &self.raw
    }
    /// This communicator's number in the process (in error messages about foreign
    /// registrations).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The live graphs ([`crate::graph::Graph`]) that captured this communicator's work.
    /// NCCL's and RCCL's abort of the communicator returns only once none is left: an abort
    /// given up at its deadline finishes when the last one is dropped.
    pub fn live_graphs(&self) -> usize {
        self.graphs.load(Ordering::Acquire) as usize
    }

    /// A graph that captured this communicator's work was made.
    pub(crate) fn graph_made(&self) {
        if self.graphs.fetch_add(1, Ordering::AcqRel) == 0 {
            self.raw.graphs_held();
        }
    }

    /// A graph that captured this communicator's work was destroyed: the last one tells the
    /// backend ([`Collective::graphs_released`]).
    pub(crate) fn graph_destroyed(&self) {
        if self.graphs.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.raw.graphs_released();
        }
    }

    /// This rank, `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.raw.rank()
    }
    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.raw.world_size()
    }
    /// What the loaded library can do, and its version.
    pub fn capabilities(&self) -> Capabilities {
        self.raw.capabilities()
    }
    /// A new stream on this rank's device.
    pub fn create_stream(&self) -> Result<C::Stream> {
        self.raw.create_stream()
    }
    /// A new stream on this rank's device with `priority`: a communication stream of
    /// [`StreamPriority::High`](crate::StreamPriority) keeps small collectives from waiting
    /// behind long compute kernels (CUDA and HIP stream priorities; accepted without effect
    /// on the mock).
    pub fn create_stream_with(&self, priority: crate::StreamPriority) -> Result<C::Stream> {
        self.raw.create_stream_with(priority)
    }

    /// Scratch memory of `len` elements for a capture's warm-up pass (allowed there, unlike
    /// the caller's own allocations).
    pub(crate) fn alloc_scratch<T: Element>(&self, len: usize) -> Result<Buffer<T, C>> {
        let mem = self.raw.alloc(elem_bytes::<T>(len, "len")?)?;
        Buffer::from_memory(mem, len)
    }

    /// Allocates `len` elements on this rank's device (`ncclMemAlloc` where the library has
    /// it, which NCCL recommends for registered buffers). The contents are unspecified.
    pub fn alloc<T: Element>(&self, len: usize) -> Result<Buffer<T, C>> {
        let bytes = elem_bytes::<T>(len, "len")?;
        crate::capturing::refuse_in_capture("alloc")?;
        let mem = self.raw.alloc(bytes)?;
        Buffer::from_memory(mem, len)
    }

    /// A buffer of `src.len()` elements holding `src`, copied after the work enqueued on
    /// `stream` (returns once `src` may be reused): [`Comm::alloc`] and
    /// [`Buffer::copy_from_host`] in one call.
    pub fn upload<T: Element>(&self, src: &[T], stream: &C::Stream) -> Result<Buffer<T, C>> {
        let mut b = self.alloc::<T>(src.len())?;
        b.copy_from_host(src, stream)?;
        Ok(b)
    }

    /// Copies `src` into `dst` (the same number of elements) on this rank's device, in
    /// stream order on `stream`; the host does not wait. Both are this rank's memory.
    pub fn copy<T: Element>(
        &self,
        src: &impl DeviceSlice<T, C>,
        dst: &mut impl DeviceSliceMut<T, C>,
        stream: &C::Stream,
    ) -> Result<()> {
        let (n, have) = (src.view().len, dst.view().len);
        if n != have {
            return Err(Error::invalid(
                "dst",
                format!("holds {have} elements, the source {n}"),
            ));
        }
        let (s, d) = self.views(src, dst, Ok)?;
        crate::buffer::copy_view(&d, &s, stream)
    }

    /// Device memory `(free, total)` bytes of this rank's device (GPU backends).
    pub fn device_memory(&self) -> Result<(usize, usize)> {
        self.raw.device_memory()
    }

    /// The device this rank drives: index, name, PCI bus id.
    pub fn device_info(&self) -> Result<crate::DeviceInfo> {
        self.raw.device_info()
    }

    /// Turns the copy-engine path for all-to-all, all-to-all-v and all-gather on or off (NCCL/RCCL with
    /// the ranks on one host: in this process, or one per process with exportable memory;
    /// [`Capabilities::copy_engine`]). Call it alike on every rank before registering the
    /// windows the outputs live in: their registration then shares them with the peers,
    /// collectively (a rank that did not turn it on would not join, and the others would
    /// wait until their deadline). Those outputs then move by copy engine (no SMs), ordered
    /// on the caller's stream by signals between the ranks (`UNICOMM_CE_SYNC=barrier`: two
    /// one-element all-reduces).
    pub fn set_copy_engine(&self, on: bool) -> Result<()> {
        self.raw.set_copy_engine(on)
    }

    /// A buffer of a call: this rank's memory, and not handed to a graph's capture except
    /// through its step (which borrows it for the graph's life).
    #[inline]
    pub(crate) fn check<T: Element>(&self, v: &View<'_, T, C>) -> Result<()> {
        direct_call()?;
        self.raw.check_memory(v.mem)
    }

    /// The views of an out-of-place operation, both checked to be this rank's memory, the
    /// output cut to `need(send.len())` elements (`InvalidArgument` when shorter).
    pub(crate) fn views<'a, T: Element>(
        &self,
        send: &'a impl DeviceSlice<T, C>,
        recv: &'a mut impl DeviceSliceMut<T, C>,
        need: impl FnOnce(usize) -> Result<usize>,
    ) -> Result<(View<'a, T, C>, View<'a, T, C>)> {
        let (s, r) = (send.view(), recv.view_mut().into_view());
        // [`Comm::check`] of both, the thread's state read once (measured: 45 more
        // instructions per call under callgrind when read for each buffer).
        direct_call()?;
        self.raw.check_memory(s.mem)?;
        self.raw.check_memory(r.mem)?;
        let n = need(s.len)?;
        if r.len < n {
            return Err(Error::invalid(
                "recv",
                format!("holds {} elements, the operation needs {n}", r.len),
            ));
        }
        Ok((s, r.slice(..n)?))
    }

    /// The view of an in-place operation, checked to be this rank's memory.
    pub(crate) fn view_mut_of<'a, T: Element>(
        &self,
        buf: &'a mut impl DeviceSliceMut<T, C>,
    ) -> Result<ViewMut<'a, T, C>> {
        let b = buf.view_mut();
        self.check(&b.as_view())?;
        Ok(b)
    }

    pub(crate) fn rank_arg(&self, r: usize, argument: &'static str) -> Result<()> {
        if r >= self.world_size() {
            return Err(Error::invalid(
                argument,
                format!("rank {r} is outside 0..{}", self.world_size()),
            ));
        }
        Ok(())
    }

    /// Runs `f` between `ncclGroupStart` and `ncclGroupEnd`; the group is closed even when
    /// `f` fails. Groups are per thread and may span several communicators of the backend
    /// (one thread driving every GPU).
    ///
    /// A panic inside `f` also closes the group (a guard ends it while unwinding), so a
    /// caller that catches the panic does not leave this thread's later calls deferred to a
    /// group that never ends.
    pub fn group<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        crate::backend::grouped(&self.raw, f)
    }

    /// Flushes pending work and destroys the communicator (`ncclCommFinalize` +
    /// `ncclCommDestroy`). Registrations borrow the communicator, so none can be alive here.
    pub fn finalize(mut self) -> Result<()> {
        self.raw.finalize()
    }

    /// Aborts the communicator (`ncclCommAbort`) without waiting for pending work. Callable
    /// from any thread, while other threads use it: this is what a rank that failed (or a
    /// watchdog) calls so that its peers get an error instead of waiting for it (on the
    /// mock at once; on NCCL/RCCL the peers must abort too, see the crate docs). Every
    /// later call on this communicator returns an error; registrations still alive are
    /// released when dropped.
    pub fn abort(&self) -> Result<()> {
        self.raw.abort()
    }

    /// Stops the operations in flight on this rank's communicator without destroying it
    /// (`ncclCommRevoke`, NCCL >= 2.28.7) and returns once it is quiescent; then
    /// [`Comm::shrink`] it with [`ShrinkMode::Default`](crate::ShrinkMode::Default), or finalize or abort it. Elsewhere
    /// `Unsupported` (abort, then shrink re-forms).
    pub fn revoke(&self) -> Result<()> {
        self.raw.revoke()
    }

    /// What the library says of this communicator: its device, whether NCCL's device API
    /// and multicast memory can be used on it (`ncclCommQueryProperties`, NCCL >= 2.29.2;
    /// `Unsupported` naming the release before it).
    pub fn properties(&self) -> Result<crate::state::Properties> {
        self.raw.properties()
    }

    /// An engine's sleep mode: frees the device memory the library holds for this
    /// communicator beyond what it cannot release (`ncclCommSuspend` with
    /// `NCCL_SUSPEND_MEM`, NCCL >= 2.29.7), until [`Comm::resume`]. Meanwhile every call on it
    /// but `resume`, `mem_stats`, `finalize` and `abort` is `InvalidArgument` naming the
    /// suspension (NCCL's rule: a suspended communicator is not used). Wait for the work
    /// enqueued on it first (its streams' `synchronize`).
    pub fn suspend(&self) -> Result<()> {
        self.raw.suspend()
    }

    /// Gets back what [`Comm::suspend`] freed; calls are accepted again.
    pub fn resume(&self) -> Result<()> {
        self.raw.resume()
    }

    /// The device memory the library holds for this communicator, and whether it is
    /// suspended (`ncclCommMemStats`, NCCL >= 2.29.7).
    pub fn mem_stats(&self) -> Result<crate::state::MemStats> {
        self.raw.mem_stats()
    }

    /// The flight recorder's state ([`crate::flight`]): this communicator's last operations
    /// as JSON, `None` where the backend keeps no recorder.
    pub fn flight_record(&self, reason: &str) -> Option<String> {
        self.raw.flight().map(|f| f.to_json(reason))
    }

    /// Writes the flight recorder's dump now (into `UNICOMM_FLIGHT_DIR`) and returns its path;
    /// `cargo xtask trace DIR` reads every rank's. The backends dump by themselves at a
    /// deadline, a disagreement, an asynchronous error or an abort.
    pub fn flight_dump(&self, reason: &str) -> Result<std::path::PathBuf> {
        match self.raw.flight() {
            Some(f) => f.dump(reason),
            None => Err(Error::unsupported(
                "a flight recorder",
                "the mock or an NCCL-API backend",
                self.raw.capabilities().backend,
            )),
        }
    }

    /// The communicator's first asynchronous error (`ncclCommGetAsyncError`): a failure of
    /// work already enqueued, such as a peer that died. `Ok` while nothing failed. After an
    /// error, [`Comm::abort`] it. The waits of the GPU backends poll this themselves (and
    /// abort); a watchdog thread of the caller can poll it too.
    pub fn poll_async_error(&self) -> Result<()> {
        self.raw.poll_async_error()
    }

    /// Sets the deadline of this rank's waits (1 ms..=1 day; default `UNICOMM_TIMEOUT_MS`,
    /// else 10 minutes): a `synchronize` or a copy to or from the host that waits longer
    /// aborts the communicator and returns `Timeout`. On the mock the deadline is
    /// `MockConfig::timeout` and this is `Unsupported`.
    pub fn set_timeout(&self, timeout: std::time::Duration) -> Result<()> {
        self.raw.set_timeout(timeout)
    }

    /// The deadline of this rank's waits.
    pub fn timeout(&self) -> Option<std::time::Duration> {
        self.raw.timeout()
    }

    pub(crate) fn times_world(&self, n: usize, argument: &'static str) -> Result<usize> {
        n.checked_mul(self.world_size()).ok_or_else(|| {
            Error::invalid(
                argument,
                format!("{n} x {} ranks overflows", self.world_size()),
            )
        })
    }

    pub(crate) fn per_rank(&self, total: usize, argument: &'static str) -> Result<usize> {
        let w = self.world_size();
        if !total.is_multiple_of(w) {
            return Err(Error::invalid(
                argument,
                format!("{total} elements do not split evenly over {w} ranks"),
            ));
        }
        Ok(total / w)
    }
}

/// `Ok` where this thread may call a collective or copy directly (not inside
/// `Graph::capture`'s closure outside one of its step's calls).
#[inline]
fn direct_call() -> Result<()> {
    if !crate::capturing::direct_call_allowed() {
        return Err(crate::capturing::direct_call_refused());
    }
    Ok(())
}

impl<C: Collective> std::fmt::Debug for Comm<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm")
            .field("id", &self.id)
            .field("rank", &self.rank())
            .field("world_size", &self.world_size())
            .finish()
    }
}
