//! Expert parallelism's dispatch and combine through a [`Step`]: the group and the buffers
//! borrowed for the graph's life, the routing read anew at each replay.

use super::Step;
use crate::backend::Collective;
use crate::buffer::{DeviceSlice, DeviceSliceMut, View};
use crate::capturing::{Phase, StepCall};
use crate::comm::Comm;
use crate::element::Element;
use crate::expert::{ExpertGroup, ExpertTokens};
use crate::fp8::F8E4M3;
use crate::symmetric::SymmetricOp;
use crate::Result;

impl<'a, C: Collective> Step<'a, C> {
    /// [`ExpertGroup::dispatch`], through the step.
    pub fn expert_dispatch<T: Element>(
        &self,
        group: &'a ExpertGroup<'_, T, C>,
        tokens: &'a impl DeviceSlice<T, C>,
        ids: &'a impl DeviceSlice<i32, C>,
        out: ExpertTokens<&'a impl DeviceSliceMut<T, C>, &'a impl DeviceSliceMut<i32, C>>,
    ) -> Result<()> {
        self.dispatch(group, tokens.view(), ids.view(), out.views(), None)
    }

    /// [`ExpertGroup::dispatch_fp8`], through the step.
    pub fn expert_dispatch_fp8<T: Element>(
        &self,
        group: &'a ExpertGroup<'_, T, C>,
        tokens: &'a impl DeviceSlice<F8E4M3, C>,
        scales: &'a impl DeviceSlice<f32, C>,
        ids: &'a impl DeviceSlice<i32, C>,
        out: ExpertTokens<&'a impl DeviceSliceMut<F8E4M3, C>, &'a impl DeviceSliceMut<i32, C>>,
        out_scales: &'a impl DeviceSliceMut<f32, C>,
    ) -> Result<()> {
        let q = out_scales.view();
        self.used(group.comm(), &q);
        let scales = Some((scales.view(), q));
        self.dispatch(group, tokens.view(), ids.view(), out.views(), scales)
    }

    /// A dispatch of either kind: its outputs held for the graph's life, then enqueued.
    fn dispatch<T: Element, U: Element>(
        &self,
        group: &'a ExpertGroup<'_, T, C>,
        tokens: View<'_, U, C>,
        ids: View<'_, i32, C>,
        out: ExpertTokens<View<'_, U, C>, View<'_, i32, C>>,
        scales: Option<(View<'_, f32, C>, View<'_, f32, C>)>,
    ) -> Result<()> {
        let comm = group.comm();
        self.used(comm, &out.tokens);
        self.used(comm, &out.counts);
        let _call = StepCall::enter();
        let op = group.dispatch_op(tokens, ids, out, scales)?;
        self.run(comm, op)
    }

    /// [`ExpertGroup::combine`], through the step.
    pub fn expert_combine<T: Element>(
        &self,
        group: &'a ExpertGroup<'_, T, C>,
        expert_out: &'a impl DeviceSlice<T, C>,
        ids: &'a impl DeviceSlice<i32, C>,
        weights: &'a impl DeviceSlice<f32, C>,
        out: &'a impl DeviceSliceMut<T, C>,
    ) -> Result<()> {
        let o = out.view();
        let comm = group.comm();
        self.used(comm, &o);
        let _call = StepCall::enter();
        let op = group.combine_op(expert_out.view(), ids.view(), weights.view(), o)?;
        self.run(comm, op)
    }

    /// `op` enqueued, except in the capture's warm-up pass (which runs nothing: the data
    /// moves at the replays).
    fn run(&self, comm: &'a Comm<C>, op: SymmetricOp<'_, C::Memory>) -> Result<()> {
        match self.phase {
            Phase::Warm => Ok(()),
            _ => comm.sole()?.work((&op).into(), self.stream),
        }
    }
}
