//! The ops on candle's CPU tensors over the mock: values, shapes, dtypes and refusals.

mod common;

use candle_core::{DType, Device, Module, Tensor};
use common::ranks;
use unicomm_candle::{
    unicomm_error, AllReduce, Communicator, Reduce, ShardedEmbedding, TensorParallelColumnLinear,
};

/// Rank `r`'s tensor `[2, 3]`: `10 r + i`.
fn mine(c: &Communicator, dtype: DType) -> candle_core::Result<Tensor> {
    let r = c.rank() as f32;
    Tensor::from_vec(
        (0..6).map(|i| 10.0 * r + i as f32).collect(),
        (2, 3),
        &Device::Cpu,
    )?
    .to_dtype(dtype)
}

#[test]
fn all_reduce_sums_averages_takes_extremes_and_scales() {
    let out = ranks(3, |c| {
        let x = mine(&c, DType::F32)?;
        Ok([
            Reduce::Sum,
            Reduce::Avg,
            Reduce::Max,
            Reduce::Min,
            Reduce::Scaled(0.5),
        ]
        .map(|op| {
            c.all_reduce(&x, op)
                .and_then(|t| t.to_vec2::<f32>())
                .unwrap()
        }))
    });
    for o in &out {
        assert_eq!(o[0], vec![vec![30.0, 33.0, 36.0], vec![39.0, 42.0, 45.0]]);
        // NCCL averages floats as a sum times 1/n: within one rounding of the exact mean.
        let mean = [[10.0f32, 11.0, 12.0], [13.0, 14.0, 15.0]];
        for (got, want) in o[1].iter().flatten().zip(mean.iter().flatten()) {
            assert!((got - want).abs() <= 2e-6 * want, "{got} against {want}");
        }
        assert_eq!(o[2], vec![vec![20.0, 21.0, 22.0], vec![23.0, 24.0, 25.0]]);
        assert_eq!(o[3], vec![vec![0.0, 1.0, 2.0], vec![3.0, 4.0, 5.0]]);
        assert_eq!(o[4], vec![vec![15.0, 16.5, 18.0], vec![19.5, 21.0, 22.5]]);
    }
}

#[test]
fn half_precision_tensors_are_reduced_in_their_own_type() {
    for dtype in [DType::F16, DType::BF16, DType::F64] {
        let out = ranks(2, |c| {
            let y = c.all_reduce(&mine(&c, dtype)?, Reduce::Sum)?;
            assert_eq!(y.dtype(), dtype);
            y.to_dtype(DType::F32)?.to_vec2::<f32>()
        });
        assert_eq!(out[1], vec![vec![10.0, 12.0, 14.0], vec![16.0, 18.0, 20.0]]);
    }
}

/// Along dimension 1 (a column-parallel layer's outputs joined): every rank's columns in
/// rank order.
#[test]
fn all_gather_joins_along_any_dimension_in_rank_order() {
    let out = ranks(2, |c| {
        let x = mine(&c, DType::F32)?;
        Ok((
            c.all_gather(&x, 0)?.to_vec2::<f32>()?,
            c.all_gather(&x, 1)?.to_vec2::<f32>()?,
        ))
    });
    let (d0, d1) = &out[0];
    assert_eq!(
        d0,
        &vec![
            vec![0.0, 1.0, 2.0],
            vec![3.0, 4.0, 5.0],
            vec![10.0, 11.0, 12.0],
            vec![13.0, 14.0, 15.0]
        ]
    );
    assert_eq!(
        d1,
        &vec![
            vec![0.0, 1.0, 2.0, 10.0, 11.0, 12.0],
            vec![3.0, 4.0, 5.0, 13.0, 14.0, 15.0]
        ]
    );
}

#[test]
fn reduce_scatter_keeps_this_ranks_part_and_all_to_all_exchanges_parts() {
    let out = ranks(2, |c| {
        let x = mine(&c, DType::F32)?;
        Ok((
            c.reduce_scatter(&x, 0, Reduce::Sum)?.to_vec2::<f32>()?,
            c.all_to_all(&x, 0)?.to_vec2::<f32>()?,
        ))
    });
    assert_eq!(out[0].0, vec![vec![10.0, 12.0, 14.0]]);
    assert_eq!(out[1].0, vec![vec![16.0, 18.0, 20.0]]);
    // Rank 0 keeps its own first row and receives rank 1's first row.
    assert_eq!(out[0].1, vec![vec![0.0, 1.0, 2.0], vec![10.0, 11.0, 12.0]]);
    assert_eq!(out[1].1, vec![vec![3.0, 4.0, 5.0], vec![13.0, 14.0, 15.0]]);
}

