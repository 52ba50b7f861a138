//! The step that ends a tensor-parallel decoder layer, fused: the sum all-reduce of each
//! rank's partial product, the residual add and the RMSNorm in one of unicomm's symmetric
//! kernels ([`Communicator::all_reduce_rms_norm`]).

use std::sync::Arc;

use candle_core::{DType, Device, Result, Tensor, WithDType};
use unicomm::SymmetricAlgorithm;

use crate::comm::{wrap, Communicator};

impl Communicator {
    /// `residual + allreduce(partial)` (the next residual) and its RMSNorm by `weight`
    /// (`[hidden]`, the last dimension): `(normed, residual)`, from unicomm's fused kernel
    /// (its one-shot all-reduce; the mean and the scale in f32, one rounding to the type).
    /// `partial` and `residual` have one shape and type (f32, f16, bf16) on every rank.
    ///
    /// On the CPU path (the mock); each call allocates the symmetric memory it runs on
    /// (collective, as the call is). Where the backend has no symmetric kernels (the GPUs,
    /// so far), unicomm's `Unsupported` inside candle's error.
    pub fn all_reduce_rms_norm(
        self: &Arc<Self>,
        partial: &Tensor,
        residual: &Tensor,
        weight: &Tensor,
        eps: f32,
    ) -> Result<(Tensor, Tensor)> {
        let hidden = weight.elem_count();
        if partial.shape() != residual.shape()
            || partial.dims().last() != Some(&hidden)
            || weight.rank() != 1
        {
            candle_core::bail!(
                "unicomm-candle all_reduce_rms_norm: partial {:?}, residual {:?} and weight {:?} do not fit (the same shape, its last dimension the weight's length)",
                partial.shape(),
                residual.shape(),
                weight.shape()
            );
        }
        if partial.dtype() != residual.dtype() || partial.dtype() != weight.dtype() {
            candle_core::bail!("unicomm-candle all_reduce_rms_norm: the tensors' types differ");
        }
        if !matches!(partial.device(), Device::Cpu) {
            return Err(wrap(
                "all_reduce_rms_norm",
                unicomm::Error::unsupported(
                    "the fused all-reduce + RMSNorm",
                    "unicomm's symmetric kernels on the CPU path (not built for GPUs yet)",
                    format!("{:?}", partial.device()),
                ),
            ));
        }
        match partial.dtype() {
            DType::F32 => self.fused::<f32>(partial, residual, weight, eps),
            DType::BF16 => self.fused::<unicomm::bf16>(partial, residual, weight, eps),
            DType::F16 => self.fused::<unicomm::f16>(partial, residual, weight, eps),
            other => candle_core::bail!(
                "unicomm-candle all_reduce_rms_norm: {other:?} tensors (f32, f16 and bf16 are fused)"
            ),
        }
    }

    fn fused<T: WithDType + unicomm::Element>(
        &self,
        partial: &Tensor,
        residual: &Tensor,
        weight: &Tensor,
        eps: f32,
    ) -> Result<(Tensor, Tensor)> {
        let mut streams = self.locked("all_reduce_rms_norm")?;
        let comm = self.comm();
        let st = streams.host(comm)?;
        let host = |t: &Tensor| -> Result<Vec<T>> { t.flatten_all()?.to_vec1::<T>() };
        let (x, res, w) = (host(partial)?, host(residual)?, host(weight)?);
        let n = x.len();
        let e = |e| wrap("all_reduce_rms_norm", e);
        let sym = comm.alloc_symmetric::<T>(n).map_err(e)?;
        sym.write_from_host(&x, st).map_err(e)?;
        let mut r = comm.upload(&res, st).map_err(e)?;
        let wb = comm.upload(&w, st).map_err(e)?;
        let mut out = comm.alloc::<T>(n).map_err(e)?;
        let how = (eps, SymmetricAlgorithm::OneShot);
        comm.all_reduce_rms_norm(&sym, n, &mut r, &wb, &mut out, how, st)
            .map_err(e)?;
        let (normed, summed) = (
            out.copy_to_host(st).map_err(e)?,
            r.copy_to_host(st).map_err(e)?,
        );
        let shape = partial.shape();
        Ok((
            Tensor::from_vec(normed, shape, partial.device())?,
            Tensor::from_vec(summed, shape, partial.device())?,
        ))
    }
}
