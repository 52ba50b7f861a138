//! Symmetric calls that disagree across ranks get `Mismatch` on every rank, never `Ok` with
//! another call's data: the conformance suite's disagreements (count, reduction,
//! algorithm, type of equal bytes, the fused norm's width and epsilon, fusion, a barrier)
//! over 100 attempts each, the differing rank rotating, at worlds 2 and 3 (threads; the
//! processes' run is `procs.rs`); Lamport calls of count 0 among others, exact.

use std::time::Duration;

use unicomm_conformance::{
    lamport_count_zero_sequence, symmetric_disagreement, Disagreement, ALGORITHMS,
};
use unicomm_core::{each_rank, Comm};
use unicomm_mock::{local_comms_with, MockComm, MockConfig};

fn comms(world: usize) -> Vec<Comm<MockComm>> {
    let config = MockConfig {
        timeout: Duration::from_secs(20),
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
                let seen = each_rank(&cs, |c| symmetric_disagreement(c, (d, algorithm), 100));
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
