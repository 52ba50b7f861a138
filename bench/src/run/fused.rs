//! The fused modes (`fused`, `fused-fp8`): unicomm's all-reduce + residual add + RMSNorm
//! (one-shot), optionally with the FP8 output, over rows of the decode preset's hidden
//! size. The data check reads the residual, which one call from a cleared residual leaves
//! equal to the all-reduce (the norm's arithmetic is the conformance suite's to check).

use anyhow::Context;
use unicomm::generic::DeviceSlice;
use unicomm::{Buffer, Fp8Buffers, RmsNormOptions, Step, SymmetricAlgorithm, View, F8E4M3};

use super::data::*;

/// RMSNorm's epsilon (Llama's).
const EPS: f32 = 1e-5;

/// A rank's buffers for the fused modes: the input in symmetric memory, the residual (the
/// buffer checked), the weight (ones), the output, and the FP8 output with its scale.
pub(crate) struct Fused<'c, T: Val> {
    pub(crate) x: unicomm::Symmetric<'c, T>,
    pub(crate) residual: Buffer<T>,
    weight: Buffer<T>,
    out: Buffer<T>,
    fp8: Option<(Buffer<F8E4M3>, Buffer<f32>)>,
}

fn how() -> RmsNormOptions {
    RmsNormOptions::new(EPS, SymmetricAlgorithm::OneShot)
}

/// The row length of a fused call (the decode preset's hidden size).
fn rows(hidden: Option<usize>) -> anyhow::Result<usize> {
    hidden.context("the fused modes run on the decode preset's shapes only")
}

impl<'c, T: Val> Fused<'c, T> {
    pub(crate) fn new(c: &'c unicomm::Comm, elems: usize, fp8: bool) -> anyhow::Result<Self> {
        let st = c.create_stream()?;
        let mut weight = c.alloc::<T>(elems)?;
        weight.copy_from_host(&vec![T::of(1); elems], &st)?;
        let fp8 = if fp8 {
            let mut scale = c.alloc::<f32>(1)?;
            scale.copy_from_host(&[1.0], &st)?;
            Some((c.alloc::<F8E4M3>(elems)?, scale))
        } else {
            None
        };
        st.synchronize()?;
        Ok(Fused {
            x: c.alloc_symmetric(elems)?,
            residual: c.alloc::<T>(elems)?,
            weight,
            out: c.alloc::<T>(elems)?,
            fp8,
        })
    }

    /// The weight of rows of `hidden` (ones).
    pub(crate) fn weight(&self, hidden: Option<usize>) -> anyhow::Result<View<'_, T>> {
        Ok(self.weight.view().slice(..rows(hidden)?)?)
    }

    /// One call of `n` elements in rows of `hidden`, eagerly.
    pub(crate) fn launch(
        &mut self,
        c: &unicomm::Comm,
        n: usize,
        hidden: Option<usize>,
        st: &unicomm::AnyStream,
    ) -> anyhow::Result<()> {
        let weight = self.weight.view().slice(..rows(hidden)?)?;
        let (x, res, out) = (&self.x, &mut self.residual, &mut self.out);
        match &mut self.fp8 {
            Some((q, scale)) => {
                let fp8 = Fp8Buffers {
                    out: q,
                    scale: &*scale,
                };
                c.all_reduce_rms_norm_fp8(x, n, res, &weight, out, fp8, how(), st)?
            }
            None => c.all_reduce_rms_norm(x, n, res, &weight, out, how(), st)?,
        }
        Ok(())
    }

    /// One call through a graph's step, on `weight` (from [`Fused::weight`]).
    pub(crate) fn step<'g>(
        &'g self,
        step: &Step<'g>,
        c: &'g unicomm::Comm,
        count: usize,
        weight: &'g View<'g, T>,
    ) -> unicomm::Result<()> {
        let (x, res, out) = (&self.x, &self.residual, &self.out);
        match &self.fp8 {
            Some((q, scale)) => {
                let fp8 = Fp8Buffers { out: q, scale };
                step.all_reduce_rms_norm_fp8(c, x, count, res, weight, out, fp8, how())
            }
            None => step.all_reduce_rms_norm(c, x, count, res, weight, out, how()),
        }
    }

    pub(crate) fn release(self, c: &unicomm::Comm) -> anyhow::Result<()> {
        Ok(c.free_symmetric(self.x)?)
    }
}
