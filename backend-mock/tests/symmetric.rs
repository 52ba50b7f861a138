//! Symmetric memory and unicomm's kernels on the mock: every algorithm exact at worlds 1-8
//! (threads), eager and over graph replays; 10,000 replays of each; the fused residual add
//! and RMSNorm bit-exact against its unfused sequence at world 2; the barrier's counters
//! across their wrap-around; a peer that never comes and an abort ending the waits; misuse
//! refused before anything runs.

use std::time::{Duration, Instant};

use unicomm_core::symmetric::{
    pad_arrival, RmsNormOptions, SymmetricAlgorithm, SymmetricOptions, PAD_EPOCH,
};
use unicomm_core::{bf16, each_rank, Comm, DeviceStream, Error, ReduceOp};
use unicomm_mock::{local_comms_with, MockComm, MockConfig};

fn comms(world: usize, timeout: Duration) -> Vec<Comm<MockComm>> {
    let config = MockConfig {
        timeout,
        ..MockConfig::default()
    };
    local_comms_with(world, config).unwrap()
}

#[test]
fn every_algorithm_is_exact_at_worlds_1_to_8_eager_and_replayed() {
    for w in [1, 2, 3, 4, 8] {
        let cs = comms(w, Duration::from_secs(20));
        let seen = unicomm_conformance::symmetric_all_reduce::<f32, _>(&cs, 37, 20);
        assert_eq!(seen.unwrap(), vec![true; w], "f32 at world {w}");
        let seen = unicomm_conformance::symmetric_all_reduce::<bf16, _>(&cs, 64, 5);
        assert_eq!(seen.unwrap(), vec![true; w], "bf16 at world {w}");
        let seen = unicomm_conformance::symmetric_all_reduce::<half::f16, _>(&cs, 5, 5);
        assert_eq!(seen.unwrap(), vec![true; w], "f16 at world {w}");
    }
}

/// The all-to-all with counts on the device at worlds 1-8: every element and written count
/// exact, eagerly and over 20 replays with new counts before each; counts no rank can honour
/// refused on every rank alike, the ranks in step after it.
#[test]
fn the_device_count_all_to_all_is_exact_and_refuses_alike_at_worlds_1_to_8() {
    for w in [1, 2, 3, 4, 8] {
        let cs = comms(w, Duration::from_secs(20));
        let seen = unicomm_conformance::symmetric_all_to_all_v(&cs, 5, 20);
        assert_eq!(seen.unwrap(), vec![true; w], "world {w}");
        let refused = unicomm_conformance::all_to_all_v_refused(&cs).unwrap();
        let first = refused[0].clone().expect("refused");
        assert!(first.contains("rank"), "{first}");
        assert!(
            refused.iter().all(|r| r.as_ref() == Some(&first)),
            "{refused:?}"
        );
    }
}

/// The fused all-reduce + residual add + RMSNorm, every algorithm, eagerly and over 20
/// graph replays (the residual written again before each), against the unfused sequence at
/// worlds 1-8: the same bits on the mock.
#[test]
fn the_fused_norm_matches_the_unfused_sequence_at_worlds_1_to_8() {
    for w in [1, 2, 3, 5, 8] {
        let cs = comms(w, Duration::from_secs(20));
        let seen = unicomm_conformance::symmetric_rms_norm::<f32, _>(&cs, 32, 3, 0.0, 20);
        assert_eq!(seen.unwrap(), vec![true; w], "f32 at world {w}");
        let seen = unicomm_conformance::symmetric_rms_norm::<bf16, _>(&cs, 16, 2, 0.0, 5);
        assert_eq!(seen.unwrap(), vec![true; w], "bf16 at world {w}");
    }
}

