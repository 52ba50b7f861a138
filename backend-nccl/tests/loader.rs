//! The loaders on any machine: no panic, and errors that say what was tried.

use unicomm_core::Error;
use unicomm_nccl_api::{Api, Flavor};

fn nowhere() -> Vec<std::path::PathBuf> {
    vec!["/nonexistent/unicomm-test/lib".into()]
}

/// NCCL's flavour (its symbols and version floors) pointed at nothing.
static MISSING: Flavor = Flavor {
    env_var: "UNICOMM_TEST_MISSING_NCCL",
    dirs: nowhere,
    sonames: &["libunicomm-no-such-nccl.so.2", "libunicomm-no-such-nccl.so"],
    ..unicomm_nccl::NCCL
};

#[test]
fn library_not_found_lists_every_path_tried_in_order() {
    // A path the variable names is the only one tried: absent, the error names the variable.
    std::env::set_var(
        "UNICOMM_TEST_MISSING_NCCL",
        "/nonexistent/explicit/libnccl.so.2",
    );
    match Api::load(&MISSING) {
        Err(Error::LibraryNotFound { tried, .. }) => {
            assert_eq!(tried.len(), 1, "{tried:?}");
            assert!(
                tried[0].starts_with("/nonexistent/explicit/libnccl.so.2 (absent")
                    && tried[0].contains("UNICOMM_TEST_MISSING_NCCL"),
                "{tried:?}"
            );
        }
        other => panic!("expected LibraryNotFound, got {other:?}"),
    }
    assert_eq!(MISSING.search().candidates().len(), 5);
    // Without it, every directory and soname in order.
    std::env::remove_var("UNICOMM_TEST_MISSING_NCCL");
    let tried = match Api::load(&MISSING) {
        Err(Error::LibraryNotFound { library, tried }) => {
            assert_eq!(library, "NCCL");
            tried
        }
        other => panic!("expected LibraryNotFound, got {other:?}"),
    };
    let want = [
        "/nonexistent/unicomm-test/lib/libunicomm-no-such-nccl.so.2",
        "/nonexistent/unicomm-test/lib/libunicomm-no-such-nccl.so",
        "libunicomm-no-such-nccl.so.2",
        "libunicomm-no-such-nccl.so",
    ];
    assert_eq!(tried.len(), want.len(), "{tried:?}");
    for (t, w) in tried.iter().zip(want) {
        assert!(t.starts_with(w), "{t} should start with {w}");
    }
    let msg = Error::LibraryNotFound {
        library: "NCCL",
        tried,
    }
    .to_string();
    assert!(msg.contains("libunicomm-no-such-nccl.so.2"), "{msg}");
}

#[test]
fn nccl_search_order_is_env_then_homes_then_wheels_then_sonames() {
    std::env::set_var("UNICOMM_NCCL_LIBRARY", "/x/explicit.so");
    std::env::set_var("NCCL_HOME", "/x/nccl");
    std::env::set_var("CUDA_HOME", "/x/cuda");
    let c: Vec<String> = unicomm_nccl::NCCL
        .search()
        .candidates()
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    assert_eq!(c[0], "/x/explicit.so");
    assert_eq!(c[1], "/x/nccl/lib/libnccl.so.2");
    assert_eq!(c[2], "/x/nccl/lib/libnccl.so");
    assert_eq!(c[3], "/x/cuda/lib64/libnccl.so.2");
    let n = c.len();
    assert_eq!(c[n - 2], "libnccl.so.2");
    assert_eq!(c[n - 1], "libnccl.so");
}

/// Without the vendor's GPU the backend says so, cleanly; with one it says what it found.
/// Either way a typed answer, never a panic.
#[test]
fn probe_reports_a_typed_answer_and_never_panics() {
    match unicomm_nccl::probe() {
        Ok(found) => println!("GPU machine: {found}"),
        Err(Error::LibraryNotFound { library, tried }) => {
            println!("no {library} here: {tried:?}");
            assert!(!tried.is_empty());
        }
        Err(Error::NoDevice { vendor, detail }) => println!("no {vendor} device: {detail}"),
        Err(e) => panic!("unexpected error kind: {e}"),
    }
    if let Err(e) = unicomm_nccl::local_comms(None) {
        assert!(
            matches!(e, Error::LibraryNotFound { .. } | Error::NoDevice { .. }),
            "{e}"
        );
    }
}

/// Where there is no libcuda (CI: `.ci/run` sets `UNICOMM_EXPECT_NO_CUDA=1`), the CUDA
/// loader says LibraryNotFound; cudarc alone would panic.
#[test]
fn without_libcuda_the_error_is_library_not_found() {
    if std::env::var_os("UNICOMM_EXPECT_NO_CUDA").is_none() {
        println!("UNICOMM_EXPECT_NO_CUDA unset: not asserting the absence of CUDA here");
        return;
    }
    match unicomm_nccl::cuda() {
        Err(Error::LibraryNotFound {
            library: "CUDA driver",
            ..
        }) => {}
        other => panic!("expected LibraryNotFound for the CUDA driver, got {other:?}"),
    }
    assert!(matches!(
        unicomm_nccl::local_comms(None),
        Err(Error::LibraryNotFound { .. })
    ));
}
