//! Expert parallelism on the mock: dispatch and combine exact at worlds 1-8 (threads),
//! eager and over graph replays with a new routing before each, top-k above the world; a
//! capacity exceeded or an expert id out of range on one rank refused alike on every rank,
//! the ranks in step after it; a rank that never comes ends the others' wait at the deadline.

use std::time::{Duration, Instant};

use unicomm_core::{
    each_rank, Buffer, Comm, DeviceStream, Error, ExpertConfig, ExpertGroup, ExpertTokens, RankMask,
};
use unicomm_mock::{local_comms_with, MockComm, MockConfig};

fn comms(world: usize) -> Vec<Comm<MockComm>> {
    comms_by(world, Duration::from_secs(20))
}

fn comms_by(world: usize, timeout: Duration) -> Vec<Comm<MockComm>> {
    let config = MockConfig {
        timeout,
        ..MockConfig::default()
    };
    local_comms_with(world, config).unwrap()
}

/// One dispatch on `g` of `tokens` routed by `ids`, synchronized: the received rows and
/// what the dispatch returned (its counts are not kept).
fn dispatch_once(
    c: &Comm<MockComm>,
    g: &ExpertGroup<'_, f32, MockComm>,
    tokens: &[f32],
    ids: &[i32],
) -> unicomm_core::Result<(Buffer<f32, MockComm>, unicomm_core::Result<()>)> {
    let st = c.create_stream()?;
    let (tokens, ids) = (c.upload(tokens, &st)?, c.upload(ids, &st)?);
    let mut out = c.alloc::<f32>(g.received_len())?;
    let mut counts = c.alloc::<i32>(g.local_experts())?;
    let o = ExpertTokens {
        tokens: &mut out,
        counts: &mut counts,
    };
    let done = g
        .dispatch(&tokens, &ids, o, &st)
        .and_then(|()| st.synchronize());
    Ok((out, done))
}

fn config(w: usize, top_k: usize) -> ExpertConfig {
    ExpertConfig {
        experts: 2 * w,
        max_tokens: 16,
        hidden: 5,
        top_k,
    }
}

#[test]
fn dispatch_and_combine_are_exact_at_worlds_1_to_8_eager_and_replayed() {
    for w in [1, 2, 3, 4, 8] {
        let cs = comms(w);
        assert!(cs[0].capabilities().device_counts);
        for top_k in [1, 3] {
            let seen = unicomm_conformance::expert_dispatch_combine(&cs, config(w, top_k), 8, 10);
            assert_eq!(seen.unwrap(), vec![true; w], "world {w}, top-{top_k}");
        }
    }
}

/// Groups over the survivors of layouts of 2-8 ranks with one to three ranks masked: exact,
/// eager and replayed, the masked ranks' experts receiving and contributing nothing.
#[test]
fn masked_layouts_are_exact_at_worlds_2_to_8_eager_and_replayed() {
    for (layout, masked) in [
        (2, &[1][..]),
        (4, &[2]),
        (5, &[0, 3]),
        (8, &[7]),
        (8, &[1, 2, 5]),
    ] {
        let mask = RankMask::new(layout, masked).unwrap();
        let cs = comms(mask.survivors());
        for top_k in [1, 3] {
            let seen = unicomm_conformance::expert_dispatch_combine_masked(
                &cs,
                config(layout, top_k),
                mask,
                6,
                6,
            );
            assert_eq!(
                seen.unwrap(),
                vec![true; mask.survivors()],
                "{mask:?}, top-{top_k}"
            );
        }
    }
}

/// FP8 tokens with their scales (DeepSeek's one per 128 channels, here 3 a token) arrive
/// byte- and bit-exact at worlds 1-8.
#[test]
fn an_fp8_dispatch_forwards_every_byte_and_scale_at_worlds_1_to_8() {
    for w in [1, 2, 3, 4, 8] {
        let cs = comms(w);
        let cfg = ExpertConfig {
            experts: 2 * w,
            max_tokens: 24,
            hidden: 7,
            top_k: 3,
        };
        let seen = unicomm_conformance::expert_dispatch_fp8(&cs, cfg, 3, 6, 10);
        assert_eq!(seen.unwrap(), vec![true; w], "world {w}");
    }
}

