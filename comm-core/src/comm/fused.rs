//! The fused all-reduce + residual add + RMSNorm on symmetric memory (the step that ends a
//! tensor-parallel decoder layer), with its result in the input's type and, if asked, also
//! quantized to FP8 for the next layer's GEMM.

use super::symmetric::{FusedViews, Symmetric};
use super::Comm;
use crate::backend::Collective;
use crate::buffer::{DeviceSlice, DeviceSliceMut, View};
use crate::element::{Element, ReduceOp};
use crate::fp8::F8E4M3;
use crate::symmetric::{RmsNormOptions, SymmetricAlgorithm, SymmetricOptions};
use crate::Result;

/// Where a fused step's FP8 result goes: `out` (at least `count` e4m3 elements) and the
/// scale it is multiplied by (one f32 on the device, read when the kernel runs). An eager
/// call takes them as `&mut` and `&`; a graph's step as `&` to both (the graph holds them
/// for its life, as its other buffers).
#[derive(Debug)]
pub struct Fp8Buffers<O, S> {
    /// The quantized result.
    pub out: O,
    /// The per-tensor scale (`out[i] = e4m3(norm[i] * scale)`, saturated).
    pub scale: S,
}

impl<C: Collective> Comm<C> {
    /// The step that ends a tensor-parallel decoder layer, in one kernel: for each row of
    /// `weight.len()` elements of the first `count` elements, `residual += allreduce(input)`,
    /// then `out = residual / sqrt(mean(residual^2) + eps) * weight` (f32 inside). The
    /// unfused sequence (an all-reduce, an add, a norm) is its reference.
    #[allow(clippy::too_many_arguments, reason = "the fused step's operands")]
    pub fn all_reduce_rms_norm<T: Element>(
        &self,
        input: &Symmetric<'_, T, C>,
        count: usize,
        residual: &mut impl DeviceSliceMut<T, C>,
        weight: &impl DeviceSlice<T, C>,
        out: &mut impl DeviceSliceMut<T, C>,
        how: RmsNormOptions,
        stream: &C::Stream,
    ) -> Result<()> {
        let res = residual.view_mut().into_view();
        let views = FusedViews::new(res, weight.view(), how.eps, None);
        self.fused_work(
            input,
            count,
            &out.view_mut().into_view(),
            &views,
            how,
            stream,
        )
    }

    /// [`Comm::all_reduce_rms_norm`] with its result also quantized to FP8 (OCP e4m3) in
    /// the same kernel, as TensorRT-LLM's and FlashInfer's fusions give it: element `i` of
    /// `fp8.out` is `out[i] * scale` (`out[i]` the normalized result in `T`, the scale read
    /// from the device when the kernel runs), saturated to ±448 and rounded to nearest even.
    #[allow(clippy::too_many_arguments, reason = "the fused step's operands")]
    pub fn all_reduce_rms_norm_fp8<T: Element, O, S>(
        &self,
        input: &Symmetric<'_, T, C>,
        count: usize,
        residual: &mut impl DeviceSliceMut<T, C>,
        weight: &impl DeviceSlice<T, C>,
        out: &mut impl DeviceSliceMut<T, C>,
        fp8: Fp8Buffers<&mut O, &S>,
        how: RmsNormOptions,
        stream: &C::Stream,
    ) -> Result<()>
    where
        O: DeviceSliceMut<F8E4M3, C>,
        S: DeviceSlice<f32, C>,
    {
        let res = residual.view_mut().into_view();
        let q = Some((fp8.out.view_mut().into_view(), fp8.scale.view()));
        let views = FusedViews::new(res, weight.view(), how.eps, q);
        self.fused_work(
            input,
            count,
            &out.view_mut().into_view(),
            &views,
            how,
            stream,
        )
    }

    /// The fused step's operation, checked and enqueued on `stream`.
    fn fused_work<T: Element>(
        &self,
        input: &Symmetric<'_, T, C>,
        count: usize,
        out: &View<'_, T, C>,
        views: &FusedViews<'_, T, C>,
        how: RmsNormOptions,
        stream: &C::Stream,
    ) -> Result<()> {
        let sym = self.fused_op(input, count, out, views, how.algorithm)?;
        self.sole()?.work((&sym).into(), stream)
    }

    /// The fused step's operation, checked (a sum: the norm's residual is a sum; its
    /// epsilon is the views').
    pub(crate) fn fused_op<'v, T: Element>(
        &self,
        input: &Symmetric<'_, T, C>,
        count: usize,
        out: &View<'v, T, C>,
        views: &FusedViews<'v, T, C>,
        algorithm: SymmetricAlgorithm,
    ) -> Result<crate::symmetric::SymmetricOp<'v, C::Memory>> {
        let all_reduce = SymmetricOptions::new(ReduceOp::Sum, algorithm);
        self.symmetric_all_reduce_op(input, count, out, Some(views), all_reduce)
    }
}