/// Every algorithm over 10,000 graph replays with new data each: the barrier counters and
/// Lamport's round counting on in the pads, its three workspaces in turn, each cleared a
/// round after it was read (a stale workspace would hand back an earlier round's data).
#[test]
fn ten_thousand_replays_of_each_algorithm_are_exact() {
    let cs = comms(2, Duration::from_secs(20));
    for algorithm in unicomm_conformance::ALGORITHMS {
        each_rank(&cs, |c| -> unicomm_core::Result<()> {
            let st = c.create_stream()?;
            let sym = c.alloc_symmetric_lamport::<f32>(8)?;
            let out = c.alloc::<f32>(8)?;
            let graph = unicomm_core::graph::Graph::capture(&st, |g| {
                g.all_reduce_symmetric(
                    c,
                    &sym,
                    8,
                    &out,
                    SymmetricOptions::new(ReduceOp::Sum, algorithm),
                )
            })?;
            for k in 0..10_000u32 {
                let base = (k % 1000) as f32;
                let mine: Vec<f32> = (0..8).map(|i| base + (c.rank() * 8 + i) as f32).collect();
                sym.write_from_host(&mine, &st)?;
                graph.launch(&st)?;
                let got = out.copy_to_host(&st)?;
                let want: Vec<f32> = (0..8).map(|i| 2.0 * base + (2 * i + 8) as f32).collect();
                assert_eq!(got, want, "{algorithm:?} replay {k} on rank {}", c.rank());
            }
            Ok(())
        })
        .unwrap();
    }
}

/// The reference of the fused step: the unfused all-reduce (the library path), then the add
/// rounded to the type and the norm in f32, on the host.
fn unfused(sum: &[f32], residual: &[f32], weight: &[f32], eps: f32) -> (Vec<f32>, Vec<f32>) {
    let added: Vec<f32> = sum.iter().zip(residual).map(|(s, r)| s + r).collect();
    let out = unicomm_conformance::rms_norm_reference(&added, weight, eps);
    (added, out)
}

/// At world 2 the sum's order is fixed: the fused kernel's residual and output are the bits
/// of the all-reduce, the add and the norm run one after the other, for each algorithm.
#[test]
fn the_fused_norm_is_bit_exact_against_the_unfused_sequence_at_world_2() {
    let (hidden, rows) = (48, 3);
    let n = hidden * rows;
    let cs = comms(2, Duration::from_secs(20));
    let data = |r: usize, k: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37 + r * 11 + k) % 101) as f32 / 7.3 - 6.1)
            .collect()
    };
    let weight: Vec<f32> = (0..hidden).map(|i| 0.5 + i as f32 / 97.0).collect();
    each_rank(&cs, |c| -> unicomm_core::Result<()> {
        let st = c.create_stream()?;
        let r = c.rank();
        let sym = c.alloc_symmetric_lamport::<f32>(n)?;
        let w = c.upload(&weight, &st)?;
        let mut out = c.alloc::<f32>(n)?;
        for (k, algorithm) in unicomm_conformance::ALGORITHMS.into_iter().enumerate() {
            let res0: Vec<f32> = (0..n).map(|i| (i % 13) as f32 / 3.1 - 2.0).collect();
            let mut residual = c.upload(&res0, &st)?;
            sym.write_from_host(&data(r, k), &st)?;
            c.all_reduce_rms_norm(
                &sym,
                n,
                &mut residual,
                &w,
                &mut out,
                RmsNormOptions::new(1e-5, algorithm),
                &st,
            )?;
            let mut plain = c.upload(&data(r, k), &st)?;
            c.all_reduce_in_place(&mut plain, ReduceOp::Sum, &st)?;
            let (res_want, out_want) = unfused(&plain.copy_to_host(&st)?, &res0, &weight, 1e-5);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&residual.copy_to_host(&st)?),
                bits(&res_want),
                "{algorithm:?} residual"
            );
            assert_eq!(
                bits(&out.copy_to_host(&st)?),
                bits(&out_want),
                "{algorithm:?} output"
            );
        }
        Ok(())
    })
    .unwrap();
}

