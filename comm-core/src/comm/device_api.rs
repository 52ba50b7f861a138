//! A library's device API, typed: [`DeviceComm`] (NCCL's `ncclDevComm`: the struct an
//! engine's own kernel takes by value to reach its peers' windows, their LSA pointers and
//! barriers) and unicomm's own kernel written against it ([`Comm::all_reduce_device`]).

use super::Comm;
use crate::backend::Collective;
use crate::device_api::{
    check_device_kernel, check_requirements, DeviceCommParts, DeviceCommRequirements,
    DeviceKernelOp, Team,
};
use crate::element::{Element, ReduceOp};
use crate::info::Version;
use crate::registration::Window;
use crate::{Error, Result};

/// A device communicator: what an engine's kernel takes by value (its bytes,
/// [`DeviceComm::kernel_arg`]) to reach the peers' parts of this communicator's windows
/// through the device API (`ncclGetLsaPointer`, `ncclGetPeerPointer`), and its LSA barriers.
/// It borrows its communicator, which cannot end while it lives; dropping it ends it
/// (`ncclDevCommDestroy`, collective like a window's deregistration: a thread that
/// panics aborts the communicator instead, which tells the peers at once).
///
/// The rules an engine's kernel keeps (the one `unsafe` step is its launch):
/// - it was built against the layout the requirements named: the loaded library's headers
///   for [`DeviceCommLayout::Runtime`](crate::DeviceCommLayout::Runtime), or those of the `Built` release;
/// - it takes the bytes by value as one kernel argument and never keeps them past this
///   value's life, nor uses a window after the window's drop;
/// - it uses at most [`DeviceCommRequirements::lsa_barriers`] barrier indices, and a wait on
///   a peer that may not come is NCCL's (which watches the communicator's abort flag:
///   unicomm aborts the communicator at its deadline, so the kernel ends).
pub struct DeviceComm<'c, C: Collective> {
    comm: &'c Comm<C>,
    parts: DeviceCommParts,
    reqs: DeviceCommRequirements,
}

impl<C: Collective> DeviceComm<'_, C> {
    /// The struct as the library filled it: pass these bytes by value as one kernel
    /// argument (`kernelParams[i]` points at them; the kernel's parameter is
    /// `ncclDevComm`).
    pub fn kernel_arg(&self) -> &[u8] {
        &self.parts.bytes
    }

    /// The release whose layout the bytes follow (the loaded library's, or the one named).
    pub fn layout_version(&self) -> Version {
        self.parts.version
    }

    /// What it was created with.
    pub fn requirements(&self) -> &DeviceCommRequirements {
        &self.reqs
    }

    /// The world team (every rank of the communicator).
    pub fn world_team(&self) -> Team {
        self.parts.world
    }

    /// The ranks that reach each other's memory by loads and stores (one NVLink domain).
    pub fn lsa_team(&self) -> Team {
        self.parts.lsa
    }
}

impl<C: Collective> Drop for DeviceComm<'_, C> {
    fn drop(&mut self) {
        // The destruction may be collective: a thread that unwinds aborts instead (its
        // peers are not coming), as a window's drop does.
        if std::thread::panicking() {
            let _ = self.comm.backend().abort();
        }
        // Errors cannot be reported from drop.
        let _ = self.comm.backend().destroy_device_comm(self.parts.handle);
    }
}

impl<C: Collective> std::fmt::Debug for DeviceComm<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceComm")
            .field("handle", &self.parts.handle)
            .field("bytes", &self.parts.bytes.len())
            .field("version", &self.parts.version)
            .field("lsa", &self.parts.lsa)
            .finish()
    }
}

impl<C: Collective> Comm<C> {
    /// Creates a device communicator (collective and host-blocking: every rank calls it,
    /// in the same order, with the same requirements). NCCL >= 2.31.2 for the runtime
    /// layout, and at least the named release for a built one (`Unsupported` naming it);
    /// a communicator without symmetric memory support is NCCL's refusal; the mock and
    /// RCCL have no device API (`Unsupported`). Not inside a graph's capture.
    pub fn device_comm(&self, reqs: &DeviceCommRequirements) -> Result<DeviceComm<'_, C>> {
        check_requirements(reqs)?;
        crate::capturing::refuse_in_capture("device_comm")?;
        let parts = self.raw.create_device_comm(reqs)?;
        Ok(DeviceComm {
            comm: self,
            parts,
            reqs: *reqs,
        })
    }

    /// unicomm's one-shot all-reduce written against the device API, on `stream`: each
    /// rank reads every LSA peer's part of `send` (its first `count` elements, in rank
    /// order, rounded to the type at each step) and writes them reduced into its own part
    /// of `recv`, between two LSA barriers, one block per barrier of `dc`. Collective;
    /// f32, f16, bf16; sum, max, min. The windows and `dc` must be this communicator's,
    /// both windows at least `count` long. NCCL >= 2.32.3 (the headers it was built
    /// against: see docs/symmetric.md).
    pub fn all_reduce_device<T: Element>(
        &self,
        dc: &DeviceComm<'_, C>,
        send: &Window<'_, T, C>,
        recv: &mut Window<'_, T, C>,
        count: usize,
        op: ReduceOp,
        stream: &C::Stream,
    ) -> Result<()> {
        let op = self.device_kernel_op(dc, send, recv, count, op)?;
        self.sole()?.work((&op).into(), stream)
    }

    /// The operation of [`Comm::all_reduce_device`], checked: the type and reduction, the
    /// device communicator and both windows this communicator's, both holding `count`.
    pub(crate) fn device_kernel_op<T: Element>(
        &self,
        dc: &DeviceComm<'_, C>,
        send: &Window<'_, T, C>,
        recv: &Window<'_, T, C>,
        count: usize,
        op: ReduceOp,
    ) -> Result<DeviceKernelOp> {
        check_device_kernel(T::DTYPE, op)?;
        for (what, id) in [
            ("device_comm", dc.comm.id()),
            ("send", send.comm_id()),
            ("recv", recv.comm_id()),
        ] {
            if id != self.id() {
                return Err(Error::invalid(
                    what,
                    format!("belongs to communicator #{id}, not to #{}", self.id()),
                ));
            }
        }
        for (what, len) in [("send", send.len()), ("recv", recv.len())] {
            if len < count {
                return Err(Error::invalid(
                    what,
                    format!("a window of {len} elements cannot hold {count}"),
                ));
            }
        }
        Ok(DeviceKernelOp {
            device_comm: dc.parts.handle,
            send: send.handle(),
            recv: recv.handle(),
            count,
            dtype: T::DTYPE,
            op,
        })
    }
}
