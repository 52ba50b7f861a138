//! `Vendor::Auto` means the GPU vendors: on a machine where none is usable (this CI machine,
//! or a GPU node whose NCCL failed to load) it is an error naming why each vendor was
//! passed over, never CPU threads. The mock is chosen explicitly (`UNICOMM_VENDOR=mock`).
//! `cargo xtask test` runs it in the workspace's build, which compiles every backend in
//! (none usable on CI), and says so with `UNICOMM_EXPECT_ALL_BACKENDS=1`.

use unicomm::{Error, Vendor};

/// One test, because it sets process-wide environment variables.
#[test]
fn auto_never_falls_back_to_the_mock() {
    if std::env::var_os("UNICOMM_EXPECT_ALL_BACKENDS").is_some_and(|v| v == "1") {
        // What makes this the case of every backend compiled in, none usable.
        let missing: Vec<&str> = [
            ("mock", cfg!(feature = "mock")),
            ("nccl", cfg!(feature = "nccl")),
            ("rccl", cfg!(feature = "rccl")),
        ]
        .into_iter()
        .filter(|(_, on)| !on)
        .map(|(name, _)| name)
        .collect();
        assert!(
            missing.is_empty(),
            "this build lacks the backends {missing:?}"
        );
    }
    std::env::remove_var("UNICOMM_VENDOR");
    if let Ok((v, why)) = unicomm::resolve(Vendor::Auto) {
        // A machine with a usable GPU vendor: Auto picks it, and it is not the mock.
        assert_ne!(v, Vendor::Mock, "{why}");
        return;
    }
    match unicomm::local_comms(Vendor::Auto) {
        Err(Error::NoDevice { detail, .. }) => {
            assert!(detail.contains("cuda: "), "{detail}");
            assert!(detail.contains("rocm: "), "{detail}");
            assert!(detail.contains("UNICOMM_VENDOR=mock"), "{detail}");
        }
        Err(other) => panic!("expected NoDevice naming both vendors, got {other}"),
        Ok(comms) => panic!(
            "Vendor::Auto gave {} communicators of {} on a machine without a usable GPU",
            comms.len(),
            comms[0].capabilities().backend
        ),
    }
    assert!(unicomm::from_env(Vendor::Auto).is_err());

    // The explicit choice, from the environment, without a code change.
    std::env::set_var("UNICOMM_VENDOR", "mock");
    let (v, why) = unicomm::resolve(Vendor::Auto).expect("UNICOMM_VENDOR=mock");
    assert_eq!(v, Vendor::Mock);
    assert!(why.contains("UNICOMM_VENDOR"), "{why}");
    let comms = unicomm::local_comms_n(Vendor::Auto, Some(2)).expect("two mock ranks");
    assert_eq!(comms[0].capabilities().backend, "mock");
    drop(comms);

    std::env::set_var("UNICOMM_VENDOR", "gpu-please");
    match unicomm::resolve(Vendor::Auto) {
        Err(Error::InvalidArgument { argument, .. }) => assert_eq!(argument, "UNICOMM_VENDOR"),
        other => panic!("expected InvalidArgument for UNICOMM_VENDOR, got {other:?}"),
    }
    std::env::remove_var("UNICOMM_VENDOR");
}

#[test]
fn vendor_strings_parse_as_documented() {
    for (s, v) in [
        ("auto", Vendor::Auto),
        ("cuda", Vendor::Cuda),
        ("NVIDIA", Vendor::Cuda),
        ("nccl", Vendor::Cuda),
        ("rocm", Vendor::Rocm),
        ("amd", Vendor::Rocm),
        ("hip", Vendor::Rocm),
        ("rccl", Vendor::Rocm),
        ("mock", Vendor::Mock),
        ("cpu", Vendor::Mock),
    ] {
        assert_eq!(s.parse::<Vendor>().unwrap(), v, "{s}");
    }
    assert!("tpu".parse::<Vendor>().is_err());
}