/// The barrier's counters are wrapping `u32`s: started 3 below the wrap, 20 barriers and
/// all-reduces later every rank is still in step.
#[test]
fn the_barrier_counters_cross_their_wrap_around() {
    let cs = comms(3, Duration::from_secs(20));
    each_rank(&cs, |c| -> unicomm_core::Result<()> {
        let st = c.create_stream()?;
        let sym = c.alloc_symmetric::<f32>(4)?;
        let mut out = c.alloc::<f32>(4)?;
        let args = sym.kernel_args();
        let start = u32::MAX - 3;
        // Every rank writes its own pad's epoch and arrival words (nothing runs on them yet),
        // then all meet before any barrier reads them.
        let words = std::iter::once(PAD_EPOCH).chain((0..c.world_size()).map(pad_arrival));
        for word in words {
            let at = args.pads[c.rank()] as usize + word;
            // SAFETY: the words of this rank's own pad, mapped in this process while `sym`
            // lives, 4-byte aligned; no kernel runs on the allocation during this write.
            unsafe {
                (*(at as *const std::sync::atomic::AtomicU32))
                    .store(start, std::sync::atomic::Ordering::SeqCst)
            };
        }
        c.barrier(&st)?;
        st.synchronize()?;
        for k in 0..10 {
            c.symmetric_barrier(&sym, &st)?;
            sym.write_from_host(&[(c.rank() + k) as f32; 4], &st)?;
            c.all_reduce_symmetric(
                &sym,
                4,
                &mut out,
                SymmetricOptions::new(ReduceOp::Sum, SymmetricAlgorithm::OneShot),
                &st,
            )?;
            assert_eq!(
                out.copy_to_host(&st)?,
                vec![(3 + 3 * k) as f32; 4],
                "round {k}"
            );
        }
        // SAFETY: this rank's epoch word, as above; the stream is idle.
        let epoch = unsafe {
            (*(args.pads[c.rank()] as *const std::sync::atomic::AtomicU32))
                .load(std::sync::atomic::Ordering::SeqCst)
        };
        assert!(epoch < 100, "the epoch wrapped to {epoch}");
        Ok(())
    })
    .unwrap();
}

/// The GPU kernels' grid as the mock runs it: a call of 16,388 floats is five blocks
/// (`symmetric_blocks`), exact at worlds 2 and 3 over 50 replays of each barrier algorithm
/// and two of Lamport, and the pad holds what a GPU's would: the launch count (every launch,
/// a barrier's too), the last launch's last barrier value (`4 * launch + 2` for the one-shot)
/// in blocks 1 to 4's arrival words of every rank, and nothing in block 5's.
#[test]
fn a_grid_of_blocks_meets_on_each_blocks_words_and_counts_the_launches() {
    use unicomm_core::symmetric::{pad_block_arrival, PAD_CALL};
    for w in [2, 3] {
        let cs = comms(w, Duration::from_secs(20));
        let n = (1 << 14) + 4;
        let seen = unicomm_conformance::symmetric_all_reduce::<f32, _>(&cs, n, 50);
        assert_eq!(seen.unwrap(), vec![true; w], "world {w}");
        each_rank(&cs, |c| -> unicomm_core::Result<()> {
            let st = c.create_stream()?;
            let sym = c.alloc_symmetric::<f32>(n)?;
            let mut out = c.alloc::<f32>(n)?;
            for _ in 0..3 {
                c.symmetric_barrier(&sym, &st)?;
                let how = SymmetricOptions::new(ReduceOp::Sum, SymmetricAlgorithm::OneShot);
                c.all_reduce_symmetric(&sym, n, &mut out, how, &st)?;
            }
            st.synchronize()?;
            let pad = sym.kernel_args().pads[c.rank()] as usize;
            // SAFETY: words of this rank's own pad, mapped in this process while `sym`
            // lives, 4-byte aligned; the stream is idle.
            let word = |at: usize| unsafe {
                (*((pad + at) as *const std::sync::atomic::AtomicU32))
                    .load(std::sync::atomic::Ordering::SeqCst)
            };
            assert_eq!(word(PAD_CALL), 6, "rank {}", c.rank());
            // Every peer's arrival words (a rank does not meet itself: its own stay 0).
            for p in 0..c.world_size() {
                let met = if p == c.rank() { 0 } else { 4 * 5 + 2 };
                for b in 1..5 {
                    assert_eq!(word(pad_block_arrival(b, p)), met, "block {b} of {p}");
                }
                assert_eq!(word(pad_block_arrival(5, p)), 0, "block 5 of {p}");
            }
            Ok(())
        })
        .unwrap();
    }
}

