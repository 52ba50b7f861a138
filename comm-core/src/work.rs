//! Every kind of stream-ordered work as one value ([`Work`]): what the backend's one door,
//! [`Collective::enqueue`](crate::Collective::enqueue), takes, so that each piece of work is
//! routed, checked and recorded in the flight recorder in one place per backend, and a
//! graph counts all of it.

use crate::device_api::DeviceKernelOp;
use crate::kind::{What, WorkName};
use crate::one_sided::OneSided;
use crate::op::Op;
use crate::symmetric::{Combine, Dispatch, ExpertEngine, SymmetricOp};
use crate::Result;

/// One piece of stream-ordered work, as a backend receives it.
#[derive(Debug)]
pub enum Work<'a, M> {
    /// One of NCCL's collectives or point-to-point calls. Every kind by reference, so that
    /// the door's argument is two words in registers: built on the caller's stack, the
    /// operation stays there, and below the door its kind is still the caller's constant.
    Collective(&'a Op<'a, M>),
    /// One of unicomm's kernels over symmetric memory.
    Symmetric(&'a SymmetricOp<'a, M>),
    /// A one-sided call (put with signal, signal, wait).
    OneSided(&'a OneSided<'a, M>),
    /// unicomm's kernel written against NCCL's device API.
    Device(&'a DeviceKernelOp),
}

impl<'a, M> From<&'a Op<'a, M>> for Work<'a, M> {
    #[inline]
    fn from(op: &'a Op<'a, M>) -> Self {
        Work::Collective(op)
    }
}

impl<'a, M> From<&'a SymmetricOp<'a, M>> for Work<'a, M> {
    fn from(op: &'a SymmetricOp<'a, M>) -> Self {
        Work::Symmetric(op)
    }
}

impl<'a, M> From<&'a OneSided<'a, M>> for Work<'a, M> {
    fn from(op: &'a OneSided<'a, M>) -> Self {
        Work::OneSided(op)
    }
}

impl<'a, M> From<&'a DeviceKernelOp> for Work<'a, M> {
    fn from(op: &'a DeviceKernelOp) -> Self {
        Work::Device(op)
    }
}

impl<'a, M> Work<'a, M> {
    /// What the flight recorder keeps of it.
    #[inline]
    pub fn what(&self) -> What {
        match self {
            Work::Collective(op) => op.what(),
            Work::Symmetric(s) => s.what(),
            Work::OneSided(o) => o.what(),
            Work::Device(d) => d.what(),
        }
    }

    /// The path a backend records for work that is not a collective (a collective's is the
    /// route its backend took): a symmetric kernel's algorithm, the signal pads of a
    /// symmetric barrier, the library's call otherwise.
    pub fn path(&self) -> &'static str {
        match self {
            Work::Symmetric(s) => s.path(),
            Work::Device(_) => DEVICE_PATH,
            Work::Collective(_) | Work::OneSided(_) => "library",
        }
    }

    /// The same work over another memory type (`None`: memory of another backend, an
    /// `InvalidArgument` error naming the argument), handed to `then`: a collective's
    /// mapped operation lives on this frame while `then` runs.
    #[inline]
    pub fn map_mem<N: 'a, T>(
        self,
        f: impl Fn(&'a M) -> Option<&'a N>,
        then: impl FnOnce(Work<'_, N>) -> Result<T>,
    ) -> Result<T> {
        match self {
            Work::Collective(op) => {
                let mapped = op.map_mem(f)?;
                then(Work::Collective(&mapped))
            }
            Work::Symmetric(s) => then(Work::Symmetric(&(*s).map_mem(f)?)),
            Work::OneSided(o) => then(Work::OneSided(&(*o).map_mem(f)?)),
            Work::Device(d) => then(Work::Device(d)),
        }
    }
}

