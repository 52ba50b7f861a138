//! The conformance suite on the mock backend: every world size, both modes.

use unicomm_conformance::{Case, CaseFn, Count, Failure, Harness, Mode};
use unicomm_mock::MockComm;

struct Mock;

impl Harness for Mock {
    type C = MockComm;

    fn with_comms(
        &self,
        world: usize,
        f: &mut CaseFn<'_, MockComm>,
    ) -> std::result::Result<(), Failure> {
        // A fresh world per case: creating one is cheap, and cases stay independent.
        f(&unicomm_mock::local_comms(world)?)
    }

    /// What NCCL refuses by design, as the mock stands for NCCL (its default target) and
    /// refuses it too.
    fn unsupported(&self, case: &Case) -> bool {
        unicomm_conformance::refused_by_design(case, true)
    }

    /// Both modes, except that 1 Mi-element cases run one thread per rank only: grouping
    /// does not depend on the count, and the suite must stay within minutes on 2 cores.
    fn modes(&self, case: &Case) -> &'static [Mode] {
        if case.count == Count::Large {
            &[Mode::ThreadPerRank]
        } else {
            &[Mode::ThreadPerRank, Mode::SingleThread]
        }
    }
}

unicomm_conformance::conformance_suite!(Mock);
