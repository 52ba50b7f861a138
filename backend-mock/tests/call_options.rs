//! Per-call options on the mock, as the target takes them: a mock standing for NCCL 2.32
//! runs a scope's collectives exactly and refuses a barrier with options (NCCL has no
//! `nccl*Config` for it); one standing for 2.28.9 refuses the options naming 2.32.

use unicomm_core::{Comm, Error};
use unicomm_mock::{local_comms_with, MockComm, MockConfig};

fn comms(world: usize, target: &str) -> Vec<Comm<MockComm>> {
    local_comms_with(world, MockConfig::standing_for(target).unwrap()).unwrap()
}

#[test]
fn a_mock_of_nccl_2_32_takes_the_options_at_every_world_size() {
    for w in [1, 2, 3] {
        let got = unicomm_conformance::call_options(&comms(w, "nccl-2.32.3")).unwrap();
        assert_eq!(got, vec![true; w]);
    }
}

#[test]
fn a_mock_of_nccl_2_28_refuses_them_naming_2_32() {
    let got = unicomm_conformance::call_options(&comms(2, "nccl-2.28.9")).unwrap();
    assert_eq!(got, vec![false; 2]);
    let c = &comms(1, "nccl-2.28.9")[0];
    let st = c.create_stream().unwrap();
    let mut b = c.alloc::<f32>(4).unwrap();
    let r = c.with_options(&unicomm_conformance::portable_options(), || {
        c.all_reduce_in_place(&mut b, unicomm_core::ReduceOp::Sum, &st)
    });
    match r {
        Err(Error::Unsupported { needs, .. }) => {
            assert!(needs.contains("NCCL >= 2.32.0"), "{needs}")
        }
        other => panic!("{other:?}"),
    }
}
