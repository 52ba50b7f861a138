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

/// Logits past f32's exponential range (a router scaled up) still route: the softmax is
/// taken from each row's largest logit, so the layer's output stays finite.
#[test]
fn large_logits_route_without_overflow() {
    let hidden = 8;
    let got = ranks(2, |c| {
        let router = (values(1, 4, hidden)? * 1e4)?;
        let experts: Vec<Tensor> = (0..4)
            .map(|e| values(10 + e, hidden, hidden))
            .collect::<candle_core::Result<_>>()?;
        let moe = c.expert_parallel_moe(&router, &experts, 2, 4)?;
        let x = values(50 + c.rank(), 3, hidden)?;
        let y = moe.forward(&x)?.flatten_all()?.to_vec1::<f32>()?;
        let want = moe_reference(&x, &router, &experts, 2)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok((y, want))
    });
    for (y, want) in got {
        assert!(y.iter().all(|v| v.is_finite()), "{y:?}");
        assert_eq!(y.len(), want.len());
    }
}

/// The layer on the 3 survivors of a layout of 4 whose rank 1 is gone: each keeps its
/// layout place's experts, and tokens routed to rank 1's experts get nothing from them; the
/// output equals the unsharded layer's with those experts contributing nothing.
#[test]
fn the_layer_on_survivors_equals_the_reference_with_the_masked_experts_silent() {
    let (hidden, top_k, experts_n) = (8, 3, 8);
    let mask = unicomm::RankMask::new(4, &[1]).unwrap();
    let worst = ranks(3, |c| {
        let router = values(2, experts_n, hidden)?;
        let experts: Vec<Tensor> = (0..experts_n)
            .map(|e| values(20 + e, hidden, hidden))
            .collect::<candle_core::Result<_>>()?;
        let moe = c.expert_parallel_moe_masked(&router, &experts, top_k, 8, mask)?;
        let x = values(200 + c.rank(), 6, hidden)?;
        let got = moe.forward(&x)?;
        let want = unicomm_candle::moe_reference_masked(&x, &router, &experts, top_k, mask)?;
        let unmasked = moe_reference(&x, &router, &experts, top_k)?;
        Ok((max_diff(&got, &want)?, max_diff(&got, &unmasked)?))
    });
    for (r, (d, off)) in worst.iter().enumerate() {
        assert!(*d <= 1e-5, "rank {r}: {d}");
        // Rank 1's experts are routed to: without them the output differs.
        assert!(
            *off > 1e-3,
            "rank {r}: the masked experts made no difference ({off})"
        );
    }
}

/// A prefill's layer in the high-throughput mode (the received tokens packed, at most
/// `max_recv` a rank: here every token's copies fit) equals the unsharded layer at worlds
/// 1-4, as the low-latency one does.
#[test]
fn the_prefill_layer_with_packed_tokens_equals_the_unsharded_one() {
    let (hidden, top_k) = (16, 3);
    for w in [1, 2, 4] {
        let experts_n = 4 * w;
        let worst = ranks(w, |c| {
            let router = values(1, experts_n, hidden)?;
            let experts: Vec<Tensor> = (0..experts_n)
                .map(|e| values(10 + e, hidden, hidden))
                .collect::<candle_core::Result<_>>()?;
            let options = unicomm::ExpertOptions {
                mode: unicomm::ExpertMode::HighThroughput {
                    max_recv: 12 * top_k * w,
                },
                ..Default::default()
            };
            let moe = c.expert_parallel_moe_with(&router, &experts, top_k, 12, options)?;
            let mut worst = 0f32;
            for step in 0..3 {
                let n = 1 + (c.rank() * 5 + step * 3) % 12;
                let x = values(100 + 7 * c.rank() + step, n, hidden)?;
                let got = moe.forward(&x)?;
                worst = worst.max(max_diff(
                    &got,
                    &moe_reference(&x, &router, &experts, top_k)?,
                )?);
            }
            Ok(worst)
        });
        for (r, d) in worst.iter().enumerate() {
            assert!(*d <= 1e-5, "world {w} rank {r}: {d}");
        }
    }
}
