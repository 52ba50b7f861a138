//! The mock's environment variables: bad or absurd values are `InvalidArgument` naming the
//! variable and the accepted range, never ignored, never a panic. One test: it sets
//! process-wide variables.

use std::time::Duration;

use unicomm_core::Error;
use unicomm_mock::{MockConfig, MAX_RANKS};

fn named(r: unicomm_core::Result<impl std::fmt::Debug>, var: &str) {
    match r {
        Err(Error::InvalidArgument { argument, reason }) => {
            assert_eq!(argument, var);
            assert!(reason.contains("..="), "the range is named: {reason}");
        }
        other => panic!("{var}: expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn bad_settings_are_errors_that_name_the_variable() {
    for bad in [
        "abc",
        "200ms",
        "0",
        "-5",
        "99999999999999999999",
        "86400001",
    ] {
        std::env::set_var("UNICOMM_MOCK_TIMEOUT_MS", bad);
        named(MockConfig::from_env(), "UNICOMM_MOCK_TIMEOUT_MS");
        named(unicomm_mock::local_comms(2), "UNICOMM_MOCK_TIMEOUT_MS");
    }
    // The collective check's switch: a malformed value is refused at creation, as on the GPU
    // backends, instead of the check silently off.
    std::env::set_var("UNICOMM_MOCK_TIMEOUT_MS", "1500");
    std::env::set_var("UNICOMM_CHECK_COLLECTIVES", "yes");
    match unicomm_mock::local_comms(2) {
        Err(Error::InvalidArgument { argument, .. }) => {
            assert_eq!(argument, "UNICOMM_CHECK_COLLECTIVES")
        }
        other => panic!(
            "UNICOMM_CHECK_COLLECTIVES=yes: {:?}",
            other.map(|v| v.len())
        ),
    }
    std::env::remove_var("UNICOMM_CHECK_COLLECTIVES");
    std::env::set_var("UNICOMM_MOCK_TIMEOUT_MS", "1500");
    assert_eq!(
        MockConfig::from_env().unwrap().timeout,
        Duration::from_millis(1500)
    );
    std::env::remove_var("UNICOMM_MOCK_TIMEOUT_MS");
    assert_eq!(
        MockConfig::from_env().unwrap().timeout,
        unicomm_mock::DEFAULT_TIMEOUT
    );

    for bad in ["0", "x", "1099511627776", &(MAX_RANKS + 1).to_string()] {
        std::env::set_var("UNICOMM_MOCK_RANKS", bad);
        named(unicomm_mock::ranks_from_env(), "UNICOMM_MOCK_RANKS");
    }
    std::env::remove_var("UNICOMM_MOCK_RANKS");

    // The target the mock stands for: a malformed one is refused naming the variable and
    // the forms; a valid one reaches every communicator local_comms makes.
    for bad in ["nccl", "cuda-12.8.0", "nccl-2.28.9-90", "rccl-2.22.3-sm90"] {
        std::env::set_var("UNICOMM_MOCK_TARGET", bad);
        match unicomm_mock::local_comms(2) {
            Err(Error::InvalidArgument { argument, reason }) => {
                assert_eq!(argument, "UNICOMM_MOCK_TARGET");
                assert!(reason.contains("rccl-MAJOR.MINOR.PATCH"), "{reason}");
            }
            other => panic!("UNICOMM_MOCK_TARGET={bad}: {:?}", other.map(|v| v.len())),
        }
    }
    std::env::set_var("UNICOMM_MOCK_TARGET", "rccl-2.22.3");
    let c = unicomm_mock::local_comms(1).unwrap();
    assert!(!c[0].capabilities().fp8_reduce && c[0].capabilities().native_all_to_all_v);
    std::env::remove_var("UNICOMM_MOCK_TARGET");
    assert!(
        unicomm_mock::local_comms(1).unwrap()[0]
            .capabilities()
            .fp8_reduce
    );

    // Configurations built in code are checked too (no Instant overflow, no huge worlds).
    let huge = MockConfig {
        timeout: Duration::MAX,
        faults: vec![],
        ..MockConfig::default()
    };
    assert!(matches!(
        unicomm_mock::world(2, huge),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        unicomm_mock::world(1 << 40, MockConfig::default()),
        Err(Error::InvalidArgument { .. })
    ));
}
