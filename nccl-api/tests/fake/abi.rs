//! The NCCL-API layer of backend-nccl, exercised for both vendors against a fake NCCL-ABI
//! library built here: one flavour like NCCL 2.28 (ncclAlltoAll, registration, windows,
//! ncclMemAlloc), one like RCCL before ROCm 6.2 (ncclAllToAll, none of those). Symbol
//! resolution, version gates, the send/recv fallback and error translation are checked on
//! both. "Device" memory is host memory (a host Runtime below).

use crate::common;

use std::path::Path;
use std::sync::Arc;

use crate::common::{calls, comm, fake, flavors, Host};
use unicomm_core::{Collective, Comm, Error, ReduceOp, Result, Version};
use unicomm_nccl_api::{Api, ApiComm};

fn round_trip(c: &Comm<ApiComm<Host>>) -> Result<()> {
    let st = c.create_stream()?;
    let data: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let mut send = c.alloc::<f32>(64)?;
    send.copy_from_host(&data, &st)?;
    let mut recv = c.alloc::<f32>(64)?;
    c.all_reduce(&send, &mut recv, ReduceOp::Sum, &st)?;
    assert_eq!(recv.copy_to_host(&st)?, data);
    let mut recv2 = c.alloc::<f32>(64)?;
    c.all_to_all(&send, &mut recv2, &st)?;
    st.synchronize()?;
    assert_eq!(recv2.copy_to_host(&st)?, data);
    Ok(())
}

