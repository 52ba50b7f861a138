//! The plain path: each operation of the contract as one call of the library (or, where
//! the library lacks it, the grouped point-to-point calls that nccl-tests uses), on this
//! communicator or on a child the caller names.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use unicomm_core::registry::{RegKind, Registry};
use unicomm_core::{DataType, Error, Kind, Op, ReduceOp, Result, Slice, Version};

use crate::libcomm::LibComm;
use crate::memory::ApiMemory;
use crate::sys::api::NcclComm;
use crate::sys::runtime::Runtime;

/// The plain path's own state: 4 device bytes for `barrier` (NCCL has no barrier: an
/// all-reduce of one element).
pub(crate) struct Plain<R: Runtime> {
    barrier: ApiMemory<R>,
}

impl<R: Runtime> Plain<R> {
    pub(crate) fn new(lc: &LibComm<R>) -> Result<Self> {
        Ok(Plain {
            barrier: ApiMemory::from_runtime_malloc(lc.rt.clone(), lc.dev, 4)?,
        })
    }

    /// `op` on `stream` through the library: on `child` where the caller routes it there
    /// (automatic registration's second communicator), else on `lc` itself. `op` was
    /// checked (`Op::check`) against the world.
    pub(crate) fn enqueue(
        &self,
        lc: &Arc<LibComm<R>>,
        registry: &Registry,
        child: Option<NcclComm>,
        op: &Op<'_, ApiMemory<R>>,
        st: *mut c_void,
    ) -> Result<()> {
        // The communicator the call goes to (`call` checks `lc`'s state either way).
        let on = |main: NcclComm| child.unwrap_or(main);
        let (count, dt) = (op.count, op.dtype.nccl());
        let (s, r) = (
            op.send_address() as *mut c_void,
            op.recv_address() as *mut c_void,
        );
        let fns = &lc.api.fns;
        // SAFETY (every call below): `op.check` proved each pointer is this rank's device
        // memory holding what the call reads or writes for `count` elements of the type, on
        // this communicator's device, with roots and peers in range; the stream belongs to
        // the same device; `call` holds the communicator's lock.
        match op.kind {
            Kind::AllReduce { op } => lc.call(|c| {
                // SAFETY: see the comment above the match.
                let code = unsafe { (fns.all_reduce)(s, r, count, dt, op.nccl(), on(c), st) };
                lc.check("ncclAllReduce", code)
            }),
            Kind::Broadcast { root } => lc.call(|c| {
                let root = root as c_int;
                // SAFETY: see the comment above the match.
                let code = unsafe { (fns.broadcast)(s, r, count, dt, root, on(c), st) };
                lc.check("ncclBroadcast", code)
            }),
            Kind::Reduce { op, root } => lc.call(|c| {
                let (red, root) = (op.nccl(), root as c_int);
                // SAFETY: see the comment above the match.
                let code = unsafe { (fns.reduce)(s, r, count, dt, red, root, on(c), st) };
                lc.check("ncclReduce", code)
            }),
            Kind::AllGather => {
                let (send, recv) = op.pair()?;
                // Only this communicator's window kernels have the defect; the second
                // communicator sees an ordinary registration.
                if child.is_none() {
                    window_all_gather_defect(lc, registry, &send, &recv, count * op.dtype.size())?;
                }
                lc.call(|c| {
                    // SAFETY: see the comment above the match.
                    let code = unsafe { (fns.all_gather)(s, r, count, dt, on(c), st) };
                    lc.check("ncclAllGather", code)
                })
            }
            Kind::ReduceScatter { op } => lc.call(|c| {
                let red = op.nccl();
                // SAFETY: see the comment above the match.
                let code = unsafe { (fns.reduce_scatter)(s, r, count, dt, red, on(c), st) };
                lc.check("ncclReduceScatter", code)
            }),
            Kind::AllToAll => match lc.api.all_to_all {
                Some(a2a) => lc.call(|c| {
                    // SAFETY: see the comment above the match.
                    let code = unsafe { a2a(s, r, count, dt, on(c), st) };
                    lc.check("ncclAlltoAll", code)
                }),
                // No native all-to-all (NCCL < 2.28): one send and one receive per peer in a
                // group, as nccl-tests' alltoall does.
                None => {
                    let b = count * op.dtype.size();
                    lc.call(|c| {
                        group(lc, || {
                            for p in 0..lc.world {
                                let (ps, pr) =
                                    (s.wrapping_byte_add(p * b), r.wrapping_byte_add(p * b));
                                send_recv(lc, on(c), ps, (count, op.dtype), p, st, Dir::Send)?;
                                send_recv(lc, on(c), pr, (count, op.dtype), p, st, Dir::Recv)?;
                            }
                            Ok(())
                        })
                    })
                }
            },
            Kind::Send { peer } => {
                lc.call(|c| send_recv(lc, c, s, (count, op.dtype), peer, st, Dir::Send))
            }
            Kind::Recv { peer } => {
                lc.call(|c| send_recv(lc, c, r, (count, op.dtype), peer, st, Dir::Recv))
            }
            Kind::Barrier => self.barrier_on(lc, st),
        }
    }

