//! [`Step`]: the collectives of [`Comm`] with their communicator and buffers borrowed for
//! the life of what the step makes (a captured graph, a completion handle), so that none of
//! them can be freed, deregistered or finalized while that lives.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;

use crate::backend::Collective;
use crate::buffer::{Buffer, DeviceSlice, DeviceSliceMut, View, ViewMut};
use crate::capturing::{Phase, StepCall};
use crate::comm::Comm;
use crate::counts::Counts;
use crate::element::{Element, ReduceOp};
use crate::one_sided::SignalWait;
use crate::registration::Window;
use crate::Result;

mod expert;
mod symmetric;

/// What a step's closure enqueues through ([`Graph::capture`](crate::graph::Graph::capture),
/// [`Completion::start`](crate::completion::Completion::start)): the collectives of
/// [`Comm`], each taking its communicator and buffers borrowed for `'a`, the life of the
/// graph or of the completion handle that the step makes.
pub struct Step<'a, C: Collective> {
    stream: &'a C::Stream,
    phase: Phase,
    comms: RefCell<Vec<&'a Comm<C>>>,
    /// The warm-up pass's scratch memory, kept until its work finished.
    scratch: RefCell<Vec<C::Memory>>,
    /// Every memory the step's work uses outlives that work whatever its owner does
    /// ([`DeviceMemory::outlives_its_work`](crate::DeviceMemory::outlives_its_work)).
    outlived: Cell<bool>,
}

/// An argument of a step's collective: the caller's memory, or a scratch buffer of the same
/// length in a capture's warm-up pass.
enum Arg<'a, T: Element, C: Collective> {
    Real(View<'a, T, C>),
    Scratch(Buffer<T, C>),
}

impl<'a, T: Element, C: Collective> Arg<'a, T, C> {
    fn view(&self) -> View<'_, T, C> {
        match self {
            Arg::Real(v) => v.view(),
            Arg::Scratch(b) => b.view(),
        }
    }
    /// The memory as a collective's output. The step borrows it shared for `'a`: the device
    /// writes it in stream order (at each replay, for a graph), as it writes an eager call's
    /// output after the call returned.
    fn out(&self) -> ViewMut<'_, T, C> {
        let v = self.view();
        ViewMut {
            mem: v.mem,
            offset: v.offset,
            len: v.len,
            _t: PhantomData,
        }
    }
}

impl<'a, C: Collective> Step<'a, C> {
    pub(crate) fn new(stream: &'a C::Stream, phase: Phase) -> Self {
        Step {
            stream,
            phase,
            comms: RefCell::new(Vec::new()),
            scratch: RefCell::new(Vec::new()),
            outlived: Cell::new(true),
        }
    }

    /// Whether every memory the step's work uses outlives that work (none is lent by an
    /// owner that could free it under the work).
    pub(crate) fn outlived(&self) -> bool {
        self.outlived.get()
    }

