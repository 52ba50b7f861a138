//! Graph capture tied to what a graph uses: [`Graph::capture`] records the collectives a
//! closure enqueues through a [`Capture`] into one graph of the stream's device work, and
//! [`Graph::launch`] replays it (a CUDA graph on NCCL, a HIP graph on RCCL, the mock's
//! recorded jobs). Decode steps run this way: a replayed collective costs the host one
//! launch instead of one library call each.
//!
//! The graph borrows every communicator and buffer the capture used, so none of them can
//! be finalized, dropped, deregistered or freed while it lives (a compile error, as
//! PyTorch refuses destroying a communicator a live graph uses at run time). Outputs are
//! borrowed shared: the graph writes them on the device at each launch, as an eager
//! collective writes its output after the call returned; read them in stream order.
//!
//! Rules the capture keeps for the user:
//! - **Warm-up first.** NCCL connects its peers lazily, at the first collective of each
//!   algorithm, and cannot do so inside a capture. [`Graph::capture`] runs the closure once
//!   eagerly on scratch buffers of the same sizes (the same algorithms, so the same
//!   connections), waits for it, then runs it again under capture with the real buffers.
//!   The closure runs twice: it must enqueue the same work each time.
//! - **No registration or allocation inside.** `ncclCommRegister`, window registration and
//!   `cudaMalloc` are illegal while a stream captures: [`Comm::register`] and its kinds and
//!   [`Comm::alloc`] called inside the closure are `InvalidArgument` naming the rule.
//! - **Replays are recorded.** Each launch records the graph's collectives in each
//!   communicator's flight recorder with the graph's id and the replay's number, and the
//!   launch stream's waits watch those communicators (their deadline, their errors).

use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::Collective;
use crate::buffer::{Buffer, DeviceSlice, DeviceSliceMut, View, ViewMut};
use crate::comm::Comm;
use crate::device::{DeviceGraph, DeviceStream};

use crate::capturing::{take_captured, Captured, Phase, PhaseGuard};
use crate::element::{Element, ReduceOp};
use crate::Result;

pub use crate::capturing::capturing;

static NEXT_GRAPH: AtomicU64 = AtomicU64::new(1);

/// What a capture's closure enqueues through: the collectives of [`Comm`], each taking its
/// communicator and buffers borrowed for `'a`, the graph's life.
pub struct Capture<'a, C: Collective> {
    stream: &'a C::Stream,
    phase: Phase,
    comms: RefCell<Vec<&'a Comm<C>>>,
    /// The warm-up pass's scratch memory, kept until its work finished.
    scratch: RefCell<Vec<C::Memory>>,
}

/// An argument of a captured collective: the caller's memory under capture, a scratch
/// buffer of the same length in the warm-up pass.
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
    /// The memory as a collective's output. The capture borrows it shared for the graph's
    /// life: the device writes it at each replay, as it writes an eager call's output after
    /// the call returned.
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

impl<'a, C: Collective> Capture<'a, C> {
    /// The stream the work is captured on (or, in the warm-up pass, run on).
    pub fn stream(&self) -> &'a C::Stream {
        self.stream
    }

    /// Whether this is the eager warm-up pass (scratch buffers) rather than the capture.
    pub fn is_warm_up(&self) -> bool {
        self.phase == Phase::Warm
    }

    fn arg<T: Element>(&self, comm: &'a Comm<C>, v: View<'a, T, C>) -> Result<Arg<'a, T, C>> {
        {
            let mut cs = self.comms.borrow_mut();
            if !cs.iter().any(|c| std::ptr::eq(*c, comm)) {
                cs.push(comm);
            }
        }
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
        (a, b): (View<'a, T, C>, View<'a, T, C>),
        call: impl FnOnce(&View<'_, T, C>, &mut ViewMut<'_, T, C>) -> Result<()>,
    ) -> Result<()> {
        let (a, b) = (self.arg(comm, a)?, self.arg(comm, b)?);
        let r = call(&a.view(), &mut b.out());
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
        let r = call(&mut a.out());
        self.keep(a);
        r
    }

    /// [`Comm::all_reduce`], captured.
    pub fn all_reduce<T: Element>(
        &self,
        comm: &'a Comm<C>,
        send: &'a impl DeviceSlice<T, C>,
        recv: &'a impl DeviceSliceMut<T, C>,
        op: ReduceOp,
    ) -> Result<()> {
        self.two(comm, (send.view(), recv.view()), |s, r| {
            comm.all_reduce(s, r, op, self.stream)
        })
    }

    /// [`Comm::all_reduce_in_place`], captured.
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

    /// [`Comm::broadcast`], captured.
    pub fn broadcast<T: Element>(
        &self,
        comm: &'a Comm<C>,
        send: &'a impl DeviceSlice<T, C>,
        recv: &'a impl DeviceSliceMut<T, C>,
        root: usize,
    ) -> Result<()> {
        self.two(comm, (send.view(), recv.view()), |s, r| {
            comm.broadcast(s, r, root, self.stream)
        })
    }

    /// [`Comm::reduce`], captured.
    pub fn reduce<T: Element>(
        &self,
        comm: &'a Comm<C>,
        send: &'a impl DeviceSlice<T, C>,
        recv: &'a impl DeviceSliceMut<T, C>,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.two(comm, (send.view(), recv.view()), |s, r| {
            comm.reduce(s, r, op, root, self.stream)
        })
    }

    /// [`Comm::all_gather`], captured.
    pub fn all_gather<T: Element>(
        &self,
        comm: &'a Comm<C>,
        send: &'a impl DeviceSlice<T, C>,
        recv: &'a impl DeviceSliceMut<T, C>,
    ) -> Result<()> {
        self.two(comm, (send.view(), recv.view()), |s, r| {
            comm.all_gather(s, r, self.stream)
        })
    }

    /// [`Comm::reduce_scatter`], captured.
    pub fn reduce_scatter<T: Element>(
        &self,
        comm: &'a Comm<C>,
        send: &'a impl DeviceSlice<T, C>,
        recv: &'a impl DeviceSliceMut<T, C>,
        op: ReduceOp,
    ) -> Result<()> {
        self.two(comm, (send.view(), recv.view()), |s, r| {
            comm.reduce_scatter(s, r, op, self.stream)
        })
    }

    /// [`Comm::all_to_all`], captured.
    pub fn all_to_all<T: Element>(
        &self,
        comm: &'a Comm<C>,
        send: &'a impl DeviceSlice<T, C>,
        recv: &'a impl DeviceSliceMut<T, C>,
    ) -> Result<()> {
        self.two(comm, (send.view(), recv.view()), |s, r| {
            comm.all_to_all(s, r, self.stream)
        })
    }

    /// [`Comm::send`], captured.
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

    /// [`Comm::recv`], captured.
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

    /// [`Comm::copy`] (device to device on this rank), captured.
    pub fn copy<T: Element>(
        &self,
        comm: &'a Comm<C>,
        src: &'a impl DeviceSlice<T, C>,
        dst: &'a impl DeviceSliceMut<T, C>,
    ) -> Result<()> {
        self.two(comm, (src.view(), dst.view()), |s, d| {
            comm.copy(s, d, self.stream)
        })
    }
}