/// Rank `w - 1` routes every entry of two tokens to expert 0 (past `max_tokens` 2), then
/// names expert `experts`: every rank gets the same `InvalidArgument`, then an exact
/// dispatch (nothing lost, the ranks in step).
#[test]
fn an_overflow_or_a_bad_expert_on_one_rank_is_refused_alike_on_every_rank() {
    for w in [1, 2, 3] {
        let cs = comms(w);
        let cfg = ExpertConfig {
            experts: w,
            max_tokens: 2,
            hidden: 3,
            top_k: 2,
        };
        let seen = each_rank(&cs, |c| -> unicomm_core::Result<Vec<String>> {
            let (r, st) = (c.rank(), c.create_stream()?);
            let g = c.expert_group::<f32>(cfg)?;
            let tokens = c.upload(&[1.0f32; 6], &st)?;
            let mut out = c.alloc::<f32>(g.received_len())?;
            let mut counts = c.alloc::<i32>(1)?;
            let mut seen = Vec::new();
            for bad in [[0, 0, 0, 0], [0, w as i32, -1, -1], [0, -1, -1, -1]] {
                let mine = if r == w - 1 { bad } else { [0, -1, -1, -1] };
                let ids = c.upload(&mine, &st)?;
                let o = ExpertTokens {
                    tokens: &mut out,
                    counts: &mut counts,
                };
                let got = g
                    .dispatch(&tokens, &ids, o, &st)
                    .and_then(|()| st.synchronize());
                match got {
                    Err(e @ Error::InvalidArgument { .. }) => seen.push(e.to_string()),
                    Ok(()) => seen.push(format!("{:?}", counts.copy_to_host(&st)?)),
                    Err(e) => return Err(e),
                }
            }
            Ok(seen)
        })
        .unwrap();
        for s in &seen {
            assert_eq!(s[..2], seen[0][..2], "world {w}");
        }
        assert!(seen[0][0].contains("max_tokens 2"), "{:?}", seen[0]);
        assert!(seen[0][1].contains("outside 0.."), "{:?}", seen[0]);
        // Then every rank sends its first token to expert 0 (rank 0's): all of them arrive.
        for (r, s) in seen.iter().enumerate() {
            let want = if r == 0 {
                format!("[{w}]")
            } else {
                "[0]".into()
            };
            assert_eq!(s[2], want, "rank {r} of {w}");
        }
    }
}

/// Rank 1 holds its part of the group and never dispatches: rank 0's dispatch ends at the
/// deadline with `Timeout` naming rank 1 (no wait on a peer without one).
#[test]
fn a_rank_that_never_dispatches_ends_the_wait_at_the_deadline() {
    let cs = comms_by(2, Duration::from_millis(400));
    let cfg = ExpertConfig {
        experts: 2,
        max_tokens: 4,
        hidden: 2,
        top_k: 1,
    };
    let got = each_rank(&cs, |c| -> unicomm_core::Result<Option<Error>> {
        let g = c.expert_group::<f32>(cfg)?;
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_millis(900));
            return Ok(None);
        }
        let t0 = Instant::now();
        let (_, done) = dispatch_once(c, &g, &[1.0; 2], &[1])?;
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        Ok(done.err())
    })
    .unwrap();
    match &got[0] {
        Some(Error::Timeout { what, .. }) => assert!(what.contains("rank 1"), "{what}"),
        other => panic!("{other:?}"),
    }
}

