//! The expert-parallel mixture-of-experts layer on candle's CPU tensors over the mock: its
//! forward equals the unsharded layer's at worlds 1-4 (top-k above the world included),
//! rank by rank on tokens of its own, over several steps of one layer.

mod common;

use candle_core::{Device, Tensor};
use common::ranks;
use unicomm_candle::moe_reference;

/// A `[rows, cols]` tensor of small values, seeded.
fn values(seed: usize, rows: usize, cols: usize) -> candle_core::Result<Tensor> {
    let v: Vec<f32> = (0..rows * cols)
        .map(|i| (((i * 7919 + seed * 104_729) % 23) as f32 - 11.0) / 16.0)
        .collect();
    Tensor::from_vec(v, (rows, cols), &Device::Cpu)
}

fn max_diff(a: &Tensor, b: &Tensor) -> candle_core::Result<f32> {
    (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()
}

#[test]
fn the_sharded_layer_equals_the_unsharded_one_at_worlds_1_to_4() {
    let (hidden, top_k) = (16, 3);
    for w in [1, 2, 4] {
        let experts_n = 4 * w;
        let worst = ranks(w, |c| {
            let router = values(1, experts_n, hidden)?;
            let experts: Vec<Tensor> = (0..experts_n)
                .map(|e| values(10 + e, hidden, hidden))
                .collect::<candle_core::Result<_>>()?;
            let moe = c.expert_parallel_moe(&router, &experts, top_k, 12)?;
            let mut worst = 0f32;
            for step in 0..3 {
                // Each rank its own tokens, a count of its own (one rank may have none).
                let n = (c.rank() * 5 + step * 3) % 13;
                let x = values(100 + 7 * c.rank() + step, n.max(1), hidden)?.narrow(0, 0, n)?;
                let got = moe.forward(&x)?;
                let want = moe_reference(&x, &router, &experts, top_k)?;
                assert_eq!(got.dims(), &[n, hidden]);
                if n > 0 {
                    worst = worst.max(max_diff(&got, &want)?);
                }
            }
            Ok(worst)
        });
        for (r, d) in worst.iter().enumerate() {
            assert!(*d <= 1e-5, "world {w} rank {r}: {d}");
        }
    }
}