    /// A stream-ordered barrier on `st`: an in-place one-element all-reduce of the
    /// communicator's own 4 bytes (NCCL has no barrier).
    pub(crate) fn barrier_on(&self, lc: &Arc<LibComm<R>>, st: *mut c_void) -> Result<()> {
        let b = self.barrier.ptr as *mut c_void;
        let (f32, sum) = (DataType::F32.nccl(), ReduceOp::Sum.nccl());
        let all_reduce = lc.api.fns.all_reduce;
        lc.call(|c| {
            // SAFETY: the communicator's own 4-byte device buffer, one f32 element, in
            // place, on a stream of this device.
            let code = unsafe { all_reduce(b, b, 1, f32, sum, c, st) };
            lc.check("ncclAllReduce", code)
        })
    }
}

/// Which side of a point-to-point call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    Send,
    Recv,
}

/// `ncclSend` / `ncclRecv` of `count` elements with `peer` on `c` (the caller holds the
/// lock).
fn send_recv<R: Runtime>(
    lc: &LibComm<R>,
    c: NcclComm,
    buf: *mut c_void,
    (count, dtype): (usize, DataType),
    peer: usize,
    stream: *mut c_void,
    dir: Dir,
) -> Result<()> {
    let pair = lc.api.fns.send.zip(lc.api.fns.recv);
    let (s, r) = lc
        .api
        .gated("point-to-point send/recv", Version::new(2, 7, 0), pair)?;
    let (dt, peer) = (dtype.nccl(), peer as c_int);
    // SAFETY: device pointers of this rank's memory holding `count` elements (checked by
    // the caller); the stream belongs to this device.
    let code = unsafe {
        match dir {
            Dir::Send => s(buf, count, dt, peer, c, stream),
            Dir::Recv => r(buf, count, dt, peer, c, stream),
        }
    };
    lc.check(
        if dir == Dir::Send {
            "ncclSend"
        } else {
            "ncclRecv"
        },
        code,
    )
}

/// `f` between `ncclGroupStart` and `ncclGroupEnd`.
fn group<R: Runtime, T>(lc: &LibComm<R>, f: impl FnOnce() -> Result<T>) -> Result<T> {
    // SAFETY: no arguments.
    let start = unsafe { (lc.api.fns.group_start)() };
    lc.api.check("ncclGroupStart", start, None)?;
    let r = f();
    // SAFETY: closes the group opened above.
    let end = lc.check("ncclGroupEnd", unsafe { (lc.api.fns.group_end)() });
    let r = r?;
    end?;
    Ok(r)
}

/// NCCL 2.28.9's symmetric-window all-gather, in place, corrupts the ranks' chunks when a
/// chunk is not a multiple of 4 bytes (measured on 2x H200: f16/bf16/i8/u8 with 1001
/// elements per rank get garbage from the next 8-byte boundary on; 4- and 8-byte types and
/// out-of-place calls are right; so is a world of one). Refused as `Unsupported` rather
/// than computed wrong.
fn window_all_gather_defect<R: Runtime>(
    lc: &LibComm<R>,
    registry: &Registry,
    send: &Slice<'_, ApiMemory<R>>,
    recv: &Slice<'_, ApiMemory<R>>,
    chunk: usize,
) -> Result<()> {
    // One rank gathers nothing from peers (and was measured right).
    if lc.world == 1
        || chunk.is_multiple_of(4)
        || send.address() != recv.address() + lc.rank * chunk
    {
        return Ok(());
    }
    if !registry
        .covering(recv.address(), chunk * lc.world)?
        .is_some_and(RegKind::is_window)
    {
        return Ok(());
    }
    Err(Error::unsupported(
        format!("in-place all_gather in a symmetric window with {chunk}-byte chunks"),
        "chunks that are a multiple of 4 bytes (or out of place, or a non-window buffer)",
        format!(
            "{} {}, whose symmetric in-place all-gather corrupts such chunks",
            lc.api.flavor.library, lc.api.version
        ),
    ))
}
