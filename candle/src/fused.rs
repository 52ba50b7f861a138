//! The step that ends a tensor-parallel decoder layer, fused: the sum all-reduce of each
//! rank's partial product, the residual add and the RMSNorm in one of unicomm's symmetric
//! kernels, over a symmetric workspace made once ([`FusedNorm`]).

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor, WithDType};
use parking_lot::{Mutex, MutexGuard};
use unicomm::{Element, SymmetricAlgorithm};

use crate::comm::{wrap, Communicator};
use crate::workspace::{offsets, Workspace, NAME};

/// A symmetric workspace for the fused all-reduce + residual add + RMSNorm of up to
/// [`capacity`](FusedNorm::capacity) elements of one type: made once (collectively, as
/// [`Communicator::fused_norm`]), then one kernel per call with no allocation. It borrows its
/// [`Communicator`], as unicomm's symmetric memory borrows its communicator. A decode loop
/// keeps one per layer shape; its calls are serialised (a lock: two threads of one rank take
/// turns).
pub struct FusedNorm<'c> {
    comm: &'c Communicator,
    dtype: DType,
    capacity: usize,
    work: Mutex<Workspace<'c>>,
}

impl std::fmt::Debug for FusedNorm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "FusedNorm({} x {:?} on {:?})",
            self.capacity, self.dtype, self.comm
        )
    }
}

impl Communicator {
    /// A workspace for [`FusedNorm::all_reduce_rms_norm`] of up to `capacity` elements of
    /// `dtype` (f32, f16, bf16): unicomm's symmetric memory, allocated collectively (every
    /// rank calls it with the same type and capacity: `Mismatch` otherwise). Where the
    /// backend has no symmetric memory here (an AMD GPU, a runtime without unicomm's
    /// exchange), unicomm's `Unsupported` inside candle's error.
    pub fn fused_norm(&self, dtype: DType, capacity: usize) -> Result<FusedNorm<'_>> {
        let _turn = self.locked("fused_norm")?;
        let c = self.comm();
        let e = |e| wrap("fused_norm", e);
        let work = match dtype {
            DType::F32 => Workspace::F32(c.alloc_symmetric(capacity).map_err(e)?),
            DType::BF16 => Workspace::Bf16(c.alloc_symmetric(capacity).map_err(e)?),
            DType::F16 => Workspace::F16(c.alloc_symmetric(capacity).map_err(e)?),
            other => candle_core::bail!(
                "unicomm-candle fused_norm: {other:?} tensors (f32, f16 and bf16 are fused)"
            ),
        };
        Ok(FusedNorm {
            comm: self,
            dtype,
            capacity,
            work: Mutex::new(work),
        })
    }

    /// `residual + allreduce(partial)` and its RMSNorm by `weight`, as
    /// [`FusedNorm::all_reduce_rms_norm`], on a workspace made for this call alone
    /// (a collective allocation per call: a decode loop keeps a [`FusedNorm`]).
    pub fn all_reduce_rms_norm(
        &self,
        partial: &Tensor,
        residual: &Tensor,
        weight: &Tensor,
        eps: f32,
    ) -> Result<(Tensor, Tensor)> {
        self.fused_norm(partial.dtype(), partial.elem_count())?
            .all_reduce_rms_norm(partial, residual, weight, eps)
    }
}

impl<'c> FusedNorm<'c> {
    /// The most elements a call takes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The element type it was made for.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// `residual + allreduce(partial)` (the next residual) and its RMSNorm by `weight`
    /// (`[hidden]`, the last dimension): `(normed, residual)`, from unicomm's fused kernel
    /// (its one-shot all-reduce; the mean and the scale in f32, one rounding to the type).
    /// `partial` and `residual` have one shape, at most [`capacity`](Self::capacity)
    /// elements, and the workspace's type, on every rank.
    ///
    /// On candle's CPU tensors over the mock, and on its CUDA tensors (feature `cuda`)
    /// over NCCL: the partial product copied into the workspace and the kernel enqueued on
    /// candle's own stream, the host never waiting. Where the backend has no symmetric
    /// kernels, unicomm's `Unsupported` inside candle's error.
    pub fn all_reduce_rms_norm(
        &self,
        partial: &Tensor,
        residual: &Tensor,
        weight: &Tensor,
        eps: f32,
    ) -> Result<(Tensor, Tensor)> {
        self.check(partial, residual, weight)?;
        let op = FusedOp { norm: self, eps };
        let (p, r, w) = (
            partial.contiguous()?,
            residual.contiguous()?,
            weight.contiguous()?,
        );
        // One storage of both results: [0] the normed, [1] the next residual.
        let both = p.apply_op3_no_bwd(&r, &w, &op)?;
        Ok((both.get(0)?, both.get(1)?))
    }