/// Rank 1 allocates and never runs the all-reduce: rank 0's kernel ends at the deadline
/// with `Timeout` naming the missing rank, for each algorithm that waits on a peer.
#[test]
fn a_peer_that_never_comes_ends_the_wait_at_the_deadline() {
    for algorithm in unicomm_conformance::ALGORITHMS {
        let cs = comms(2, Duration::from_millis(400));
        let got = each_rank(&cs, |c| -> unicomm_core::Result<Option<Error>> {
            let st = c.create_stream()?;
            let sym = c.alloc_symmetric_lamport::<f32>(4)?;
            let mut out = c.alloc::<f32>(4)?;
            if c.rank() == 1 {
                std::thread::sleep(Duration::from_millis(900));
                return Ok(None);
            }
            let t0 = Instant::now();
            c.all_reduce_symmetric(
                &sym,
                4,
                &mut out,
                SymmetricOptions::new(ReduceOp::Sum, algorithm),
                &st,
            )?;
            let e = st.synchronize().err();
            assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
            Ok(e)
        })
        .unwrap();
        match &got[0] {
            Some(Error::Timeout { what, .. }) => assert!(what.contains("rank 1"), "{what}"),
            other => panic!("{algorithm:?}: {other:?}"),
        }
    }
}

/// An abort of rank 0's communicator from another thread ends its kernel's wait at once
/// (long before the 20 s deadline).
#[test]
fn an_abort_ends_a_waiting_kernel_at_once() {
    let cs = comms(2, Duration::from_secs(20));
    let c = &cs[0];
    let st = c.create_stream().unwrap();
    // The peer keeps its part (a peer that released it would end the wait at once, as a
    // departed peer) and never calls.
    let (sym, _peers, mut out) = std::thread::scope(|s| {
        let peer = s.spawn(|| cs[1].alloc_symmetric::<f32>(4));
        let sym = c.alloc_symmetric::<f32>(4).unwrap();
        let peers = peer.join().unwrap().unwrap();
        (sym, peers, c.alloc::<f32>(4).unwrap())
    });
    let t0 = Instant::now();
    c.all_reduce_symmetric(
        &sym,
        4,
        &mut out,
        SymmetricOptions::new(ReduceOp::Sum, SymmetricAlgorithm::OneShot),
        &st,
    )
    .unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            c.abort().unwrap();
        });
        let e = st.synchronize().unwrap_err();
        assert!(matches!(e, Error::Aborted { .. }), "{e:?}");
    });
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    drop(sym);
}

