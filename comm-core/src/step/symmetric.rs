//! unicomm's symmetric kernels through a [`Step`]: the allocation and the buffers borrowed
//! for the graph's life. The capture's warm-up pass checks them and runs nothing (the
//! kernels have no state to set up, and running one would overwrite the caller's data
//! before the graph runs); every rank's barrier counters live in the signal pads, so the
//! replays count on from where the eager calls left them.

use super::Step;
use crate::backend::Collective;
use crate::buffer::View;
use crate::buffer::{DeviceSlice, DeviceSliceMut};
use crate::capturing::{Phase, StepCall};
use crate::comm::device_api::DeviceComm;
use crate::comm::fused::Fp8Buffers;
use crate::comm::symmetric::FusedViews;
use crate::comm::symmetric::Symmetric;
use crate::comm::Comm;
use crate::element::{Element, ReduceOp};
use crate::fp8::F8E4M3;
use crate::registration::Window;
use crate::symmetric::{RmsNormOptions, SymmetricOptions};
use crate::Result;

impl<'a, C: Collective> Step<'a, C> {
    /// [`Comm::all_reduce_symmetric`], through the step.
    pub fn all_reduce_symmetric<T: Element>(
        &self,
        comm: &'a Comm<C>,
        input: &'a Symmetric<'_, T, C>,
        count: usize,
        out: &'a impl DeviceSliceMut<T, C>,
        how: SymmetricOptions,
    ) -> Result<()> {
        let out = out.view();
        self.used(comm, &out);
        let _call = StepCall::enter();
        let op = comm.symmetric_all_reduce_op(input, count, &out, None, how)?;
        match self.phase {
            Phase::Warm => Ok(()),
            _ => comm.sole()?.work((&op).into(), self.stream),
        }
    }

    /// [`Comm::all_to_all_vdev`], through the step: each replay reads the counts anew.
    pub fn all_to_all_vdev<T: Element>(
        &self,
        comm: &'a Comm<C>,
        input: &'a Symmetric<'_, T, C>,
        splits: &'a Symmetric<'_, i64, C>,
        out: &'a impl DeviceSliceMut<T, C>,
    ) -> Result<()> {
        let out = out.view();
        self.used(comm, &out);
        let _call = StepCall::enter();
        let op = comm.all_to_all_vdev_op(input, splits, &out)?;
        match self.phase {
            Phase::Warm => Ok(()),
            _ => comm.sole()?.work((&op).into(), self.stream),
        }
    }

    /// [`Comm::all_reduce_rms_norm`], through the step.
    #[allow(clippy::too_many_arguments, reason = "the fused step's operands")]
    pub fn all_reduce_rms_norm<T: Element>(
        &self,
        comm: &'a Comm<C>,
        input: &'a Symmetric<'_, T, C>,
        count: usize,
        residual: &'a impl DeviceSliceMut<T, C>,
        weight: &'a impl DeviceSlice<T, C>,
        out: &'a impl DeviceSliceMut<T, C>,
        how: RmsNormOptions,
    ) -> Result<()> {
        let views = FusedViews::new(residual.view(), weight.view(), how.eps, None);
        self.fused(comm, input, count, out.view(), views, how)
    }

    /// [`Comm::all_reduce_rms_norm_fp8`], through the step.
    #[allow(clippy::too_many_arguments, reason = "the fused step's operands")]
    pub fn all_reduce_rms_norm_fp8<T: Element>(
        &self,
        comm: &'a Comm<C>,
        input: &'a Symmetric<'_, T, C>,
        count: usize,
        residual: &'a impl DeviceSliceMut<T, C>,
        weight: &'a impl DeviceSlice<T, C>,
        out: &'a impl DeviceSliceMut<T, C>,
        fp8: Fp8Buffers<&'a impl DeviceSliceMut<F8E4M3, C>, &'a impl DeviceSlice<f32, C>>,
        how: RmsNormOptions,
    ) -> Result<()> {
        let (q, scale) = (fp8.out.view(), fp8.scale.view());
        self.used(comm, &q);
        self.used(comm, &scale);
        let views = FusedViews::new(residual.view(), weight.view(), how.eps, Some((q, scale)));
        self.fused(comm, input, count, out.view(), views, how)
    }

    fn fused<T: Element>(
        &self,
        comm: &'a Comm<C>,
        input: &'a Symmetric<'_, T, C>,
        count: usize,
        out: View<'_, T, C>,
        views: FusedViews<'_, T, C>,
        how: RmsNormOptions,
    ) -> Result<()> {
        for v in [&views.residual, &views.weight, &out] {
            self.used(comm, v);
        }
        let _call = StepCall::enter();
        let op = comm.fused_op(input, count, &out, &views, how.algorithm)?;
        match self.phase {
            Phase::Warm => Ok(()),
            _ => comm.sole()?.work((&op).into(), self.stream),
        }
    }

    /// [`Comm::symmetric_barrier`], through the step.
    pub fn symmetric_barrier<T: Element>(
        &self,
        comm: &'a Comm<C>,
        sym: &'a Symmetric<'_, T, C>,
    ) -> Result<()> {
        self.note_comm(comm);
        let _call = StepCall::enter();
        match self.phase {
            Phase::Warm => Ok(()),
            _ => comm.symmetric_barrier(sym, self.stream),
        }
    }

    /// [`Comm::all_reduce_device`], through the step: the device communicator and both
    /// windows borrowed for the graph's life (the warm-up pass checks and runs nothing;
    /// NCCL's LSA barriers keep their epochs in the device communicator's resources, so
    /// the replays count on).
    pub fn all_reduce_device<T: Element>(
        &self,
        comm: &'a Comm<C>,
        dc: &'a DeviceComm<'_, C>,
        send: &'a Window<'_, T, C>,
        recv: &'a Window<'_, T, C>,
        count: usize,
        op: ReduceOp,
    ) -> Result<()> {
        self.used(comm, &send.view());
        self.used(comm, &recv.view());
        let _call = StepCall::enter();
        let op = comm.device_kernel_op(dc, send, recv, count, op)?;
        match self.phase {
            Phase::Warm => Ok(()),
            _ => comm.sole()?.work((&op).into(), self.stream),
        }
    }
}
