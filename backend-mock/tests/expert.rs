//! Expert parallelism on the mock: dispatch and combine exact at worlds 1-8 (threads),
//! eager and over graph replays with a new routing before each, top-k above the world; a
//! capacity exceeded or an expert id out of range on one rank refused alike on every rank,
//! the ranks in step after it; a rank that never comes ends the others' wait at the deadline.

use std::time::{Duration, Instant};

use unicomm_core::{each_rank, Comm, DeviceStream, Error, ExpertConfig, ExpertTokens};
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
        let st = c.create_stream()?;
        let g = c.expert_group::<f32>(cfg)?;
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_millis(900));
            return Ok(None);
        }
        let (tokens, ids) = (c.upload(&[1.0f32; 2], &st)?, c.upload(&[1i32], &st)?);
        let (mut out, mut counts) = (c.alloc::<f32>(g.received_len())?, c.alloc::<i32>(1)?);
        let t0 = Instant::now();
        let o = ExpertTokens {
            tokens: &mut out,
            counts: &mut counts,
        };
        g.dispatch(&tokens, &ids, o, &st)?;
        let e = st.synchronize().err();
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        Ok(e)
    })
    .unwrap();
    match &got[0] {
        Some(Error::Timeout { what, .. }) => assert!(what.contains("rank 1"), "{what}"),
        other => panic!("{other:?}"),
    }
}
