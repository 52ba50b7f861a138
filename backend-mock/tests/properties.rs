//! Property tests of the collectives on the mock against the host reference (the contract's
//! collectives): proptest draws the collective, type, reduction, count, world size, placement and
//! registration; every rank's output must equal the reference, in both modes (one thread
//! per rank, one thread for all). Bounded (`PROPTEST_CASES`, default 96) to keep CI short;
//! a failure is shrunk to the smallest case and printed.

use proptest::prelude::*;
use unicomm_conformance::{run_case, Case, CaseFn, Coll, Count, Failure, Harness, Place, Reg};
use unicomm_core::{DataType, ReduceOp};
use unicomm_mock::MockComm;

struct Mock;

impl Harness for Mock {
    type C = MockComm;
    fn with_comms(&self, world: usize, f: &mut CaseFn<'_, MockComm>) -> Result<(), Failure> {
        f(&unicomm_mock::local_comms(world)?)
    }
    /// What NCCL refuses by design, as the mock stands for the newest NCCL.
    fn unsupported(&self, case: &Case) -> bool {
        unicomm_conformance::refused_by_design(case, true)
    }
}

fn case() -> impl Strategy<Value = Case> {
    let coll = prop::sample::select(Coll::ALL.to_vec());
    let dtype = prop::sample::select(DataType::ALL.to_vec());
    let op = prop::sample::select(ReduceOp::ALL.to_vec());
    let reg = prop::sample::select(vec![Reg::None, Reg::Buffer, Reg::Window, Reg::Auto]);
    (
        coll,
        dtype,
        op,
        0usize..3000,
        1usize..=5,
        any::<bool>(),
        reg,
    )
        .prop_map(|(coll, dtype, op, n, world, in_place, reg)| {
            // Only what the collective supports (Coll::support, the suite's one table).
            let s = coll.support();
            Case {
                coll,
                dtype,
                op,
                count: Count::Exactly(n),
                place: if in_place && s.in_place {
                    Place::In
                } else {
                    Place::Out
                },
                reg: if reg.is_collective() && !s.windows {
                    Reg::Buffer
                } else {
                    reg
                },
                world,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(96),
        ..ProptestConfig::default()
    })]

    #[test]
    fn collectives_match_the_host_reference(c in case()) {
        if let Err(e) = run_case(&Mock, c) {
            prop_assert!(false, "{}", e);
        }
    }
}
