//! Expert parallelism on the mock: dispatch and combine exact at worlds 1-8 (threads),
//! eager and over graph replays with a new routing before each, top-k above the world; a
//! capacity exceeded or an expert id out of range on one rank refused alike on every rank,
//! the ranks in step after it.

use std::time::Duration;

use unicomm_core::{each_rank, Comm, DeviceStream, Error, ExpertConfig, ExpertTokens};
use unicomm_mock::{local_comms_with, MockComm, MockConfig};

fn comms(world: usize) -> Vec<Comm<MockComm>> {
    let config = MockConfig {
        timeout: Duration::from_secs(20),
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
        for top_k in [1, 3] {
            let seen = unicomm_conformance::expert_dispatch_combine(&cs, config(w, top_k), 8, 10);
            assert_eq!(seen.unwrap(), vec![true; w], "world {w}, top-{top_k}");
        }
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