/// A layout of 4 ranks whose rank 2 is gone, its group over the 3 survivors: entries
/// routed to rank 2's experts are neither sent nor summed (as `-1` entries), every other
/// expert keeps its layout place, and the group says which rank is masked.
#[test]
fn a_masked_ranks_experts_receive_nothing_and_contribute_nothing() {
    let cs = comms(3);
    let mask = RankMask::new(4, &[2]).unwrap();
    let cfg = ExpertConfig {
        experts: 8,
        max_tokens: 16,
        hidden: 3,
        top_k: 3,
    };
    let (n, h, k, local) = (6, cfg.hidden, cfg.top_k, 2);
    // Rank p's routing over all 8 experts (rank 2's 4 and 5 among them) and its tokens.
    let ids_of = |p: usize| -> Vec<i32> {
        (0..n * k)
            .map(|i| match (i * 7 + p * 3) % 10 {
                9 => -1,
                x => (x % 8) as i32,
            })
            .collect()
    };
    let tokens_of = |p: usize| -> Vec<f32> {
        (0..n * h)
            .map(|i| (p * 100 + i / h * 10 + i % h) as f32)
            .collect()
    };
    let got = each_rank(
        &cs,
        |c| -> unicomm_core::Result<(Vec<i32>, Vec<f32>, Vec<f32>)> {
            let st = c.create_stream()?;
            let unmasked = c.expert_group_masked::<f32>(cfg, RankMask::none(4), None);
            assert!(
                matches!(unmasked, Err(Error::InvalidArgument { .. })),
                "a layout of 4 on 3 ranks"
            );
            let g = c.expert_group_masked::<f32>(cfg, mask, None)?;
            assert_eq!(g.mask().masked(), vec![2]);
            let p = c.rank();
            let (tokens, ids) = (c.upload(&tokens_of(p), &st)?, c.upload(&ids_of(p), &st)?);
            let (mut out, mut counts) = (c.alloc::<f32>(g.received_len())?, c.alloc::<i32>(local)?);
            let o = ExpertTokens {
                tokens: &mut out,
                counts: &mut counts,
            };
            g.dispatch(&tokens, &ids, o, &st)?;
            let (received, counts) = (out.copy_to_host(&st)?, counts.copy_to_host(&st)?);
            // Each local expert multiplies its rows by its global id + 1.
            let lr = mask.layout_rank(p);
            let slot_rows = 3 * cfg.max_tokens;
            let scaled: Vec<f32> = received
                .iter()
                .enumerate()
                .map(|(i, &x)| x * ((lr * local + i / h / slot_rows) + 1) as f32)
                .collect();
            let expert_out = c.upload(&scaled, &st)?;
            let weights = c.upload(&vec![0.5f32; n * k], &st)?;
            let mut sums = c.alloc::<f32>(n * h)?;
            g.combine(&expert_out, &ids, &weights, &mut sums, &st)?;
            Ok((counts, received, sums.copy_to_host(&st)?))
        },
    )
    .unwrap();
    for (p, (counts, received, sums)) in got.iter().enumerate() {
        let lr = mask.layout_rank(p);
        for (l, &count) in counts.iter().enumerate() {
            let e = (lr * local + l) as i32;
            let mut want = Vec::new();
            for s in 0..3 {
                for (i, _) in ids_of(s).iter().enumerate().filter(|(_, &x)| x == e) {
                    want.extend_from_slice(&tokens_of(s)[i / k * h..(i / k + 1) * h]);
                }
            }
            let at = l * 3 * cfg.max_tokens * h;
            assert_eq!(count as usize, want.len() / h, "rank {p}, expert {e}");
            assert_eq!(
                received[at..at + want.len()],
                want[..],
                "rank {p}, expert {e}"
            );
        }
        let (ids, tokens) = (ids_of(p), tokens_of(p));
        for t in 0..n {
            for j in 0..h {
                let mut acc = 0.0f32;
                for q in 0..k {
                    let id = ids[t * k + q];
                    if id >= 0 && !mask.is_masked(id as usize / local) {
                        acc += 0.5 * (tokens[t * h + j] * (id + 1) as f32);
                    }
                }
                assert_eq!(sums[t * h + j], acc, "rank {p}, token {t}, element {j}");
            }
        }
    }
}

/// Survivors that pass different masks get `Mismatch` naming the masked ranks on every rank.
#[test]
fn survivors_with_different_masks_are_refused_alike() {
    let cs = comms(2);
    let cfg = ExpertConfig {
        experts: 3,
        max_tokens: 4,
        hidden: 2,
        top_k: 1,
    };
    let got = each_rank(&cs, |c| -> unicomm_core::Result<String> {
        let mask = RankMask::new(3, &[c.rank()]).unwrap();
        let g = c.expert_group_masked::<f32>(cfg, mask, None)?;
        let (_, e) = dispatch_once(c, &g, &[1.0; 2], &[0])?;
        Ok(format!("{e:?}"))
    })
    .unwrap();
    for e in &got {
        assert!(e.contains("Mismatch") && e.contains("masked"), "{e}");
    }
}

