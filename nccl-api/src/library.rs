//! The library-call path: each operation of the contract as one call of the library (or, where
//! the library lacks it, the grouped point-to-point calls that nccl-tests uses), on this
//! communicator or on a child the caller names.

use std::ffi::c_int;
use std::sync::Arc;

use unicomm_core::registry::{RegKind, Registry};
use unicomm_core::{DataType, Error, Kind, Op, ReduceOp, Result, Slice};

use crate::libcomm::LibComm;
use crate::memory::ApiMemory;
use crate::sys::api::{Api, NcclComm};
use crate::sys::calls::{CommRef, Handle, P2p, Sides, StreamRef};
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

    /// `op` on `st` through the library: on `child` where the caller routes it there
    /// (automatic registration's second communicator), else on `lc` itself. `op` was
    /// checked (`Op::check`) against the world; each call checks the bounds it relies on
    /// again (`sys::calls`).
    pub(crate) fn enqueue(
        &self,
        lc: &Arc<LibComm<R>>,
        registry: &Registry,
        child: Option<NcclComm>,
        op: &Op<'_, ApiMemory<R>>,
        st: StreamRef<'_>,
    ) -> Result<()> {
        let wire = wire_type(&lc.api, op.kind, op.dtype)?;
        one_rank_fp8_premul(lc, op)?;
        if let (Kind::AllGather, None) = (op.kind, child) {
            // Only this communicator's window kernels have the defect; the second
            // communicator sees an ordinary registration.
            let (send, recv) = op.pair()?;
            window_all_gather_defect(lc, registry, &send, &recv, op.count * op.dtype.size())?;
        }
        lc.call(|c| {
            let on = match child {
                Some(raw) => lc.child(c, raw),
                None => c,
            };
            self.call(lc, op, wire, on, st)
        })
    }

    /// A stream-ordered barrier on `st`: an in-place one-element all-reduce of the
    /// communicator's own 4 bytes (NCCL has no barrier).
    pub(crate) fn barrier_on(&self, lc: &Arc<LibComm<R>>, st: StreamRef<'_>) -> Result<()> {
        lc.call(|c| self.barrier_in(&lc.api, c, st))
    }

    fn barrier_in(&self, api: &Api, on: CommRef<'_>, st: StreamRef<'_>) -> Result<()> {
        let b = Slice {
            mem: &self.barrier,
            offset: 0,
            bytes: 4,
        };
        let sides = Sides {
            send: Some(&b),
            recv: Some(&b),
        };
        api.all_reduce(sides, 1, DataType::F32, RED_SUM, on, st)
    }

    /// The library call of `op` on `on` (the caller holds the lock).
    #[inline]
    fn call(
        &self,
        lc: &LibComm<R>,
        op: &Op<'_, ApiMemory<R>>,
        wire: DataType,
        on: CommRef<'_>,
        st: StreamRef<'_>,
    ) -> Result<()> {
        let api = &*lc.api;
        let count = op.count;
        let b = Sides {
            send: op.send.as_ref(),
            recv: op.recv.as_ref(),
        };
        match op.kind {
            Kind::AllReduce { op: red } => {
                let red = RedOp::new(api, on.handle(), red, op.dtype)?;
                api.all_reduce(b, count, wire, red.code, on, st)
            }
            Kind::Broadcast { root } => api.broadcast(b, count, wire, root, on, st),
            Kind::Reduce { op: red, root } => {
                let red = RedOp::new(api, on.handle(), red, op.dtype)?;
                api.reduce(b, count, wire, red.code, root, on, st)
            }
            Kind::AllGather => api.all_gather(b, count, wire, on, st),
            Kind::ReduceScatter { op: red } => {
                let red = RedOp::new(api, on.handle(), red, op.dtype)?;
                api.reduce_scatter(b, count, wire, red.code, on, st)
            }
            Kind::AllToAll if api.all_to_all.is_some() => api.all_to_all(b, count, wire, on, st),
            // No native all-to-all (NCCL < 2.28): one send and one receive per peer in a
            // group, as nccl-tests' alltoall does.
            Kind::AllToAll => {
                let (send, recv) = op.pair()?;
                let part = count * op.dtype.size();
                fn at<'m, M>(s: Slice<'m, M>, p: usize, part: usize) -> Slice<'m, M> {
                    Slice {
                        offset: s.offset + p * part,
                        bytes: part,
                        ..s
                    }
                }
                api.grouped(|| {
                    for p in 0..lc.world {
                        api.send_recv(&at(send, p, part), (count, wire), P2p::Send(p), on, st)?;
                        api.send_recv(&at(recv, p, part), (count, wire), P2p::Recv(p), on, st)?;
                    }
                    Ok(())
                })
            }
            Kind::Gather { root } => api.gather(b, count, wire, root, on, st),
            Kind::Scatter { root } => api.scatter(b, count, wire, root, on, st),
            Kind::AllToAllV => {
                let (sc, rc) = op
                    .layout
                    .send
                    .zip(op.layout.recv)
                    .ok_or_else(|| unlowered("ncclAllToAllv"))?;
                api.all_to_allv(b, (sc, rc), wire, on, st)
            }
            Kind::AllGatherV | Kind::ReduceScatterV { .. } => Err(unlowered(op.name())),
            Kind::Send { peer } => {
                let s = op
                    .send
                    .ok_or_else(|| Error::invalid("send", "a send without a buffer"))?;
                api.send_recv(&s, (count, wire), P2p::Send(peer), on, st)
            }
            Kind::Recv { peer } => {
                let r = op
                    .recv
                    .ok_or_else(|| Error::invalid("recv", "a receive without a buffer"))?;
                api.send_recv(&r, (count, wire), P2p::Recv(peer), on, st)
            }
            Kind::Barrier => self.barrier_in(api, on, st),
        }
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

