//! The fused residual add and RMSNorm after a symmetric all-reduce, on the mock: for each
//! row of `hidden` elements, `residual = sum + residual` (rounded to the type, as an add
//! kernel would), then `out = residual * (1 / sqrt(mean(residual^2) + eps)) * weight`, the
//! mean and the scale in f32 (the precision of the fused kernels engines run).

use std::time::Duration;

use unicomm_core::{ReduceOp, Result, F8E4M3};

use super::kernels::{put, read, Local, Ty};
use super::protocol::Norm;

/// `sums` (the all-reduce's result, as bits) added to `n.residual` (overwritten with the
/// sum) and normalised into `out`. Each allocation is locked on its own, in turn (the
/// residual, the weight and the output may share one).
pub(crate) fn add_and_norm(
    ty: Ty,
    sums: &[u32],
    n: &Norm,
    out: &Local,
    timeout: Duration,
) -> Result<()> {
    let residual: Vec<u32> = {
        let _g = n.residual.alloc.read_lock(timeout)?;
        (0..sums.len()).map(|i| read(&n.residual, ty, i)).collect()
    };
    let weight: Vec<f32> = {
        let _g = n.weight.alloc.read_lock(timeout)?;
        (0..n.hidden)
            .map(|i| ty.to_f64(read(&n.weight, ty, i)) as f32)
            .collect()
    };
    let summed: Vec<u32> = sums
        .iter()
        .zip(&residual)
        .map(|(&s, &r)| ty.reduce(ReduceOp::Sum, s, r))
        .collect();
    let mut normed = Vec::with_capacity(summed.len());
    for row in summed.chunks(n.hidden) {
        let xs: Vec<f32> = row.iter().map(|&b| ty.to_f64(b) as f32).collect();
        let scale = rms_scale(&xs, n.eps);
        normed.extend(
            xs.iter()
                .zip(&weight)
                .map(|(&x, &w)| ty.bits_f32(x * scale * w)),
        );
    }
    {
        let _g = n.residual.alloc.write_lock(timeout)?;
        for (i, &b) in summed.iter().enumerate() {
            put(&n.residual, ty, i, b);
        }
    }
    super::kernels::write(out, ty, &normed, timeout)?;
    match &n.fp8 {
        None => Ok(()),
        Some((q, scale)) => quantize(ty, &normed, q, scale, timeout),
    }
}

/// The normalized result (`normed`, as bits of `ty`) times the scale, as OCP e4m3
/// saturated to its finite range: the GPU kernel's `__NV_SATFINITE` conversion.
fn quantize(ty: Ty, normed: &[u32], q: &Local, scale: &Local, timeout: Duration) -> Result<()> {
    let s = {
        let _g = scale.alloc.read_lock(timeout)?;
        f32::from_bits(read(scale, Ty::F32, 0))
    };
    let bytes: Vec<u8> = normed
        .iter()
        .map(|&b| e4m3_saturated(ty.to_f64(b) as f32 * s))
        .collect();
    super::kernels::write_bytes(q, &bytes, timeout)
}

/// `x` as OCP e4m3, clamped to ±448 first (NaN stays NaN), rounded to nearest even.
pub(crate) fn e4m3_saturated(x: f32) -> u8 {
    let x = if x.is_nan() {
        x
    } else {
        x.clamp(-448.0, 448.0)
    };
    F8E4M3::from_f32(x).to_bits()
}

/// `1 / sqrt(mean(x^2) + eps)` in f32, the squares summed in order.
pub(crate) fn rms_scale(xs: &[f32], eps: f32) -> f32 {
    let ss: f32 = xs.iter().map(|x| x * x).sum();
    1.0 / (ss / xs.len() as f32 + eps).sqrt()
}
