//! The library-call path: each operation of the contract as one call of the library (or, where
//! the library lacks it, the grouped point-to-point calls that nccl-tests uses), on this
//! communicator or on a child the caller names.

#![allow(
    unsafe_code,
    reason = "calls the NCCL-API library or the device runtime at its call sites (the architecture test's UNSAFE_FILES lists them)"
)]

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use unicomm_core::registry::{RegKind, Registry};
use unicomm_core::{DataType, Error, Kind, Op, ReduceOp, Result, Slice, Version};

use crate::libcomm::LibComm;
use crate::memory::ApiMemory;
use crate::sys::api::NcclComm;
use crate::sys::runtime::Runtime;

/// The library-call path's own state: 4 device bytes for `barrier` (NCCL has no barrier: an
/// all-reduce of one element).
pub(crate) struct Library<R: Runtime> {
    barrier: ApiMemory<R>,
}

impl<R: Runtime> Library<R> {
    pub(crate) fn new(lc: &LibComm<R>) -> Result<Self> {
        Ok(Library {
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
        let count = op.count;
        let dt = wire_type(&lc.api, op.kind, op.dtype)?;
        one_rank_fp8_premul(lc, op)?;
        let (s, r) = (
            op.send_address() as *mut c_void,
            op.recv_address() as *mut c_void,
        );
        let fns = &lc.api.fns;
        // SAFETY (every call below): `op.check` proved each pointer is this rank's device
        // memory holding what the call reads or writes for `count` elements of the type, on
        // this communicator's device, with roots and peers in range (a side the kind has not
        // on this rank is NULL); the stream belongs to the same device; `call` holds the
        // communicator's lock; a reduction is built-in or created on the same communicator
        // and destroyed after the call returned (NCCL's rule for ncclRedOpDestroy).
        match op.kind {
            Kind::AllReduce { op: red } => lc.call(|c| {
                let red = RedOp::new(lc, on(c), red, op.dtype)?;
                // SAFETY: see the comment above the match.
                let code = unsafe { (fns.all_reduce)(s, r, count, dt, red.code, on(c), st) };
                lc.check("ncclAllReduce", code)
            }),
            Kind::Broadcast { root } => lc.call(|c| {
                let root = root as c_int;
                // SAFETY: see the comment above the match.
                let code = unsafe { (fns.broadcast)(s, r, count, dt, root, on(c), st) };
                lc.check("ncclBroadcast", code)
            }),
            Kind::Reduce { op: red, root } => lc.call(|c| {
                let (red, root) = (RedOp::new(lc, on(c), red, op.dtype)?, root as c_int);
                // SAFETY: see the comment above the match.
                let code = unsafe { (fns.reduce)(s, r, count, dt, red.code, root, on(c), st) };
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
            Kind::ReduceScatter { op: red } => lc.call(|c| {
                let red = RedOp::new(lc, on(c), red, op.dtype)?;
                // SAFETY: see the comment above the match.
                let code = unsafe { (fns.reduce_scatter)(s, r, count, dt, red.code, on(c), st) };
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
            Kind::Gather { root } => lc.call(|c| {
                let f = lc.api.fns.gather.filter(|_| lc.api.native_gather_scatter());
                let f = f.ok_or_else(|| unlowered("ncclGather"))?;
                // SAFETY: see the comment above the match.
                let code = unsafe { f(s, r, count, dt, root as c_int, on(c), st) };
                lc.check("ncclGather", code)
            }),
            Kind::Scatter { root } => lc.call(|c| {
                let f = lc
                    .api
                    .fns
                    .scatter
                    .filter(|_| lc.api.native_gather_scatter());
                let f = f.ok_or_else(|| unlowered("ncclScatter"))?;
                // SAFETY: see the comment above the match.
                let code = unsafe { f(s, r, count, dt, root as c_int, on(c), st) };
                lc.check("ncclScatter", code)
            }),
            Kind::AllToAllV => {
                let f = lc
                    .api
                    .fns
                    .all_to_allv
                    .ok_or_else(|| unlowered("ncclAllToAllv"))?;
                let (sc, rc) = (op.layout.send, op.layout.recv);
                let (sc, rc) = sc.zip(rc).ok_or_else(|| unlowered("ncclAllToAllv"))?;
                lc.call(|c| {
                    // SAFETY: as above; the four arrays hold `world` counts and
                    // displacements each (checked) and live across the call.
                    let code = unsafe {
                        f(
                            s,
                            sc.counts.as_ptr(),
                            sc.displs.as_ptr(),
                            r,
                            rc.counts.as_ptr(),
                            rc.displs.as_ptr(),
                            dt,
                            on(c),
                            st,
                        )
                    };
                    lc.check("ncclAllToAllv", code)
                })
            }
            Kind::AllGatherV | Kind::ReduceScatterV { .. } => Err(unlowered(op.name())),
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
        let (f32, sum) = (DataType::F32.nccl(), RED_SUM);
        let all_reduce = lc.api.fns.all_reduce;
        lc.call(|c| {
            // SAFETY: the communicator's own 4-byte device buffer, one f32 element, in
            // place, on a stream of this device.
            let code = unsafe { all_reduce(b, b, 1, f32, sum, c, st) };
            lc.check("ncclAllReduce", code)
        })
    }
}

/// `ncclSum`.
const RED_SUM: c_int = 0;

/// NCCL's one-rank path (`ncclLaunchOneRank`, 2.28.9) has no pre-multiplied-sum kernel for
/// the 8-bit floats, so a float average or a pre-multiplied sum of fp8 on a communicator of
/// one rank fails there with `ncclInvalidArgument` (measured on 1x H200): refused first, as
/// `Unsupported` naming why.
#[inline]
fn one_rank_fp8_premul<R: Runtime>(lc: &LibComm<R>, op: &Op<'_, ApiMemory<R>>) -> Result<()> {
    let premul = matches!(
        op.kind.reduction(),
        Some(ReduceOp::Avg | ReduceOp::PreMulSum(_))
    );
    if lc.world == 1 && op.dtype.is_fp8() && premul {
        return Err(no_one_rank_fp8_premul(lc, op));
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn no_one_rank_fp8_premul<R: Runtime>(lc: &LibComm<R>, op: &Op<'_, ApiMemory<R>>) -> Error {
    Error::unsupported(
        format!(
            "{} of {} with a pre-multiplied sum (or a float average) on one rank",
            op.kind.name(),
            op.dtype
        ),
        "a communicator of two or more ranks",
        format!(
            "{} {}, whose one-rank path has no fp8 kernel for it",
            lc.api.flavor.library, lc.api.version
        ),
    )
}

/// `ncclScalarHostImmediate`: the scalar is read from host memory at creation.
const SCALAR_HOST_IMMEDIATE: c_int = 1;

/// A kind the communicator lowers before it reaches the library-call path (no native call).
fn unlowered(call: &str) -> Error {
    Error::invalid(
        "op",
        format!("{call} reached the library without a native call"),
    )
}

/// The `ncclDataType_t` an operation is called with. The 8-bit floats move as `ncclUint8`
/// (the same bytes, on every library version); reductions of them need a library that
/// reduces them (`Unsupported` otherwise, naming why).
#[inline]
fn wire_type(api: &crate::sys::api::Api, kind: Kind, dtype: DataType) -> Result<c_int> {
    if !dtype.is_fp8() {
        return Ok(dtype.nccl());
    }
    fp8_wire_type(api, kind, dtype)
}

#[cold]
#[inline(never)]
fn fp8_wire_type(api: &crate::sys::api::Api, kind: Kind, dtype: DataType) -> Result<c_int> {
    if kind.reduction().is_some() {
        api.fp8_reduce()?;
        return Ok(dtype.nccl());
    }
    Ok(DataType::U8.nccl())
}

/// The `ncclRedOp_t` of one call: built in, or a pre-multiplied sum created on the
/// communicator for this call and destroyed when dropped (after the call returned).
struct RedOp {
    code: c_int,
    created: Option<(crate::sys::api::RedOpDestroyFn, NcclComm)>,
}

impl RedOp {
    #[inline]
    fn new<R: Runtime>(
        lc: &LibComm<R>,
        comm: NcclComm,
        op: ReduceOp,
        dtype: DataType,
    ) -> Result<Self> {
        if let Some(code) = op.nccl() {
            return Ok(RedOp {
                code,
                created: None,
            });
        }
        Self::create(lc, comm, op, dtype)
    }

    /// A pre-multiplied sum's operator, created for one call (out of line: rare).
    #[cold]
    #[inline(never)]
    fn create<R: Runtime>(
        lc: &LibComm<R>,
        comm: NcclComm,
        op: ReduceOp,
        dtype: DataType,
    ) -> Result<Self> {
        let ReduceOp::PreMulSum(x) = op else {
            return Err(Error::invalid("op", "a reduction without a code"));
        };
        let (create, destroy) = lc.api.pre_mul_sum()?;
        let mut scalar = [0u8; 8];
        scalar[..x.bytes().len()].copy_from_slice(x.bytes());
        let mut code: c_int = 0;
        // SAFETY: `scalar` holds one element of `dtype` (the caller checked the scalar's type
        // is the operation's), read at creation (host immediate); `comm` is live and locked.
        let r = unsafe {
            create(
                &mut code,
                scalar.as_mut_ptr().cast(),
                wire_type(&lc.api, Kind::AllReduce { op }, dtype)?,
                SCALAR_HOST_IMMEDIATE,
                comm,
            )
        };
        lc.check("ncclRedOpCreatePreMulSum", r)?;
        Ok(RedOp {
            code,
            created: Some((destroy, comm)),
        })
    }
}

impl Drop for RedOp {
    fn drop(&mut self) {
        if let Some((destroy, comm)) = self.created {
            // SAFETY: an operator created on `comm` above, whose last call returned (the
            // caller still holds the communicator's lock); destroyed once.
            unsafe { destroy(self.code, comm) };
        }
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
    lc.api.group_start()?;
    let r = f();
    let end = lc.check("ncclGroupEnd", lc.api.group_end());
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