    fn check(&self, partial: &Tensor, residual: &Tensor, weight: &Tensor) -> Result<()> {
        let hidden = weight.elem_count();
        if partial.shape() != residual.shape()
            || partial.dims().last() != Some(&hidden)
            || weight.rank() != 1
        {
            candle_core::bail!(
                "unicomm-candle {NAME}: partial {:?}, residual {:?} and weight {:?} do not fit (the same shape, its last dimension the weight's length)",
                partial.shape(),
                residual.shape(),
                weight.shape()
            );
        }
        if partial.dtype() != residual.dtype() || partial.dtype() != weight.dtype() {
            candle_core::bail!("unicomm-candle {NAME}: the tensors' types differ");
        }
        if partial.dtype() != self.dtype {
            candle_core::bail!(
                "unicomm-candle {NAME}: {:?} tensors on a workspace of {:?}",
                partial.dtype(),
                self.dtype
            );
        }
        if partial.elem_count() > self.capacity {
            candle_core::bail!(
                "unicomm-candle {NAME}: {} elements on a workspace of {}",
                partial.elem_count(),
                self.capacity
            );
        }
        Ok(())
    }

    /// The workspace, once no other thread's call holds it (as the communicator's own lock,
    /// which every call takes after this one).
    fn work(&self) -> Result<MutexGuard<'_, Workspace<'c>>> {
        self.comm
            .lock_within(&self.work, NAME, "another thread's call on this workspace")
    }
}

/// The op candle runs: the three inputs contiguous, the output `[2, shape...]`.
struct FusedOp<'a, 'c> {
    norm: &'a FusedNorm<'c>,
    eps: f32,
}

/// The output's shape: both results of `l`'s shape.
fn both_shape(l: &Layout) -> Shape {
    let mut dims = vec![2];
    dims.extend_from_slice(l.dims());
    Shape::from_dims(&dims)
}

impl CustomOp3 for FusedOp<'_, '_> {
    fn name(&self) -> &'static str {
        "unicomm-all-reduce-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, r, w) = (offsets(l1)?, offsets(l2)?, offsets(l3)?);
        let mut work = self.norm.work()?;
        let comm = self.norm.comm;
        let eps = self.eps;
        macro_rules! run {
            ($sym:expr, $t:ty) => {{
                let (a, b, c) = (
                    s1.as_slice::<$t>()?,
                    s2.as_slice::<$t>()?,
                    s3.as_slice::<$t>()?,
                );
                let v = cpu::<$t>(comm, $sym, (&a[x.0..x.1], &b[r.0..r.1], &c[w.0..w.1]), eps)?;
                <$t as WithDType>::to_cpu_storage_owned(v)
            }};
        }
        let out = match &mut *work {
            Workspace::F32(s) => run!(s, f32),
            Workspace::Bf16(s) => run!(s, unicomm::bf16),
            Workspace::F16(s) => run!(s, unicomm::f16),
        };
        Ok((out, both_shape(l1)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let mut work = self.norm.work()?;
        let comm = self.norm.comm;
        let out = crate::ops::cuda::fused_cuda(
            comm,
            &mut work,
            [(s1, l1), (s2, l2), (s3, l3)],
            self.eps,
        )?;
        Ok((out, both_shape(l1)))
    }
}

/// The CPU path (the mock, whose memory is host memory): the partial product into the
/// workspace, the residual and the weight uploaded, the kernel, both results read back.
fn cpu<T: Element + WithDType>(
    comm: &Communicator,
    sym: &mut unicomm::Symmetric<'_, T>,
    (x, res, w): (&[T], &[T], &[T]),
    eps: f32,
) -> Result<Vec<T>> {
    let mut streams = comm.locked(NAME)?;
    let c = comm.comm();
    let st = streams.host(c)?;
    let e = |e| wrap(NAME, e);
    let n = x.len();
    sym.write_from_host(x, st).map_err(e)?;
    let mut r = c.upload(res, st).map_err(e)?;
    let wb = c.upload(w, st).map_err(e)?;
    let mut out = c.alloc::<T>(n).map_err(e)?;
    let how = unicomm::RmsNormOptions::new(eps, SymmetricAlgorithm::OneShot);
    c.all_reduce_rms_norm(sym, n, &mut r, &wb, &mut out, how, st)
        .map_err(e)?;
    let mut both = out.copy_to_host(st).map_err(e)?;
    both.extend(r.copy_to_host(st).map_err(e)?);
    Ok(both)
}