impl<M> Work<'_, M> {
    /// `Unsupported` for this work on `backend`, naming what it needs: what a backend's
    /// door answers for the kinds of work it does not run.
    pub fn unsupported(&self, backend: &str) -> crate::Error {
        let (what, needs) = match self {
            Work::Collective(op) => (op.kind.name().to_string(), "a backend with this collective"),
            Work::Symmetric(_) => (
                "unicomm's symmetric kernels".to_string(),
                "a backend that runs them (the mock, NCCL, RCCL)",
            ),
            Work::OneSided(o) => (
                format!("one-sided operations ({})", o.name()),
                "ncclPutSignal, ncclSignal, ncclWaitSignal (NCCL >= 2.29.2)",
            ),
            Work::Device(_) => (
                "unicomm's kernel on the device API".to_string(),
                crate::device_api::DEVICE_API_NEEDS,
            ),
        };
        crate::Error::unsupported(what, needs, backend)
    }
}

impl<M> Op<'_, M> {
    /// What the flight recorder keeps of it.
    #[inline]
    pub fn what(&self) -> What {
        What::Collective(self.kind, self.count, self.dtype)
    }
}

/// The path the device-API kernel is recorded under.
pub const DEVICE_PATH: &str = "device-api";

impl DeviceKernelOp {
    /// What the flight recorder keeps of it.
    pub fn what(&self) -> What {
        What::Other {
            name: WorkName::DeviceAllReduce,
            count: self.count,
            dtype: Some(self.dtype),
            op: Some(self.op),
            rank: None,
        }
    }
}

impl<M> SymmetricOp<'_, M> {
    /// The path it is recorded under: its algorithm, the signal pads of a barrier, or the
    /// expert library that runs a dispatch or combine.
    pub fn path(&self) -> &'static str {
        match self {
            SymmetricOp::AllReduce { algorithm, .. } => algorithm.name(),
            SymmetricOp::Barrier { .. } => "signal-pads",
            SymmetricOp::AllToAllV(_) => "pull",
            SymmetricOp::Dispatch(Dispatch { group, .. })
            | SymmetricOp::Combine(Combine { group, .. }) => match group.engine {
                ExpertEngine::Kernels => "push",
                ExpertEngine::Library => "expert-library",
            },
        }
    }

    /// What the flight recorder keeps of it.
    pub fn what(&self) -> What {
        symmetric_what(self)
    }
}

impl<M> OneSided<'_, M> {
    /// What the flight recorder keeps of it.
    pub fn what(&self) -> What {
        one_sided_what(self)
    }
}

fn symmetric_what<M>(s: &SymmetricOp<'_, M>) -> What {
    match s {
        SymmetricOp::Barrier { .. } => What::Other {
            name: WorkName::SymmetricBarrier,
            count: 0,
            dtype: None,
            op: None,
            rank: None,
        },
        SymmetricOp::Dispatch(d) => What::Other {
            name: WorkName::ExpertDispatch,
            count: d.n,
            dtype: Some(d.group.dtype),
            op: None,
            rank: None,
        },
        SymmetricOp::Combine(c) => What::Other {
            name: WorkName::ExpertCombine,
            count: c.n,
            dtype: Some(c.group.dtype),
            op: None,
            rank: None,
        },
        SymmetricOp::AllToAllV(a) => What::Other {
            name: WorkName::SymmetricAllToAllV,
            count: a.capacity,
            dtype: Some(a.dtype),
            op: None,
            rank: None,
        },
        SymmetricOp::AllReduce {
            count,
            dtype,
            op,
            norm,
            ..
        } => What::Other {
            name: match norm {
                Some(_) => WorkName::SymmetricAllReduceRmsNorm,
                None => WorkName::SymmetricAllReduce,
            },
            count: *count,
            dtype: Some(*dtype),
            op: Some(*op),
            rank: None,
        },
    }
}

fn one_sided_what<M>(o: &OneSided<'_, M>) -> What {
    let (name, count, dtype, rank) = match o {
        OneSided::Put(p) => (WorkName::PutSignal, p.count, Some(p.dtype), Some(p.peer)),
        OneSided::Signal(peer) => (WorkName::Signal, 0, None, Some(*peer)),
        // The signals waited for, and the peer where there is one.
        OneSided::Wait(w) => (
            WorkName::WaitSignal,
            w.iter().map(|s| s.count as usize).sum(),
            None,
            match w {
                [one] => Some(one.peer),
                _ => None,
            },
        ),
    };
    What::Other {
        name,
        count,
        dtype,
        op: None,
        rank,
    }
}