/// The whole story of a dead expert rank: rank 2 of 4 stops coming, the survivors'
/// dispatch ends at the deadline naming it, they shrink the communicator and make the group
/// again over the same layout with rank 2 masked, and their next dispatch and combine are
/// exact, rank 2's experts receiving and contributing nothing.
#[test]
fn survivors_of_a_dead_expert_rank_shrink_mask_it_and_go_on() {
    let cs = comms_by(4, Duration::from_millis(400));
    let cfg = ExpertConfig {
        experts: 4,
        max_tokens: 4,
        hidden: 2,
        top_k: 2,
    };
    // Token 0 to experts 2 (rank 2's) and 3; token 1 to expert 0.
    let (tokens, ids) = ([1.0f32, 2.0, 3.0, 4.0], [2i32, 3, 0, -1]);
    let got = each_rank(
        &cs,
        |c| -> unicomm_core::Result<Option<(String, Vec<f32>)>> {
            let g = c.expert_group::<f32>(cfg)?;
            let r = c.rank();
            if r == 2 {
                std::thread::sleep(Duration::from_millis(1500));
                return Ok(None);
            }
            let (_, e) = dispatch_once(c, &g, &tokens, &ids)?;
            let lost = match e {
                Err(e @ (Error::Aborted { .. } | Error::Timeout { .. })) => e.to_string(),
                other => panic!("rank {r}: {other:?}"),
            };
            drop(g);
            let small = c.shrink(&[2], unicomm_core::ShrinkMode::Abort)?;
            let g = small.expert_group_masked::<f32>(cfg, RankMask::new(4, &[2])?, None)?;
            let (out, done) = dispatch_once(&small, &g, &tokens, &ids)?;
            done?;
            // Each expert returns its rows as they came: the combine sums each token's live
            // experts' copies by weight 1.
            let st = small.create_stream()?;
            let ids = small.upload(&ids, &st)?;
            let weights = small.upload(&[1.0f32; 4], &st)?;
            let mut sums = small.alloc::<f32>(4)?;
            g.combine(&out, &ids, &weights, &mut sums, &st)?;
            Ok(Some((lost, sums.copy_to_host(&st)?)))
        },
    )
    .unwrap();
    let mut named = false;
    for (r, got) in got.into_iter().enumerate() {
        match got {
            // Token 0: expert 2 masked, expert 3 alive (one copy); token 1: expert 0.
            Some((lost, s)) => {
                named |= lost.contains("rank 2");
                assert_eq!(s, vec![1.0, 2.0, 3.0, 4.0], "rank {r}");
            }
            None => assert_eq!(r, 2),
        }
    }
    assert!(named, "no survivor's error named rank 2");
}

/// The engine case holds unicomm's kernels (bf16 tokens, each expert's tokens as a set, the
/// combine bit-exact) at worlds 1-4, eager and replayed; NCCL EP is no engine of the mock's:
/// every rank says so, naming it, and nothing runs.
#[test]
fn the_engine_case_holds_the_kernels_and_the_mock_has_no_nccl_ep() {
    use unicomm_conformance::{expert_engine_matches_the_kernels as engine_case, EngineRun};
    use unicomm_core::ExpertEngine;
    for w in [1, 2, 4] {
        let cs = comms(w);
        let cfg = ExpertConfig {
            experts: 4 * w,
            max_tokens: 8,
            hidden: 16,
            top_k: 4,
        };
        let seen = engine_case(&cs, ExpertEngine::Kernels, cfg, 6, 6).unwrap();
        assert_eq!(seen, vec![EngineRun::Matched; w], "world {w}");
        for run in engine_case(&cs, ExpertEngine::Library, cfg, 6, 6).unwrap() {
            let EngineRun::NotHere(why) = run else {
                panic!("the mock ran NCCL EP");
            };
            assert!(why.contains("NCCL EP"), "{why}");
        }
    }
}

/// The high-throughput mode at worlds 1-8 (threads): each rank's rows packed expert-major
/// bit-exact with each expert's count and first row, the combine exact, eager and
/// replayed; a `max_recv` some rounds pass refused alike on every rank, the ranks in step.
#[test]
fn the_packed_dispatch_and_combine_are_exact_at_worlds_1_to_8() {
    for w in [1, 2, 3, 4, 8] {
        let cs = comms(w);
        assert!(cs[0].capabilities().packed_dispatch);
        for (top_k, max_recv) in [(1, 10), (3, 28)] {
            let seen = unicomm_conformance::expert_dispatch_combine_packed(
                &cs,
                config(w, top_k),
                max_recv,
                8,
                10,
            );
            assert_eq!(seen.unwrap(), vec![true; w], "world {w}, top-{top_k}");
        }
    }
}

/// FP8 tokens with their scales in the high-throughput mode: packed with their rows,
/// byte- and bit-exact, at worlds 1-8.
#[test]
fn an_fp8_dispatch_packs_every_byte_and_scale_at_worlds_1_to_8() {
    for w in [1, 2, 3, 4, 8] {
        let cs = comms(w);
        let cfg = ExpertConfig {
            experts: 2 * w,
            max_tokens: 24,
            hidden: 7,
            top_k: 3,
        };
        let mode = unicomm_core::ExpertMode::HighThroughput {
            max_recv: (cfg.max_tokens + cfg.top_k) * w,
        };
        let seen = unicomm_conformance::expert_dispatch_fp8_in(&cs, cfg, 3, mode, 6, 10);
        assert_eq!(seen.unwrap(), vec![true; w], "world {w}");
    }
}
