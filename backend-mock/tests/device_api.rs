//! NCCL's device API runs NCCL's device code, which the mock cannot run: a device
//! communicator is `Unsupported` on the mock, naming the release that has one (a documented
//! difference by vendor, docs/symmetric.md), and the conformance suite's device-API case
//! reports it unsupported on every rank rather than passing.

use std::time::Duration;

use unicomm_core::{DeviceCommRequirements, Error};
use unicomm_mock::{local_comms_with, MockConfig};

#[test]
fn a_device_communicator_is_unsupported_on_the_mock_naming_nccl_s_release() {
    let config = MockConfig {
        timeout: Duration::from_secs(5),
        ..MockConfig::default()
    };
    let cs = local_comms_with(2, config).unwrap();
    let reqs = DeviceCommRequirements::runtime(2);
    for c in &cs {
        match c.device_comm(&reqs) {
            Err(Error::Unsupported { needs, .. }) => assert!(needs.contains("2.31.2"), "{needs}"),
            other => panic!("{other:?}"),
        }
    }
    let seen = unicomm_conformance::device_api_all_reduce::<f32, _>(&cs, 8, 2, &reqs).unwrap();
    assert_eq!(seen, vec![false, false]);
}