/// What the kernels cannot run is refused before anything is enqueued: a rank outside the
/// world, a count past the allocation, Lamport without its workspace, a type or reduction
/// the kernels lack, an output (or the fused step's FP8 output or scale) too short; sizes or counts that differ across the ranks are
/// `Mismatch` on every rank.
#[test]
fn misuse_is_refused() {
    let cs = comms(2, Duration::from_secs(5));
    let got = each_rank(&cs, |c| -> unicomm_core::Result<()> {
        let st = c.create_stream()?;
        let invalid = |r: unicomm_core::Result<()>, arg: &str| match r {
            Err(Error::InvalidArgument { argument, .. }) => assert_eq!(argument, arg),
            other => panic!("{arg}: {other:?}"),
        };
        let sym = c.alloc_symmetric::<f32>(8)?;
        invalid(sym.peer_address(2).map(drop), "rank");
        assert!(sym.peer_address(1).is_ok());
        let mut out = c.alloc::<f32>(8)?;
        let mut short = c.alloc::<f32>(2)?;
        let one = SymmetricOptions::new(ReduceOp::Sum, SymmetricAlgorithm::OneShot);
        invalid(c.all_reduce_symmetric(&sym, 9, &mut out, one, &st), "count");
        invalid(c.all_reduce_symmetric(&sym, 8, &mut short, one, &st), "out");
        invalid(
            c.all_reduce_symmetric(
                &sym,
                8,
                &mut out,
                SymmetricOptions::new(ReduceOp::Sum, SymmetricAlgorithm::Lamport),
                &st,
            ),
            "algorithm",
        );
        invalid(
            c.all_reduce_symmetric(
                &sym,
                8,
                &mut out,
                SymmetricOptions::new(ReduceOp::Avg, SymmetricAlgorithm::OneShot),
                &st,
            ),
            "op",
        );
        // The fused step's FP8 output shorter than the count, and a scale of no element.
        let (mut res, w) = (c.alloc::<f32>(8)?, c.alloc::<f32>(4)?);
        let (mut q, mut q_short) = (c.alloc::<unicomm_core::F8E4M3>(8)?, c.alloc(7)?);
        let (scale, no_scale) = (c.alloc::<f32>(1)?, c.alloc::<f32>(0)?);
        let how = RmsNormOptions::new(1e-5, SymmetricAlgorithm::OneShot);
        let fp8 = |out, scale| unicomm_core::Fp8Buffers { out, scale };
        let mut fused = |f| c.all_reduce_rms_norm_fp8(&sym, 8, &mut res, &w, &mut out, f, how, &st);
        invalid(fused(fp8(&mut q_short, &scale)), "fp8 out");
        invalid(fused(fp8(&mut q, &no_scale)), "fp8 scale");
        let ints = c.alloc_symmetric::<i32>(4)?;
        let mut iout = c.alloc::<i32>(4)?;
        assert!(matches!(
            c.all_reduce_symmetric(&ints, 4, &mut iout, one, &st),
            Err(Error::Unsupported { .. })
        ));
        // Not inside a group: they are not the library's calls.
        invalid(
            c.group(|| c.all_reduce_symmetric(&sym, 8, &mut out, one, &st)),
            "group",
        );
        // Sizes that differ at allocation: Mismatch on both ranks, naming bytes (what it
        // compares), not a count.
        match c.alloc_symmetric::<f32>(16 + c.rank()) {
            Err(Error::Mismatch {
                what: "bytes",
                detail,
            }) => {
                assert!(
                    detail.contains("64 bytes") && detail.contains("68 bytes"),
                    "{detail}"
                );
            }
            other => panic!("{:?}", other.map(drop)),
        }
        Ok(())
    });
    got.unwrap();
}

/// Counts that differ across the ranks: each rank's kernel compares the counts in the pads
/// after its first barrier and reports `Mismatch`, never reading past a peer's data.
#[test]
fn counts_that_differ_across_ranks_are_mismatch_on_every_rank() {
    let cs = comms(2, Duration::from_secs(5));
    let got = each_rank(&cs, |c| -> unicomm_core::Result<Error> {
        let st = c.create_stream()?;
        let sym = c.alloc_symmetric::<f32>(8)?;
        let mut out = c.alloc::<f32>(8)?;
        let n = 4 + c.rank();
        c.all_reduce_symmetric(
            &sym,
            n,
            &mut out,
            SymmetricOptions::new(ReduceOp::Sum, SymmetricAlgorithm::TwoShot),
            &st,
        )?;
        Ok(st.synchronize().unwrap_err())
    })
    .unwrap();
    for e in got {
        assert!(matches!(e, Error::Mismatch { what: "count", .. }), "{e:?}");
    }
}

/// The mock's windows are not mapped across ranks: a window's peer address is
/// `Unsupported` there, naming what gives one (symmetric memory), never a wrong address.
#[test]
fn a_windows_peer_address_is_unsupported_on_the_mock_naming_symmetric_memory() {
    let cs = comms(1, Duration::from_secs(5));
    let c = &cs[0];
    let st = c.create_stream().unwrap();
    let w = c
        .register_window(c.upload(&[0u32; 4], &st).unwrap())
        .unwrap();
    assert!(matches!(
        w.peer_address(1),
        Err(Error::InvalidArgument { .. })
    ));
    match w.peer_address(0) {
        Err(Error::Unsupported { what, .. }) => assert!(what.contains("peer addresses"), "{what}"),
        other => panic!("{other:?}"),
    }
}