    /// The communicators the step used, in first use.
    pub(crate) fn into_comms(self) -> Vec<&'a Comm<C>> {
        self.comms.into_inner()
    }

    /// The warm-up pass's scratch memory, never freed: work that may still use it did not
    /// finish within its deadline.
    pub(crate) fn leak_scratch(self) {
        std::mem::forget(self.scratch.into_inner());
    }

    /// The stream the work is enqueued on (captured on, for a graph).
    pub fn stream(&self) -> &'a C::Stream {
        self.stream
    }

    /// Whether this is a capture's eager warm-up pass (scratch buffers).
    pub fn is_warm_up(&self) -> bool {
        self.phase == Phase::Warm
    }

    /// The communicator among those the step used.
    fn note_comm(&self, comm: &'a Comm<C>) {
        let mut cs = self.comms.borrow_mut();
        if !cs.iter().any(|c| std::ptr::eq(*c, comm)) {
            cs.push(comm);
        }
    }

    /// `v` used by the step's work on `comm`.
    fn used<T: Element>(&self, comm: &'a Comm<C>, v: &View<'_, T, C>) {
        if !crate::device::DeviceMemory::outlives_its_work(v.mem) {
            self.outlived.set(false);
        }
        self.note_comm(comm);
    }

    fn arg<T: Element>(&self, comm: &'a Comm<C>, v: View<'a, T, C>) -> Result<Arg<'a, T, C>> {
        self.used(comm, &v);
        match self.phase {
            // Nothing to stand in for an empty argument (no memory is touched).
            Phase::Warm if v.len > 0 => Ok(Arg::Scratch(comm.alloc_scratch(v.len)?)),
            _ => Ok(Arg::Real(v)),
        }
    }

    /// Keeps a warm-up argument's scratch memory until the pass's work finished.
    fn keep<T: Element>(&self, a: Arg<'a, T, C>) {
        if let Arg::Scratch(b) = a {
            self.scratch.borrow_mut().push(b.into_memory());
        }
    }

    /// A collective of one input and one output.
    fn two<T: Element>(
        &self,
        comm: &'a Comm<C>,
        a: View<'a, T, C>,
        b: View<'a, T, C>,
        call: impl FnOnce(&View<'_, T, C>, &mut ViewMut<'_, T, C>) -> Result<()>,
    ) -> Result<()> {
        let (a, b) = (self.arg(comm, a)?, self.arg(comm, b)?);
        let r = {
            let _call = StepCall::enter();
            call(&a.view(), &mut b.out())
        };
        self.keep(a);
        self.keep(b);
        r
    }

    /// A collective of one buffer (in place, or one side of a send or receive).
    fn one<T: Element>(
        &self,
        comm: &'a Comm<C>,
        a: View<'a, T, C>,
        call: impl FnOnce(&mut ViewMut<'_, T, C>) -> Result<()>,
    ) -> Result<()> {
        let a = self.arg(comm, a)?;
        let r = {
            let _call = StepCall::enter();
            call(&mut a.out())
        };
        self.keep(a);
        r
    }

    /// [`Comm::all_reduce`], through the step.
    pub fn all_reduce<T: Element>(
        &self,
        comm: &'a Comm<C>,
        send: &'a impl DeviceSlice<T, C>,
        recv: &'a impl DeviceSliceMut<T, C>,
        op: ReduceOp,
    ) -> Result<()> {
        self.two(comm, send.view(), recv.view(), |s, r| {
            comm.all_reduce(s, r, op, self.stream)
        })
    }

    /// [`Comm::all_reduce_in_place`], through the step.
    pub fn all_reduce_in_place<T: Element>(
        &self,
        comm: &'a Comm<C>,
        buf: &'a impl DeviceSliceMut<T, C>,
        op: ReduceOp,
    ) -> Result<()> {
        self.one(comm, buf.view(), |b| {
            comm.all_reduce_in_place(b, op, self.stream)
        })
    }

    /// [`Comm::broadcast`], through the step.
    pub fn broadcast<T: Element>(
        &self,
        comm: &'a Comm<C>,
        send: &'a impl DeviceSlice<T, C>,
        recv: &'a impl DeviceSliceMut<T, C>,
        root: usize,
    ) -> Result<()> {
        self.two(comm, send.view(), recv.view(), |s, r| {
            comm.broadcast(s, r, root, self.stream)
        })
    }

    /// [`Comm::reduce`], through the step.
    pub fn reduce<T: Element>(
        &self,
        comm: &'a Comm<C>,
        send: &'a impl DeviceSlice<T, C>,
        recv: &'a impl DeviceSliceMut<T, C>,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.two(comm, send.view(), recv.view(), |s, r| {
            comm.reduce(s, r, op, root, self.stream)
        })
    }

    /// [`Comm::all_gather`], through the step.
    pub fn all_gather<T: Element>(
        &self,
        comm: &'a Comm<C>,
        send: &'a impl DeviceSlice<T, C>,
        recv: &'a impl DeviceSliceMut<T, C>,
    ) -> Result<()> {
        self.two(comm, send.view(), recv.view(), |s, r| {
            comm.all_gather(s, r, self.stream)
        })
    }

    /// [`Comm::reduce_scatter`], through the step.
    pub fn reduce_scatter<T: Element>(
        &self,
        comm: &'a Comm<C>,
        send: &'a impl DeviceSlice<T, C>,
        recv: &'a impl DeviceSliceMut<T, C>,
        op: ReduceOp,
    ) -> Result<()> {
        self.two(comm, send.view(), recv.view(), |s, r| {
            comm.reduce_scatter(s, r, op, self.stream)
        })
    }

    /// [`Comm::all_to_all`], through the step.
    pub fn all_to_all<T: Element>(
        &self,
        comm: &'a Comm<C>,
        send: &'a impl DeviceSlice<T, C>,
        recv: &'a impl DeviceSliceMut<T, C>,
    ) -> Result<()> {
        self.two(comm, send.view(), recv.view(), |s, r| {
            comm.all_to_all(s, r, self.stream)
        })
    }

    /// [`Comm::broadcast_in_place`], through the step.
    pub fn broadcast_in_place<T: Element>(
        &self,
        comm: &'a Comm<C>,
        buf: &'a impl DeviceSliceMut<T, C>,
        root: usize,
    ) -> Result<()> {
        self.one(comm, buf.view(), |b| {
            comm.broadcast_in_place(b, root, self.stream)
        })
    }

    /// [`Comm::reduce_in_place`], through the step.
    pub fn reduce_in_place<T: Element>(
        &self,
        comm: &'a Comm<C>,
        buf: &'a impl DeviceSliceMut<T, C>,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.one(comm, buf.view(), |b| {
            comm.reduce_in_place(b, op, root, self.stream)
        })
    }

    /// [`Comm::all_gather_in_place`], through the step.
    pub fn all_gather_in_place<T: Element>(
        &self,
        comm: &'a Comm<C>,
        buf: &'a impl DeviceSliceMut<T, C>,
    ) -> Result<()> {
        self.one(comm, buf.view(), |b| {
            comm.all_gather_in_place(b, self.stream)
        })
    }

    /// [`Comm::reduce_scatter_in_place`], through the step.
    pub fn reduce_scatter_in_place<T: Element>(
        &self,
        comm: &'a Comm<C>,
        buf: &'a impl DeviceSliceMut<T, C>,
        op: ReduceOp,
    ) -> Result<()> {
        self.one(comm, buf.view(), |b| {
            comm.reduce_scatter_in_place(b, op, self.stream)
        })
    }

    /// [`Comm::gather`], through the step.
    pub fn gather<T: Element>(
        &self,
        comm: &'a Comm<C>,
        send: &'a impl DeviceSlice<T, C>,
        recv: &'a impl DeviceSliceMut<T, C>,
        root: usize,
    ) -> Result<()> {
        self.two(comm, send.view(), recv.view(), |s, r| {
            comm.gather(s, r, root, self.stream)
        })
    }

    /// [`Comm::scatter`], through the step.
    pub fn scatter<T: Element>(
        &self,
        comm: &'a Comm<C>,
        send: &'a impl DeviceSlice<T, C>,
        recv: &'a impl DeviceSliceMut<T, C>,
        root: usize,
    ) -> Result<()> {
        self.two(comm, send.view(), recv.view(), |s, r| {
            comm.scatter(s, r, root, self.stream)
        })
    }

    /// [`Comm::send`], through the step.
    pub fn send<T: Element>(
        &self,
        comm: &'a Comm<C>,
        buf: &'a impl DeviceSlice<T, C>,
        peer: usize,
    ) -> Result<()> {
        self.one(comm, buf.view(), |b| {
            comm.send(&b.as_view(), peer, self.stream)
        })
    }

    /// [`Comm::recv`], through the step.
    pub fn recv<T: Element>(
        &self,
        comm: &'a Comm<C>,
        buf: &'a impl DeviceSliceMut<T, C>,
        peer: usize,
    ) -> Result<()> {
        self.one(comm, buf.view(), |b| comm.recv(b, peer, self.stream))
    }

    /// [`Comm::group`]: the calls `f` makes through this capture, launched together.
    pub fn group(&self, comm: &'a Comm<C>, f: impl FnOnce() -> Result<()>) -> Result<()> {
        comm.group(f)
    }

    /// [`Comm::copy`] (device to device on this rank), through the step.
    pub fn copy<T: Element>(
        &self,
        comm: &'a Comm<C>,
        src: &'a impl DeviceSlice<T, C>,
        dst: &'a impl DeviceSliceMut<T, C>,
    ) -> Result<()> {
        self.two(comm, src.view(), dst.view(), |s, d| {
            comm.copy(s, d, self.stream)
        })
    }

    /// [`Comm::all_to_all_v`], through the step. The counts are read when the step is
    /// enqueued: a captured graph replays them as they were.
    pub fn all_to_all_v<T: Element>(
        &self,
        comm: &'a Comm<C>,
        send: &'a impl DeviceSlice<T, C>,
        send_counts: Counts<'_>,
        recv: &'a impl DeviceSliceMut<T, C>,
        recv_counts: Counts<'_>,
    ) -> Result<()> {
        self.two(comm, send.view(), recv.view(), |s, r| {
            comm.all_to_all_v(s, send_counts, r, recv_counts, self.stream)
        })
    }

    /// [`Comm::all_gather_v`], through the step (counts as in [`Step::all_to_all_v`]).
    pub fn all_gather_v<T: Element>(
        &self,
        comm: &'a Comm<C>,
        send: &'a impl DeviceSlice<T, C>,
        recv: &'a impl DeviceSliceMut<T, C>,
        recv_counts: Counts<'_>,
    ) -> Result<()> {
        self.two(comm, send.view(), recv.view(), |s, r| {
            comm.all_gather_v(s, r, recv_counts, self.stream)
        })
    }

    /// [`Comm::reduce_scatter_v`], through the step (counts as in [`Step::all_to_all_v`]).
    pub fn reduce_scatter_v<T: Element>(
        &self,
        comm: &'a Comm<C>,
        send: &'a impl DeviceSlice<T, C>,
        send_counts: Counts<'_>,
        recv: &'a impl DeviceSliceMut<T, C>,
        op: ReduceOp,
    ) -> Result<()> {
        self.two(comm, send.view(), recv.view(), |s, r| {
            comm.reduce_scatter_v(s, send_counts, r, op, self.stream)
        })
    }

    /// [`Comm::put_signal`], through the step: `src` and the window `dst` are borrowed for
    /// the graph's life, so neither is freed nor deregistered while a replay may write.
    /// Captured one-sided operations need NCCL >= 2.30.3 (its copy-engine path keeps
    /// signals of its own for graphs; 2.29's baked the host's count into the graph, so a
    /// replay's wait would not wait): `Unsupported` naming it below that.
    ///
    /// In a capture's warm-up pass the put is a bare [`Comm::signal`] to `peer`: it counts
    /// as the put's signal in the peers' warm-up waits and sets up the library's one-sided
    /// state outside the capture (NCCL allocates it at the first one-sided call, which a
    /// capture forbids), while no byte is written into a peer's window before the graph
    /// runs. A graph's signals count only in graphs' waits, and an eager call's only in
    /// eager waits (NCCL keeps them apart): every launch of a graph that puts to a peer is
    /// matched by a launch of the peer's graph that waits for it.
    pub fn put_signal<T: Element>(
        &self,
        comm: &'a Comm<C>,
        src: &'a impl DeviceSlice<T, C>,
        peer: usize,
        dst: &'a Window<'_, T, C>,
        at: usize,
    ) -> Result<()> {
        self.used(comm, &src.view());
        let _call = StepCall::enter();
        match self.phase {
            Phase::Warm => comm.signal(peer, self.stream),
            _ => comm.put_signal(src, peer, dst, at, self.stream),
        }
    }

    /// [`Comm::signal`], through the step (the rules of [`Step::put_signal`]).
    pub fn signal(&self, comm: &'a Comm<C>, peer: usize) -> Result<()> {
        self.note_comm(comm);
        let _call = StepCall::enter();
        comm.signal(peer, self.stream)
    }

    /// [`Comm::wait_signal`], through the step (the rules of [`Step::put_signal`]): a
    /// graph's wait counts the signals of the peers' graphs.
    pub fn wait_signal(&self, comm: &'a Comm<C>, waits: &[SignalWait]) -> Result<()> {
        self.note_comm(comm);
        let _call = StepCall::enter();
        comm.wait_signal(waits, self.stream)
    }
}
