//! The library-call path: each operation of the contract as one call of the library (or, where
//! the library lacks it, the grouped point-to-point calls that nccl-tests uses), on this
//! communicator or on a child the caller names.

use std::ffi::c_int;
use std::sync::Arc;

use unicomm_core::registry::Registry;
use unicomm_core::{DataType, Error, Kind, Op, ReduceOp, Result, Slice};

use crate::libcomm::{Child, LibComm};
use crate::memory::ApiMemory;
use crate::sys::api::Api;
use crate::sys::calls::{CommRef, Handle, P2p, Sides, StreamRef};
use crate::sys::codes::NcclCode;
use crate::sys::coll_config::CollConfig;
use crate::sys::runtime::Runtime;
use crate::sys::target::Target;

/// The library-call path's own state: 4 device bytes for `barrier` (NCCL has no barrier: an
/// all-reduce of one element), and what the library permits on this device.
pub(crate) struct Library<R: Runtime> {
    barrier: ApiMemory<R>,
    pub(crate) target: Target,
}

impl<R: Runtime> Library<R> {
    pub(crate) fn new(lc: &LibComm<R>) -> Result<Self> {
        Ok(Library {
            barrier: ApiMemory::from_runtime_malloc(lc.rt.clone(), lc.dev, lc.deadline(), 4)?,
            target: lc.api.target(lc.rt.compute_capability(lc.dev)),
        })
    }

    /// `op` on `st` through the library: on `child` where the caller routes it there
    /// (automatic registration's second communicator), else on `lc` itself. `op` was
    /// checked (`Op::check`) against the world; each call checks the bounds it relies on
    /// again (`sys::calls`).
    #[inline]
    pub(crate) fn enqueue(
        &self,
        lc: &Arc<LibComm<R>>,
        registry: &Registry,
        child: Option<Child>,
        op: &Op<'_, ApiMemory<R>>,
        st: StreamRef<'_>,
    ) -> Result<()> {
        let wire = wire_type(&self.target, lc.world, op.kind, op.dtype)?;
        let config = match op.options {
            None => None,
            Some(o) => Some(self.configured(o, op.kind)?),
        };
        if let (Kind::AllGather, None) = (op.kind, child) {
            // Only this communicator's window kernels have the defect; the second
            // communicator sees an ordinary registration.
            // The common route reaches here before any size check: an overflowing size is
            // the call's refusal below (`sys::calls`), not this check's.
            let (send, recv) = op.pair()?;
            if let Some(chunk) = op.count.checked_mul(op.dtype.size()) {
                self.target.window_all_gather(
                    lc.rank,
                    lc.world,
                    send.address(),
                    recv.address(),
                    chunk,
                    |at, bytes| registry.covering(at, bytes),
                )?;
            }
        }
        lc.call_enqueue(child, |on| self.call(lc, op, wire, config.as_ref(), on, st))
    }

    /// The `ncclCollConfig_t` of a call with per-call options, where the library takes
    /// them for its kind (out of line: rare).
    #[cold]
    #[inline(never)]
    fn configured(&self, o: &unicomm_core::CallOptions, kind: Kind) -> Result<CollConfig> {
        self.target.call_options(kind)?;
        let mut c = crate::conv::coll_config(o)?;
        if let Some(m) = &o.launch_marker {
            // Kept alive by the options' scope until the call returned, by which time NCCL
            // launched (a non-blocking call is settled before it returns; a group, which
            // launches at its end, and a capture are refused before).
            c.set_launch_event(crate::marker::launch_handle::<R>(m.marker())?);
        }
        Ok(c)
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
            config: None,
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
        config: Option<&CollConfig>,
        on: CommRef<'_>,
        st: StreamRef<'_>,
    ) -> Result<()> {
        let api = &*lc.api;
        let count = op.count;
        let b = Sides {
            send: op.send.as_ref(),
            recv: op.recv.as_ref(),
            config,
        };
        match op.kind {
            Kind::AllReduce { op: red } => {
                let red = RedOp::new(api, on.handle(), red, wire)?;
                api.all_reduce(b, count, wire, red.code, on, st)
            }
            Kind::Broadcast { root } => api.broadcast(b, count, wire, root, on, st),
            Kind::Reduce { op: red, root } => {
                let red = RedOp::new(api, on.handle(), red, wire)?;
                api.reduce(b, count, wire, red.code, root, on, st)
            }
            Kind::AllGather => api.all_gather(b, count, wire, on, st),
            Kind::ReduceScatter { op: red } => {
                let red = RedOp::new(api, on.handle(), red, wire)?;
                api.reduce_scatter(b, count, wire, red.code, on, st)
            }
            // Without the library's all-to-all (NCCL < 2.28) the route lowers it first.
            Kind::AllToAll => api.all_to_all(b, count, wire, on, st),
            Kind::Gather { root } => api.gather(b, count, wire, root, on, st),
            Kind::Scatter { root } => api.scatter(b, count, wire, root, on, st),
            Kind::AllToAllV => {
                let (sc, rc) = op
                    .layout
                    .send
                    .zip(op.layout.recv)
                    .ok_or_else(|| unlowered("ncclAllToAllv"))?;
                api.all_to_allv(b, sc, rc, wire, on, st)
            }
            Kind::AllGatherV | Kind::ReduceScatterV { .. } => Err(unlowered(op.name())),
            Kind::Send { peer } => {
                let s = op
                    .send
                    .ok_or_else(|| Error::invalid("send", "a send without a buffer"))?;
                api.send_recv(&s, count, wire, P2p::Send(peer), on, st)
            }
            Kind::Recv { peer } => {
                let r = op
                    .recv
                    .ok_or_else(|| Error::invalid("recv", "a receive without a buffer"))?;
                api.send_recv(&r, count, wire, P2p::Recv(peer), on, st)
            }
            Kind::Barrier => self.barrier_in(api, on, st),
        }
    }
}

/// `ncclSum`.
const RED_SUM: c_int = 0;

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
/// bytes, on every library version); reductions of them need a library and device that
/// reduce them, and NCCL's one-rank path refuses some (`Unsupported` naming why:
/// [`Target::check_op`]).
#[inline]
fn wire_type(target: &Target, world: usize, kind: Kind, dtype: DataType) -> Result<DataType> {
    if !dtype.is_fp8() {
        return Ok(dtype);
    }
    fp8_wire_type(target, world, kind, dtype)
}

#[cold]
#[inline(never)]
fn fp8_wire_type(target: &Target, world: usize, kind: Kind, dtype: DataType) -> Result<DataType> {
    target.check_op(world, kind, dtype)?;
    if kind.reduction().is_some() {
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
    fn new(api: &'a Api, comm: Handle<'a>, op: ReduceOp, wire: DataType) -> Result<Self> {
        if let Some(code) = op.nccl() {
            return Ok(RedOp {
                code,
                created: None,
            });
        }
        Self::create(api, comm, op, wire)
    }

    /// A pre-multiplied sum's operator, created for one call (out of line: rare).
    #[cold]
    #[inline(never)]
    fn create(api: &'a Api, comm: Handle<'a>, op: ReduceOp, wire: DataType) -> Result<Self> {
        let ReduceOp::PreMulSum(x) = op else {
            return Err(Error::invalid("op", "a reduction without a code"));
        };
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
