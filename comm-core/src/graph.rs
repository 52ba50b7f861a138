//! Graph capture tied to what a graph uses: [`Graph::capture`] records the collectives a
//! closure enqueues through a [`Step`] into one graph of the stream's device work, and
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
//! - **Through the step only.** A collective or copy called on the communicator itself
//!   inside the closure (not through the [`Step`]) would be captured into buffers the
//!   graph does not borrow: it is `InvalidArgument` naming the step.
//! - **Replays are recorded.** Each launch records the graph's collectives in each
//!   communicator's flight recorder with the graph's id and the replay's number, and the
//!   launch stream's waits watch those communicators (their deadline, their errors).
//! - **An abort waits for the graphs.** NCCL's (and RCCL's) abort of a communicator returns
//!   only once every graph that captured its work is destroyed, so after a peer is lost
//!   during replays the survivors' waits end in `Timeout` with the abort given up; dropping
//!   the communicator's last graph ([`Comm::live_graphs`] counts them) lets the abort finish
//!   and waits for it, at most the deadline. Drop them before the process exits.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::Collective;
use crate::comm::Comm;
use crate::device::{DeviceGraph, DeviceStream};
use crate::step::Step;

use crate::capturing::{take_captured, Captured, Phase, PhaseGuard};
use crate::Result;

pub use crate::capturing::capturing;

static NEXT_GRAPH: AtomicU64 = AtomicU64::new(1);

/// A captured graph of collectives, ready to launch; it borrows every communicator and
/// buffer it uses for `'a` (see the [module](self) doc).
pub struct Graph<'a, C: Collective> {
    /// The device's graph; `None` only while it is dropped (before the communicators hear
    /// of it).
    graph: Option<<C::Stream as DeviceStream>::Graph>,
    /// Each communicator the capture used, with the collectives it enqueued.
    comms: Vec<(&'a Comm<C>, Vec<Captured>)>,
    id: u64,
    replays: AtomicU64,
}

impl<'a, C: Collective> Graph<'a, C> {
    /// Captures what `f` enqueues through its [`Step`] on `stream` into a graph: `f` runs
    /// once eagerly on scratch buffers (connecting and warming every path it takes; the
    /// stream is synchronized after it, within the communicators' deadlines), then once
    /// under capture on the real buffers. Every rank of each communicator must capture the
    /// same collectives in the same order, as it would call them.
    pub fn capture(
        stream: &'a C::Stream,
        mut f: impl FnMut(&Step<'a, C>) -> Result<()>,
    ) -> Result<Self> {
        {
            let _warm = PhaseGuard::enter(Phase::Warm)?;
            let cap = Step::new(stream, Phase::Warm);
            // A panic in the closure is caught here only to end what it started (the
            // scratch work waited for before its memory is freed), then resumed.
            let ran = catch_unwind(AssertUnwindSafe(|| f(&cap)));
            if let Err(e) = stream.synchronize() {
                // Work that may still use the scratch memory: leaked, never freed under it.
                cap.leak_scratch();
                return match ran {
                    Err(panic) => resume_unwind(panic),
                    Ok(_) => Err(e),
                };
            }
            drop(cap);
            match ran {
                Err(panic) => resume_unwind(panic),
                Ok(r) => r?,
            }
        }
        let cap = Step::new(stream, Phase::Capture);
        let phase = PhaseGuard::enter(Phase::Capture)?;
        stream.begin_capture()?;
        let ran = catch_unwind(AssertUnwindSafe(|| f(&cap)));
        drop(phase);
        // The capture is ended whatever the closure did, a panic included (caught above and
        // resumed below), so the stream runs eager work again: a stream left capturing would
        // record every later call instead of running it.
        let graph = stream.end_capture();
        let ran = match ran {
            Err(panic) => {
                drop(graph);
                take_captured();
                resume_unwind(panic)
            }
            Ok(r) => r,
        };
        ran?;
        let graph = graph?;
        let captured = take_captured();
        let comms: Vec<(&'a Comm<C>, Vec<Captured>)> = cap
            .into_comms()
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
        for (c, _) in &comms {
            c.graph_made();
        }
        Ok(Graph {
            graph: Some(graph),
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
        if let Some(g) = &self.graph {
            g.launch(stream)?;
        }
        let replay = self.replays.fetch_add(1, Ordering::Relaxed);
        for (c, ops) in &self.comms {
            if let Some(f) = c.backend().flight() {
                for k in ops {
                    let at = crate::flight::Replay {
                        graph: self.id,
                        replay,
                    };
                    f.record_replay(k.what, k.path, at);
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

impl<C: Collective> Drop for Graph<'_, C> {
    /// The device's graph first, then each communicator hears of it: NCCL's abort of a
    /// communicator returns only once every graph that captured its work is destroyed, so
    /// an abort given up at its deadline (a peer lost during the replays) finishes now,
    /// and the last graph's drop waits for it, at most the communicator's deadline (on 1x
    /// H200 a process exiting under that teardown ended in a segmentation fault once in
    /// four runs).
    fn drop(&mut self) {
        drop(self.graph.take());
        for (c, _) in &self.comms {
            c.graph_destroyed();
        }
    }
}