isolated! {
    #[test]
    fn nccl_228_like_library_has_everything() {
        let path = fake("nccl228");
        let f = flavors(false, false);
        let c = comm(f, &path);
        let caps = c.capabilities();
        assert_eq!(caps.version, Version::new(2, 28, 9));
        assert!(
            caps.registration && caps.windows && caps.native_all_to_all && caps.mem_alloc,
            "{caps:?}"
        );
        let before = calls(&path, "ncclAlltoAll");
        round_trip(&c).unwrap();
        assert_eq!(
            calls(&path, "ncclAlltoAll"),
            before + 1,
            "native all-to-all used"
        );
        assert!(
            calls(&path, "ncclMemAlloc") >= 3,
            "memory from ncclMemAlloc"
        );
        // Registration and windows go through the library, and a handle cannot be used twice.
        let reg = c.register(c.alloc::<f32>(16).unwrap()).unwrap();
        let h = reg.handle();
        c.deregister(reg).unwrap();
        assert!(matches!(
            c.backend().deregister(h),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(calls(&path, "ncclCommDeregister") >= 1);
        let w = c.register_window(c.alloc::<f32>(16).unwrap()).unwrap();
        c.deregister_window(w).unwrap();
    }

    #[test]
    fn a_null_window_is_unsupported_not_a_window() {
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        std::env::set_var("FAKE_NCCL_NULL_WINDOW", "1");
        let r = c.register_window(c.alloc::<f32>(16).unwrap());
        std::env::remove_var("FAKE_NCCL_NULL_WINDOW");
        match r {
            Err(e) => assert!(matches!(e.error, Error::Unsupported { .. }), "{}", e.error),
            Ok(_) => panic!("a NULL window must not become a Window"),
        }
    }

    #[test]
    fn old_rccl_like_library_gates_features_with_versions() {
        let path = fake("rccl-old");
        let c = comm(flavors(false, true), &path);
        let caps = c.capabilities();
        assert_eq!(caps.backend, "rccl");
        assert_eq!(caps.version, Version::new(2, 18, 3));
        assert!(
            !caps.registration && !caps.windows && !caps.mem_alloc && caps.native_all_to_all,
            "{caps:?}"
        );
        let e = c.register(c.alloc::<f32>(16).unwrap()).err().unwrap().error;
        match &e {
            Error::Unsupported { needs, found, .. } => {
                assert!(needs.contains("RCCL >= 2.20.0"), "{needs}");
                assert!(found.contains("2.18.3"), "{found}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            c.register_window(c.alloc::<f32>(4).unwrap())
                .err()
                .unwrap()
                .error,
            Error::Unsupported { .. }
        ));
        let before = calls(&path, "ncclAllToAll");
        round_trip(&c).unwrap();
        assert_eq!(
            calls(&path, "ncclAllToAll"),
            before + 1,
            "RCCL's spelling found and used"
        );
        assert_eq!(
            calls(&path, "ncclMemAlloc"),
            0,
            "no ncclMemAlloc: hipMalloc-style fallback"
        );
    }

    #[test]
    fn without_native_all_to_all_the_layer_groups_send_and_recv() {
        for (feature, rccl) in [("nccl228", false), ("rccl-old", true)] {
            let path = fake(feature);
            let c = comm(flavors(true, rccl), &path);
            assert!(!c.capabilities().native_all_to_all);
            let (s0, r0) = (calls(&path, "ncclSend"), calls(&path, "ncclRecv"));
            round_trip(&c).unwrap();
            assert_eq!(calls(&path, "ncclSend"), s0 + 1, "{feature}");
            assert_eq!(calls(&path, "ncclRecv"), r0 + 1, "{feature}");
        }
    }

    #[test]
    fn library_errors_keep_code_name_message_and_last_error() {
        for (feature, rccl) in [("nccl228", false), ("rccl-old", true)] {
            let path = fake(feature);
            let c = comm(flavors(false, rccl), &path);
            let st = c.create_stream().unwrap();
            let mut b = c.alloc::<u8>(2989).unwrap();
            match c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st) {
                Err(Error::Library {
                    library,
                    call,
                    code,
                    name,
                    message,
                    last_error,
                }) => {
                    assert_eq!(library, if rccl { "RCCL" } else { "NCCL" });
                    assert_eq!((call, code, name), ("ncclAllReduce", 5, "ncclInvalidUsage"));
                    assert_eq!(message, "fake: invalid usage");
                    assert_eq!(last_error, "fake: count 2989 refused on purpose");
                }
                other => panic!("{feature}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_library_missing_a_required_symbol_is_named() {
        // The HIP runtime (or any library) is not an NCCL-API library: the first required
        // symbol is reported, with the path.
        let path = fake("nccl228");
        let r = Api::open(&common::NCCL, Path::new("libc.so.6"));
        match r {
            Err(Error::MissingSymbol { symbol, path, .. }) => {
                assert_eq!(symbol, "ncclGetVersion");
                assert_eq!(path, "libc.so.6");
            }
            other => panic!("{other:?}"),
        }
        let _ = path;
    }

    #[test]
    fn raw_device_pointers_are_checked_before_use() {
        use unicomm_nccl_api::ApiMemory;
        // A NULL pointer where data is needed, and a range that wraps the address space.
        // SAFETY: the constructor rejects these before anything could use them.
        let null = unsafe { ApiMemory::<Host>::borrowed(Arc::new(Host), 0, 0, 64, None) };
        assert!(matches!(
            null,
            Err(Error::InvalidArgument {
                argument: "ptr",
                ..
            })
        ));
        // SAFETY: as above.
        let wraps = unsafe { ApiMemory::<Host>::borrowed(Arc::new(Host), 0, usize::MAX - 8, 64, None) };
        assert!(matches!(
            wraps,
            Err(Error::InvalidArgument {
                argument: "bytes",
                ..
            })
        ));
        // Memory too small for the element count, and a count whose byte size overflows.
        let mut backing = vec![0u8; 16];
        // SAFETY: 16 bytes of a live host allocation, used only for the length checks below.
        let mem = unsafe {
            ApiMemory::<Host>::borrowed(Arc::new(Host), 0, backing.as_mut_ptr() as usize, 16, None)
        }
        .unwrap();
        let r = unicomm_core::Buffer::<f64, ApiComm<Host>>::from_memory(mem, 3);
        assert!(matches!(
            r,
            Err(Error::InvalidArgument {
                argument: "len",
                ..
            })
        ));
        // SAFETY: as above.
        let mem = unsafe {
            ApiMemory::<Host>::borrowed(Arc::new(Host), 0, backing.as_mut_ptr() as usize, 16, None)
        }
        .unwrap();
        let r = unicomm_core::Buffer::<f64, ApiComm<Host>>::from_memory(mem, usize::MAX / 4);
        assert!(matches!(
            r,
            Err(Error::InvalidArgument {
                argument: "len",
                ..
            })
        ));
    }

    /// Two threads deregister one raw handle at once: the library is called once, one caller
    /// succeeds, the other gets `InvalidArgument` (the table check, the library call and the
    /// removal are one step).
    #[test]
    fn concurrent_deregistration_of_one_handle_calls_the_library_once() {
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        let raw = c.backend();
        for round in 0..20 {
            let mem = raw.alloc(4096).unwrap();
            let h = raw.register(&mem, 0, 4096).unwrap();
            // Memory freed in an earlier round may come back at the same address (same handle).
            let per_handle = format!("ncclCommDeregister:{:#x}", h.0);
            let before = calls(&path, &per_handle);
            let barrier = std::sync::Barrier::new(2);
            let results: Vec<Result<()>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..2)
                    .map(|_| {
                        s.spawn(|| {
                            barrier.wait();
                            raw.deregister(h)
                        })
                    })
                    .collect();
                hs.into_iter().map(|t| t.join().unwrap()).collect()
            });
            let ok = results.iter().filter(|r| r.is_ok()).count();
            assert_eq!(ok, 1, "round {round}: {results:?}");
            assert!(
                results
                    .iter()
                    .any(|r| matches!(r, Err(Error::InvalidArgument { .. }))),
                "round {round}: {results:?}"
            );
            assert_eq!(
                calls(&path, &per_handle) - before,
                1,
                "round {round}: library calls for {h:?}"
            );
        }
    }
}