/// A captured graph of collectives, ready to launch; it borrows every communicator and
/// buffer it uses for `'a` (see the [module](self) doc).
pub struct Graph<'a, C: Collective> {
    graph: <C::Stream as DeviceStream>::Graph,
    /// Each communicator the capture used, with the collectives it enqueued.
    comms: Vec<(&'a Comm<C>, Vec<Captured>)>,
    id: u64,
    replays: AtomicU64,
}

impl<'a, C: Collective> Graph<'a, C> {
    /// Captures what `f` enqueues through its [`Capture`] on `stream` into a graph: `f` runs
    /// once eagerly on scratch buffers (connecting and warming every path it takes; the
    /// stream is synchronized after it, within the communicators' deadlines), then once
    /// under capture on the real buffers. Every rank of each communicator must capture the
    /// same collectives in the same order, as it would call them.
    pub fn capture(
        stream: &'a C::Stream,
        mut f: impl FnMut(&Capture<'a, C>) -> Result<()>,
    ) -> Result<Self> {
        {
            let _warm = PhaseGuard::enter(Phase::Warm)?;
            let cap = Capture {
                stream,
                phase: Phase::Warm,
                comms: RefCell::new(Vec::new()),
                scratch: RefCell::new(Vec::new()),
            };
            let ran = f(&cap);
            if let Err(e) = stream.synchronize() {
                // Work that may still use the scratch memory: leaked, never freed under it.
                std::mem::forget(cap.scratch.into_inner());
                return Err(e);
            }
            ran?;
        }
        let cap = Capture {
            stream,
            phase: Phase::Capture,
            comms: RefCell::new(Vec::new()),
            scratch: RefCell::new(Vec::new()),
        };
        let phase = PhaseGuard::enter(Phase::Capture)?;
        stream.begin_capture()?;
        let ran = f(&cap);
        drop(phase);
        // The capture is ended whatever the closure did, so the stream is usable again.
        let graph = stream.end_capture();
        ran?;
        let graph = graph?;
        let captured = take_captured();
        let comms = cap
            .comms
            .into_inner()
            .into_iter()
            .map(|c| {
                let at = c
                    .backend()
                    .flight()
                    .map(|f| std::sync::Arc::as_ptr(f) as usize);
                let ops = captured
                    .iter()
                    .filter(|k| Some(k.recorder) == at)
                    .copied()
                    .collect();
                (c, ops)
            })
            .collect();
        Ok(Graph {
            graph,
            comms,
            id: NEXT_GRAPH.fetch_add(1, Ordering::Relaxed),
            replays: AtomicU64::new(0),
        })
    }

    /// Enqueues one replay of the graph on `stream` (a stream of the device it was captured
    /// on; the host does not wait). Recorded in each communicator's flight recorder, and
    /// `stream`'s waits watch the communicators from now on.
    pub fn launch(&self, stream: &C::Stream) -> Result<()> {
        for (c, _) in &self.comms {
            c.backend().graph_launched(stream);
        }
        self.graph.launch(stream)?;
        let replay = self.replays.fetch_add(1, Ordering::Relaxed);
        for (c, ops) in &self.comms {
            if let Some(f) = c.backend().flight() {
                for k in ops {
                    f.record_replay(k.what, k.path, (self.id, replay));
                }
            }
        }
        Ok(())
    }

    /// This graph's number in the process (as its flight records name it).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// How many times it was launched.
    pub fn replays(&self) -> u64 {
        self.replays.load(Ordering::Relaxed)
    }

    /// The collectives captured per communicator, as `(communicator id, count)`.
    pub fn collectives(&self) -> Vec<(u64, usize)> {
        self.comms
            .iter()
            .map(|(c, ops)| (c.id(), ops.len()))
            .collect()
    }
}
