//! The HIP loader, for real: CI installs Debian's `libamdhip64-5` (HIP 5.2), which loads,
//! finds no AMD GPU, and must say so as `NoDevice`; with no HIP library at all the error is
//! `LibraryNotFound` with the paths tried. `UNICOMM_EXPECT_HIP=1` (set by `.ci/run` after
//! installing the package) makes the first test require the real library.

use unicomm_core::Error;
use unicomm_rccl::runtime::hip_search;

/// The tests here read and set the loader's variables: one at a time.
static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn env_lock() -> std::sync::MutexGuard<'static, ()> {
    ENV.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn real_hip_runtime_without_an_amd_gpu_is_no_device() {
    let _env = env_lock();
    let must = std::env::var_os("UNICOMM_EXPECT_HIP").is_some();
    match unicomm_rccl::HipRuntime::new() {
        Err(Error::NoDevice { vendor, detail }) => {
            assert_eq!(vendor, "ROCm");
            assert!(detail.contains("hipGetDeviceCount"), "{detail}");
            println!("{detail}");
        }
        Err(Error::LibraryNotFound { tried, .. }) if !must => {
            println!("no HIP library on this machine (tried {tried:?}); set UNICOMM_EXPECT_HIP=1 where it is installed");
        }
        Ok(rt) => {
            use unicomm_nccl_api::Runtime;
            println!("an AMD GPU is here: {}", rt.describe());
        }
        other => panic!("expected NoDevice from the real HIP runtime, got {other:?}"),
    }
}

#[test]
fn no_hip_library_at_all_is_library_not_found_with_the_paths() {
    let _env = env_lock();
    // A bogus explicit path and bogus ROCm dirs; the sonames may still resolve if the library
    // is installed, so only the listed paths are checked here.
    std::env::set_var("UNICOMM_HIP_LIBRARY", "/nonexistent/libamdhip64.so");
    std::env::set_var("ROCM_PATH", "/nonexistent/rocm");
    let c: Vec<String> = hip_search()
        .candidates()
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    assert_eq!(c[0], "/nonexistent/libamdhip64.so");
    assert_eq!(c[1], "/nonexistent/rocm/lib/libamdhip64.so");
    assert!(c.contains(&"/opt/rocm/lib/libamdhip64.so".to_string()));
    assert!(c.contains(&"libamdhip64.so.5".to_string()));
    // The path the variable names is the only one tried: absent, the error says so (the
    // default search's library is not loaded in its place).
    match unicomm_rccl::HipRuntime::new() {
        Err(Error::LibraryNotFound { library, tried }) => {
            assert_eq!(library, "HIP runtime");
            assert_eq!(tried.len(), 1, "{tried:?}");
            assert!(
                tried[0].starts_with("/nonexistent/libamdhip64.so (absent")
                    && tried[0].contains("UNICOMM_HIP_LIBRARY"),
                "{tried:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    std::env::remove_var("UNICOMM_HIP_LIBRARY");
    let installed = c.iter().filter(|p| !p.starts_with('/')).any(|n| {
        // SAFETY: probing whether a soname resolves; dropped at once.
        unsafe { libloading::Library::new(n) }.is_ok()
    });
    match unicomm_rccl::HipRuntime::new() {
        Err(Error::LibraryNotFound { library, tried }) => {
            assert!(!installed);
            assert_eq!(library, "HIP runtime");
            assert!(
                tried[0].starts_with("/nonexistent/rocm/lib/libamdhip64.so"),
                "{tried:?}"
            );
            assert_eq!(tried.len(), c.len() - 1);
        }
        Err(Error::NoDevice { .. }) => assert!(installed, "NoDevice means a HIP library loaded"),
        other => panic!("{other:?}"),
    }
    std::env::remove_var("ROCM_PATH");
    // The RCCL library is absent here (no Debian package has it): LibraryNotFound.
    match unicomm_rccl::rccl() {
        Err(Error::LibraryNotFound {
            library: "RCCL",
            tried,
        }) => {
            assert!(
                tried
                    .iter()
                    .any(|t| t.starts_with("/opt/rocm/lib/librccl.so.1")),
                "{tried:?}"
            );
        }
        Ok(api) => println!("RCCL present: {api:?}"),
        Err(e) => panic!("{e}"),
    }
}

/// The optional symbols the runtime resolves by name exist in a real HIP runtime under
/// those names (a typo would silently leave them `None`): the device queries behind
/// `device_info` and the virtual-memory calls of the copy-engine path across processes.
#[test]
fn optional_symbols_exist_in_the_real_hip_runtime() {
    let _env = env_lock();
    let must = std::env::var_os("UNICOMM_EXPECT_HIP").is_some();
    let lib = hip_search().candidates().iter().find_map(|p| {
        // SAFETY: loading the HIP runtime runs its initialisers, as HipRuntime::new does.
        unsafe { libloading::Library::new(p) }.ok()
    });
    let Some(lib) = lib else {
        assert!(!must, "UNICOMM_EXPECT_HIP is set but no HIP runtime loads");
        println!("no HIP library on this machine; set UNICOMM_EXPECT_HIP=1 where it is installed");
        return;
    };
    for name in [
        "hipDeviceGetName",
        "hipDeviceGetPCIBusId",
        "hipMemGetAddressRange",
        "hipMemRetainAllocationHandle",
        "hipMemExportToShareableHandle",
        "hipMemImportFromShareableHandle",
        "hipMemAddressReserve",
        "hipMemMap",
        "hipMemSetAccess",
        "hipMemRelease",
        "hipMemUnmap",
        "hipMemAddressFree",
        "hipStreamWaitValue32",
        "hipStreamWriteValue32",
        "hipStreamIsCapturing",
    ]
    .into_iter()
    // The symmetric kernels' calls, as the loader names them (a misspelt one would leave
    // the kernels `Unsupported` on every GPU).
    .chain(unicomm_rccl::sys::KERNEL_CALLS)
    {
        // SAFETY: only the symbol's presence is checked; it is never called.
        let s = unsafe { lib.get::<*const ()>(format!("{name}\0").as_bytes()) };
        assert!(s.is_ok(), "{name} is not in the HIP runtime");
    }
}
