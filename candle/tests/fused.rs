//! The fused all-reduce + residual add + RMSNorm on a workspace made once
//! ([`FusedNorm`]), on candle's CPU tensors over the mock: many calls of several sizes on
//! one workspace equal the unfused sequence (candle's all-reduce op, an add, a norm), and
//! what the workspace cannot take is refused before any kernel.

mod common;

use std::sync::Arc;

use candle_core::{DType, Device, Tensor, D};
use common::ranks;
use unicomm_candle::{Communicator, FusedNorm, Reduce};

/// The unfused reference: the sum over the ranks, the residual add, the RMSNorm in f32.
fn unfused(
    c: &Arc<Communicator>,
    partial: &Tensor,
    residual: &Tensor,
    weight: &Tensor,
    eps: f64,
) -> candle_core::Result<(Tensor, Tensor)> {
    let summed = (residual + c.all_reduce(partial, Reduce::Sum)?)?;
    let x = summed.to_dtype(DType::F32)?;
    let rms = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?;
    let normed = x
        .broadcast_div(&rms)?
        .broadcast_mul(&weight.to_dtype(DType::F32)?)?;
    Ok((normed, summed))
}

fn max_diff(a: &Tensor, b: &Tensor) -> candle_core::Result<f32> {
    (a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()
}

/// Rank `r`'s `[rows, hidden]` tensor of small values that differ per rank, row and call.
fn input(r: usize, k: usize, rows: usize, hidden: usize) -> candle_core::Result<Tensor> {
    let v: Vec<f32> = (0..rows * hidden)
        .map(|i| ((i * 7 + r * 3 + k * 5) % 11) as f32 / 4.0 - 1.0)
        .collect();
    Tensor::from_vec(v, (rows, hidden), &Device::Cpu)
}

#[test]
fn one_workspace_serves_many_calls_of_several_sizes_as_the_unfused_sequence() {
    let hidden = 64;
    let worst = ranks(3, |c| {
        let norm: FusedNorm<'_> = c.fused_norm(DType::F32, 4 * hidden)?;
        assert_eq!((norm.capacity(), norm.dtype()), (4 * hidden, DType::F32));
        let weight = input(9, 0, 1, hidden)?.flatten_all()?;
        let mut worst = 0f32;
        for (k, rows) in [4, 1, 3, 4, 2, 4, 1].into_iter().enumerate() {
            let partial = input(c.rank(), k, rows, hidden)?;
            let residual = input(7, k, rows, hidden)?;
            let (normed, summed) = norm.all_reduce_rms_norm(&partial, &residual, &weight, 1e-5)?;
            let (want_n, want_s) = unfused(&c, &partial, &residual, &weight, 1e-5)?;
            assert_eq!(normed.dims(), &[rows, hidden]);
            assert_eq!(
                summed.to_vec2::<f32>()?,
                want_s.to_vec2::<f32>()?,
                "call {k}"
            );
            worst = worst.max(max_diff(&normed, &want_n)?);
        }
        Ok(worst)
    });
    for w in worst {
        assert!(w <= 1e-5, "the fused norm is {w} from the unfused one");
    }
}

#[test]
fn a_bf16_workspace_matches_the_unfused_sequence_within_one_rounding() {
    let hidden = 32;
    let worst = ranks(2, |c| {
        let norm = c.fused_norm(DType::BF16, 2 * hidden)?;
        let weight = input(9, 0, 1, hidden)?
            .flatten_all()?
            .to_dtype(DType::BF16)?;
        let partial = input(c.rank(), 1, 2, hidden)?.to_dtype(DType::BF16)?;
        let residual = input(7, 1, 2, hidden)?.to_dtype(DType::BF16)?;
        let (normed, _) = norm.all_reduce_rms_norm(&partial, &residual, &weight, 1e-5)?;
        let (want, _) = unfused(&c, &partial, &residual, &weight, 1e-5)?;
        max_diff(&normed, &want)
    });
    for w in worst {
        assert!(w <= 1.0 / 64.0, "{w}");
    }
}

#[test]
fn what_the_workspace_cannot_take_is_refused_naming_it() {
    let hidden = 16;
    let errors = ranks(2, |c| {
        let norm = c.fused_norm(DType::F32, 2 * hidden)?;
        let weight = Tensor::ones(hidden, DType::F32, &Device::Cpu)?;
        let big = Tensor::ones((3, hidden), DType::F32, &Device::Cpu)?;
        let over = norm
            .all_reduce_rms_norm(&big, &big, &weight, 1e-5)
            .unwrap_err();
        let half = Tensor::ones((2, hidden), DType::F16, &Device::Cpu)?;
        let other = norm
            .all_reduce_rms_norm(&half, &half, &weight.to_dtype(DType::F16)?, 1e-5)
            .unwrap_err();
        let ints = c.fused_norm(DType::U32, 8).unwrap_err();
        // Refused before any kernel: the workspace still serves a call that fits.
        let fits = Tensor::ones((2, hidden), DType::F32, &Device::Cpu)?;
        let (_, summed) = norm.all_reduce_rms_norm(&fits, &fits, &weight, 1e-5)?;
        assert_eq!(summed.to_vec2::<f32>()?[0][0], 3.0);
        Ok([over, other, ints].map(|e| e.to_string()))
    });
    for [over, other, ints] in errors {
        assert!(over.contains("48 elements on a workspace of 32"), "{over}");
        assert!(
            other.contains("F16 tensors on a workspace of F32"),
            "{other}"
        );
        assert!(ints.contains("U32"), "{ints}");
    }
}

/// Ranks whose fused steps differ in shape with the same element count (`[2, 6]` against
/// `[3, 4]`: rows of 6 against rows of 4) get an error naming the row width on every rank,
/// where every other op compares shapes; the kernels' signature carries the width.
#[test]
fn ranks_whose_shapes_differ_get_an_error_naming_the_row_width() {
    let got = ranks(2, |c| {
        let norm = c.fused_norm(DType::F32, 12)?;
        let (rows, hidden) = if c.rank() == 0 { (2, 6) } else { (3, 4) };
        let partial = input(c.rank(), 0, rows, hidden)?;
        let residual = input(5, 0, rows, hidden)?;
        let weight = input(9, 0, 1, hidden)?.flatten_all()?;
        let e = norm
            .all_reduce_rms_norm(&partial, &residual, &weight, 1e-5)
            .and_then(|(n, _)| n.to_vec2::<f32>())
            .err()
            .map(|e| e.to_string());
        Ok(e)
    });
    for (r, e) in got.iter().enumerate() {
        let e = e.as_deref().unwrap_or("Ok");
        assert!(
            e.contains("hidden") && e.contains("rows of"),
            "rank {r}: {e}"
        );
    }
}