/// What the ops cannot take is refused with an error naming it; a non-contiguous input
/// is made contiguous by the Communicator's methods.
#[test]
fn refusals_name_what_is_wrong() {
    let msgs = ranks(2, |c| {
        let x = mine(&c, DType::F32)?;
        let t = x.t()?; // [3, 2], not contiguous
        let raw = t
            .apply_op1_no_bwd(&AllReduce::new(c.clone(), Reduce::Sum))
            .unwrap_err();
        let via = c.all_reduce(&t, Reduce::Sum)?.to_vec2::<f32>()?;
        assert_eq!(
            via,
            vec![vec![10.0, 16.0], vec![12.0, 18.0], vec![14.0, 20.0]]
        );
        let odd = c
            .reduce_scatter(
                &Tensor::zeros((3, 2), DType::F32, &Device::Cpu)?,
                0,
                Reduce::Sum,
            )
            .unwrap_err();
        // NCCL has no 16-bit integers.
        let ints = c
            .all_reduce(&Tensor::zeros(4, DType::I16, &Device::Cpu)?, Reduce::Sum)
            .unwrap_err();
        Ok([raw, odd, ints].map(|e| e.to_string()))
    });
    assert!(msgs[0][0].contains("not contiguous"), "{}", msgs[0][0]);
    assert!(
        msgs[0][1].contains("not divisible by the 2 ranks"),
        "{}",
        msgs[0][1]
    );
    assert!(
        msgs[0][2].contains("I16 tensors are not supported"),
        "{}",
        msgs[0][2]
    );
}

/// Ranks whose inputs hold as many elements in other shapes (`[2, 6]` against `[3, 4]`, a
/// gather's other dimensions too) or other types of as many bytes (f16 against bf16) are a
/// `Mismatch` on every rank naming both, in the caller's dimensions, never a silent
/// reinterpretation of each other's bytes; a refusal of a gather along dimension 1 names
/// dimension 1 of the caller's shape, not of the transposed one the op runs on.
#[test]
fn ranks_disagreeing_on_shape_or_type_are_a_mismatch_naming_both() {
    let out = ranks(2, |c| {
        let cpu = &Device::Cpu;
        let shaped = if c.rank() == 0 { (2, 6) } else { (3, 4) };
        let a = c
            .all_reduce(&Tensor::zeros(shaped, DType::F32, cpu)?, Reduce::Sum)
            .unwrap_err();
        let gathered = if c.rank() == 0 { (4, 3, 2) } else { (4, 2, 3) };
        let b = c
            .all_gather(&Tensor::zeros(gathered, DType::F32, cpu)?, 1)
            .unwrap_err();
        let typed = if c.rank() == 0 {
            DType::F16
        } else {
            DType::BF16
        };
        let t = c
            .all_reduce(&Tensor::zeros(8, typed, cpu)?, Reduce::Sum)
            .unwrap_err();
        let odd = c
            .reduce_scatter(&Tensor::zeros((3, 5, 7), DType::F32, cpu)?, 1, Reduce::Sum)
            .unwrap_err();
        Ok([a, b, t, odd].map(|e| {
            let what = match unicomm_error(&e) {
                Some(unicomm::Error::Mismatch { what, .. }) => *what,
                _ => "other",
            };
            (what, e.to_string())
        }))
    });
    for o in &out {
        assert_eq!(o[0].0, "shape", "{}", o[0].1);
        assert!(
            o[0].1.contains("F32 [2, 6]") && o[0].1.contains("F32 [3, 4]"),
            "{}",
            o[0].1
        );
        assert_eq!(o[1].0, "shape", "{}", o[1].1);
        assert!(
            o[1].1.contains("[4, 3, 2]") && o[1].1.contains("[4, 2, 3]"),
            "{}",
            o[1].1
        );
        assert_eq!(o[2].0, "dtype", "{}", o[2].1);
        assert!(
            o[2].1.contains("F16") && o[2].1.contains("BF16"),
            "{}",
            o[2].1
        );
        assert!(o[3].1.contains("dimension 1 of [3, 5, 7]"), "{}", o[3].1);
    }
}

