//! Symmetric calls that disagree across ranks get `Mismatch` on every rank, never `Ok` with
//! another call's data: the conformance suite's disagreements (count, reduction,
//! algorithm, type of equal bytes, the fused norm's width and epsilon, fusion, a barrier)
//! over 100 attempts each, the differing rank rotating, at worlds 2 and 3 (threads; the
//! processes' run is `procs.rs`); Lamport calls of count 0 among others, exact.

use std::time::Duration;

use unicomm_conformance::{
    lamport_count_zero_sequence, symmetric_disagreement, Disagreement, ALGORITHMS,
};
use unicomm_core::symmetric::SymmetricOptions;
use unicomm_core::{each_rank, Comm};
use unicomm_mock::{local_comms_with, MockComm, MockConfig};

fn comms(world: usize) -> Vec<Comm<MockComm>> {
    // A generous deadline: 1,200 splits and allocations on a loaded 2-core machine once
    // left a rank 20 s behind its peers at a split.
    let config = MockConfig {
        timeout: Duration::from_secs(60),
        ..MockConfig::default()
    };
    local_comms_with(world, config).unwrap()
}

/// Without the signature every kernel compares, a count differing by one element returned
/// `Ok` on a rank that read a peer's count of the next attempt (the count word was reused
/// before the slower peer read it), and a type, reduction or algorithm differing was never
/// compared: each rank returned its own result.
#[test]
fn every_disagreement_is_mismatch_on_every_rank_over_100_attempts() {
    for w in [2, 3] {
        let cs = comms(w);
        for algorithm in ALGORITHMS {
            for d in Disagreement::all(algorithm) {
                let seen = each_rank(&cs, |c| symmetric_disagreement(c, d, algorithm, 100));
                let seen =
                    seen.unwrap_or_else(|e| panic!("{d:?} in {algorithm:?} at world {w}: {e}"));
                assert!(seen.iter().all(Option::is_some), "{d:?}: {seen:?}");
            }
        }
    }
}

/// Lamport calls of count 0 between calls of count 5 on one allocation: without a header
/// exchange a count-0 call advanced one rank's round without meeting its peers, and about
/// half the runs returned another call's data with `Ok` on one rank.
#[test]
fn lamport_calls_of_count_0_keep_the_rounds_in_step_over_100_runs() {
    for w in [2, 3] {
        let cs = comms(w);
        let seen = each_rank(&cs, |c| lamport_count_zero_sequence(c, 100)).unwrap();
        assert_eq!(seen, vec![true; w], "world {w}");
    }
}

/// The fused norm's bf16 output is the f32 product `x * scale * weight` rounded once, as
/// `__float2bfloat16_rn` rounds it on the GPU: going through f64 rounded about 6 in 100,000
/// elements twice (1 ulp low). 102,400 elements of varied magnitude at world 1.
#[test]
fn the_fused_norms_bf16_output_is_rounded_once() {
    use unicomm_core::bf16;
    let (hidden, rows) = (1024usize, 100usize);
    let n = hidden * rows;
    let cs = comms(1);
    let val = |i: usize, k: usize| {
        let x = ((i * 2654435761 + k * 40503) % 100_003) as f32 / 7919.0 - 6.3;
        bf16::from_f32(x * (1.0 + (i % 7) as f32 * 0.37))
    };
    let x: Vec<bf16> = (0..n).map(|i| val(i, 1)).collect();
    let res0: Vec<bf16> = (0..n).map(|i| val(i, 2)).collect();
    let weight: Vec<bf16> = (0..hidden).map(|i| val(i, 3)).collect();
    let eps = 1e-5f32;
    let added: Vec<f32> = x
        .iter()
        .zip(&res0)
        .map(|(a, r)| bf16::from_f32(a.to_f32() + r.to_f32()).to_f32())
        .collect();
    let wf: Vec<f32> = weight.iter().map(|w| w.to_f32()).collect();
    let want: Vec<u16> = unicomm_conformance::rms_norm_reference(&added, &wf, eps)
        .into_iter()
        .map(|y| bf16::from_f32(y).to_bits())
        .collect();
    let got = each_rank(&cs, |c| -> unicomm_core::Result<Vec<u16>> {
        let st = c.create_stream()?;
        let sym = c.alloc_symmetric::<bf16>(n)?;
        sym.write_from_host(&x, &st)?;
        let mut residual = c.upload(&res0, &st)?;
        let w = c.upload(&weight, &st)?;
        let mut out = c.alloc::<bf16>(n)?;
        let how = unicomm_core::symmetric::RmsNormOptions::new(
            eps,
            unicomm_core::symmetric::SymmetricAlgorithm::OneShot,
        );
        c.all_reduce_rms_norm(&sym, n, &mut residual, &w, &mut out, how, &st)?;
        Ok(out.copy_to_host(&st)?.iter().map(|b| b.to_bits()).collect())
    })
    .unwrap();
    let wrong = got[0].iter().zip(&want).filter(|(g, w)| g != w).count();
    assert_eq!(wrong, 0, "{wrong} of {n} elements differ from one rounding");
}

/// A peer that released its part of the allocation without making the call ends the wait
/// at once with `Mismatch` (its departure word in its pad), as a peer that finalized before
/// a plain collective does, not at the deadline; for each algorithm.
#[test]
fn a_peer_that_released_its_part_ends_the_wait_at_once() {
    use std::time::Instant;
    use unicomm_core::{DeviceStream, Error, ReduceOp};
    for algorithm in ALGORITHMS {
        let cs = comms(2);
        let got = each_rank(
            &cs,
            |c| -> unicomm_core::Result<Option<(Error, Duration)>> {
                let st = c.create_stream()?;
                let sym = c.alloc_symmetric_lamport::<f32>(8)?;
                let mut out = c.alloc::<f32>(8)?;
                if c.rank() == 1 {
                    drop(sym);
                    return Ok(None);
                }
                std::thread::sleep(Duration::from_millis(50));
                let t = Instant::now();
                c.all_reduce_symmetric(
                    &sym,
                    8,
                    &mut out,
                    SymmetricOptions::new(ReduceOp::Sum, algorithm),
                    &st,
                )?;
                Ok(st.synchronize().err().map(|e| (e, t.elapsed())))
            },
        )
        .unwrap();
        match &got[0] {
            Some((Error::Mismatch { what, .. }, waited)) => {
                assert_eq!(*what, "the number of symmetric calls");
                assert!(
                    *waited < Duration::from_secs(5),
                    "{algorithm:?}: {waited:?}"
                );
            }
            other => panic!("{algorithm:?}: {other:?}"),
        }
    }
}

/// Where the mock stands for a library whose GPU backend refuses unicomm's kernels (RCCL on
/// an AMD GPU, NCCL on an sm80 GPU: the PTX targets sm_90), it refuses them too, naming
/// why: a program tested on the mock meets the refusal it will meet there.
#[test]
fn the_mock_refuses_the_kernels_where_its_target_would() {
    use unicomm_core::Error;
    for (target, refused) in [
        ("rccl-2.22.3", true),
        ("nccl-2.28.9-sm80", true),
        ("nccl-2.28.9", false),
    ] {
        let config = MockConfig::standing_for(target)
            .unwrap()
            .within(Duration::from_secs(20));
        let cs = local_comms_with(2, config).unwrap();
        let got = each_rank(&cs, |c| c.alloc_symmetric::<f32>(8).map(drop));
        match got {
            Err(Error::Unsupported { what, .. }) if refused => {
                assert!(what.contains("symmetric"), "{what}")
            }
            Ok(_) if !refused => {}
            other => panic!("{target}: {other:?}"),
        }
    }
}