/// A kind the communicator lowers before it reaches the library-call path (no native call).
#[cold]
#[inline(never)]
fn unlowered(call: &str) -> Error {
    Error::invalid(
        "op",
        format!("{call} reached the library without a native call"),
    )
}

/// The type an operation is called with. The 8-bit floats move as `ncclUint8` (the same
/// bytes, on every library version); reductions of them need a library that reduces them
/// (`Unsupported` otherwise, naming why).
#[inline]
fn wire_type(api: &Api, kind: Kind, dtype: DataType) -> Result<DataType> {
    if !dtype.is_fp8() {
        return Ok(dtype);
    }
    fp8_wire_type(api, kind, dtype)
}

#[cold]
#[inline(never)]
fn fp8_wire_type(api: &Api, kind: Kind, dtype: DataType) -> Result<DataType> {
    if kind.reduction().is_some() {
        api.fp8_reduce()?;
        return Ok(dtype);
    }
    Ok(DataType::U8)
}

/// The `ncclRedOp_t` of one call: built in, or a pre-multiplied sum created on the
/// communicator for this call and destroyed when dropped (after the call returned: NCCL's
/// rule for `ncclRedOpDestroy`).
struct RedOp<'a> {
    code: c_int,
    created: Option<(&'a Api, Handle<'a>)>,
}

impl<'a> RedOp<'a> {
    #[inline]
    fn new(api: &'a Api, comm: Handle<'a>, op: ReduceOp, dtype: DataType) -> Result<Self> {
        if let Some(code) = op.nccl() {
            return Ok(RedOp {
                code,
                created: None,
            });
        }
        Self::create(api, comm, op, dtype)
    }

    /// A pre-multiplied sum's operator, created for one call (out of line: rare).
    #[cold]
    #[inline(never)]
    fn create(api: &'a Api, comm: Handle<'a>, op: ReduceOp, dtype: DataType) -> Result<Self> {
        let ReduceOp::PreMulSum(x) = op else {
            return Err(Error::invalid("op", "a reduction without a code"));
        };
        let wire = wire_type(api, Kind::AllReduce { op }, dtype)?;
        let code = api.red_op_create_pre_mul_sum(comm, x.bytes(), wire)?;
        Ok(RedOp {
            code,
            created: Some((api, comm)),
        })
    }
}

impl RedOp<'_> {
    #[cold]
    #[inline(never)]
    fn destroy(&self, api: &Api, comm: Handle<'_>) {
        // A failure cannot be reported from drop: the operator leaks with the communicator.
        let _ = api.red_op_destroy(comm, self.code);
    }
}

impl Drop for RedOp<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some((api, comm)) = self.created {
            self.destroy(api, comm);
        }
    }
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