/// A gather whose output's dimension would overflow (an empty `[2^63, 0]` tensor over 2
/// ranks) is refused naming it, not a panic in a debug build nor a wrapped size in release.
#[test]
fn a_gather_whose_output_size_overflows_is_refused() {
    let msgs = ranks(2, |c| {
        let x = Tensor::zeros((1usize << 63, 0), DType::F32, &Device::Cpu)?;
        Ok(c.all_gather(&x, 0).unwrap_err().to_string())
    });
    assert!(msgs[0].contains("overflows"), "{}", msgs[0]);
}

/// unicomm's error travels inside candle's and is found again: a mismatch between the
/// ranks (different lengths) is unicomm's `Mismatch`, on every rank.
#[test]
fn unicomms_error_is_kept_inside_candles() {
    let errs = ranks(2, |c| {
        let n = 4 + c.rank();
        let e = c
            .all_reduce(&Tensor::zeros(n, DType::F32, &Device::Cpu)?, Reduce::Sum)
            .unwrap_err();
        Ok(matches!(
            unicomm_error(&e),
            Some(unicomm::Error::Mismatch { .. })
        ))
    });
    assert_eq!(errs, vec![true, true]);
}

/// The vocabulary-parallel embedding gives every rank every row; the column-parallel layer
/// gives each rank its part of the outputs.
#[test]
fn sharded_layers_match_their_unsharded_results() {
    let table = Tensor::arange(0f32, 24.0, &Device::Cpu)
        .unwrap()
        .reshape((8, 3))
        .unwrap();
    let ids = Tensor::new(&[[7u32, 0, 3], [4, 4, 1]], &Device::Cpu).unwrap();
    let want = table
        .embedding(&ids.flatten_all().unwrap())
        .unwrap()
        .reshape((2, 3, 3))
        .unwrap();
    let w = Tensor::arange(0f32, 12.0, &Device::Cpu)
        .unwrap()
        .reshape((4, 3))
        .unwrap();
    let x = Tensor::new(&[[1f32, 2.0, 3.0]], &Device::Cpu).unwrap();
    let out = ranks(4, |c| {
        let e = ShardedEmbedding::from_full(&table, &c)?.forward(&ids)?;
        let col = TensorParallelColumnLinear::from_full(&w, None, &c)?.forward(&x)?;
        let joined = c.all_gather(&col, 1)?;
        Ok((e.to_vec3::<f32>()?, joined.to_vec2::<f32>()?))
    });
    let full = x.matmul(&w.t().unwrap()).unwrap().to_vec2::<f32>().unwrap();
    for (e, joined) in out {
        assert_eq!(e, want.to_vec3::<f32>().unwrap());
        assert_eq!(joined, full);
    }
}

/// Integer tensors (token ids, routing indices, counts) take every collective: u8, u32,
/// i32 and i64 summed, broadcast and gathered exactly.
#[test]
fn integer_tensors_are_reduced_broadcast_and_gathered_exactly() {
    let out = ranks(3, |c| {
        let r = c.rank() as i64;
        let ids = Tensor::new(&[r, 10 + r, 1 << 40], &Device::Cpu)?;
        let sum = c.all_reduce(&ids, Reduce::Sum)?.to_vec1::<i64>()?;
        let small = ids.clamp(0i64, 200i64)?;
        let bytes = c
            .all_reduce(&small.to_dtype(DType::U8)?, Reduce::Max)?
            .to_vec1::<u8>()?;
        let words = c
            .broadcast(&small.to_dtype(DType::U32)?, 2)?
            .to_vec1::<u32>()?;
        let signed = c
            .all_gather(&ids.to_dtype(DType::I32)?.narrow(0, 0, 2)?, 0)?
            .to_vec1::<i32>()?;
        Ok((sum, bytes, words, signed))
    });
    for (sum, bytes, words, signed) in &out {
        assert_eq!(sum, &vec![3, 33, 3 << 40]);
        assert_eq!(bytes, &vec![2, 12, 200]);
        assert_eq!(words, &vec![2, 12, 200]);
        assert_eq!(signed, &vec![0, 10, 1, 11, 2, 12]);
    }
}

/// A receive of a shape whose bytes overflow is an error, not a panic in the element count
/// (`recv((1 << 62, 4), ..)` once panicked with `attempt to multiply with overflow`).
#[test]
fn a_receive_of_a_shape_past_memory_is_an_error() {
    let out = ranks(1, |c| {
        let e = c
            .recv((1usize << 62, 4), DType::F32, &Device::Cpu, 0)
            .unwrap_err();
        Ok(e.to_string())
    });
    assert!(out[0].contains("more bytes than memory"), "{}", out[0]);
}

/// Broadcast, gather and scatter along any dimension, and a send/receive pair (a pipeline
/// stage's hand-off), on candle tensors: root's values everywhere, the parts in rank order,
/// the received tensor equal to the sent one.
#[test]
fn broadcast_gather_scatter_and_send_recv_move_tensors() {
    let out = ranks(2, |c| {
        let x = mine(&c, DType::F32)?; // [2, 3]
        let b = c.broadcast(&x, 1)?.to_vec2::<f32>()?;
        let g = c.gather(&x, 1, 0)?;
        let s = c.scatter(&x, 0, 1)?.to_vec2::<f32>()?;
        let moved = if c.rank() == 0 {
            c.send(&x.affine(2.0, 1.0)?, 1)?;
            None
        } else {
            Some(
                c.recv((2, 3), DType::F32, &Device::Cpu, 0)?
                    .to_vec2::<f32>()?,
            )
        };
        Ok((
            b,
            g.dims().to_vec(),
            g.flatten_all()?.to_vec1::<f32>()?,
            s,
            moved,
        ))
    });
    for (r, (b, gdims, g, s, moved)) in out.iter().enumerate() {
        assert_eq!(b, &vec![vec![10.0, 11.0, 12.0], vec![13.0, 14.0, 15.0]]);
        if r == 0 {
            assert_eq!(gdims, &vec![2, 6]);
            assert_eq!(
                g,
                &vec![0.0, 1.0, 2.0, 10.0, 11.0, 12.0, 3.0, 4.0, 5.0, 13.0, 14.0, 15.0]
            );
        } else {
            assert_eq!(gdims, &vec![2, 0]);
        }
        // Rank 1's [2, 3] cut along dimension 0: row r to rank r.
        assert_eq!(
            s,
            &vec![vec![
                10.0 + 3.0 * r as f32,
                11.0 + 3.0 * r as f32,
                12.0 + 3.0 * r as f32
            ]]
        );
        if r == 1 {
            assert_eq!(
                moved.as_ref().unwrap(),
                &vec![vec![1.0, 3.0, 5.0], vec![7.0, 9.0, 11.0]]
            );
        }
    }
}

/// The fused query/key/value layer gives each rank exactly its query heads and the
/// key/value heads they attend with, as three separate unsharded products would: 8 query
/// and 2 key/value heads over 2 ranks (one key/value head each) and over 4 (each
/// replicated on two ranks).
#[test]
fn the_fused_qkv_layer_gives_each_rank_its_heads_of_the_unsharded_products() {
    use unicomm_candle::{Qkv, QkvColumnLinear};
    let (hd, input) = (2, 3);
    let cpu = &Device::Cpu;
    let w = |rows: usize, seed: f64| {
        Tensor::arange(0f32, (rows * input) as f32, cpu)
            .and_then(|t| t.affine(0.01, seed))
            .and_then(|t| t.reshape((rows, input)))
            .unwrap()
    };
    let (wq, wk, wv) = (w(8 * hd, 0.0), w(2 * hd, 1.0), w(2 * hd, 2.0));
    let x = Tensor::new(&[[1f32, -2.0, 0.5], [0.25, 3.0, -1.0]], cpu).unwrap();
    let full = |wt: &Tensor| x.matmul(&wt.t().unwrap()).unwrap();
    let (fq, fk, fv) = (full(&wq), full(&wk), full(&wv));
    for world in [2usize, 4] {
        let out = ranks(world, |c| {
            let l = QkvColumnLinear::from_full(
                Qkv {
                    q: &wq,
                    k: &wk,
                    v: &wv,
                },
                None,
                hd,
                &c,
            )?;
            let (q, k, v) = l.forward_qkv(&x)?;
            Ok((c.rank(), l.heads(), q, k, v))
        });
        for (r, heads, q, k, v) in out {
            let q_local = 8 / world;
            assert_eq!(heads, (q_local, 1));
            let kv_head = r * q_local / 4;
            let same = |a: &Tensor, b: Tensor| {
                let d = a.sub(&b).unwrap().abs().unwrap().max_all().unwrap();
                assert!(
                    d.to_scalar::<f32>().unwrap() < 1e-5,
                    "world {world} rank {r}"
                );
            };
            same(&q, fq.narrow(1, r * q_local * hd, q_local * hd).unwrap());
            same(&k, fk.narrow(1, kv_head * hd, hd).unwrap());
            same(&v, fv.narrow(1, kv_head * hd, hd).unwrap());
        }
    }
}
