//! One-sided calls (NCCL 2.29.2) against fake NCCLs of 2.28 and 2.32: what reaches the
//! library (bytes as `ncclUint8`, the window's own handle, the byte offset, signal index,
//! context and flags 0, the wait's descriptors in `ncclWaitSignalDesc_t`'s layout), the
//! bytes landing in the window; NCCL's source rule and the window's bounds refused before
//! any call; each window's start checked with `ncclWinGetUserPtr`; a 2.28 library refusing
//! naming 2.29.2. In a process of its own (the fake's counters).

use crate::common;

use crate::common::{calls, comm, fake, flavors};
use unicomm_core::{Error, SignalWait};

/// A window whose start the library names otherwise is refused (called after the test
/// above, in the same test: the fake's shift is process-wide).
fn a_window_whose_start_the_library_names_otherwise_is_refused(
    path: &std::path::Path,
    c: &unicomm_core::Comm<unicomm_nccl_api::ApiComm<common::Host>>,
) {
    let st = c.create_stream().unwrap();
    // SAFETY: the fake's control, in the library the test loaded (kept loaded by it).
    unsafe {
        let lib = libloading::Library::new(path).unwrap();
        let f: libloading::Symbol<unsafe extern "C" fn(usize)> =
            lib.get(b"unicommFakeShiftWindows\0").unwrap();
        f(64);
        let r = c.register_window(c.upload(&[0u32; 8], &st).unwrap());
        f(0);
        match r.map(drop).map_err(|e| e.error) {
            Err(Error::InvalidArgument { reason, .. }) => {
                assert!(reason.contains("starts at"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
}

isolated! {
    #[test]
    fn a_put_and_a_signal_reach_nccl_as_it_asks_and_the_bytes_land() {
        let path = fake("nccl232");
        let c = comm(flavors(false, false), &path);
        let st = c.create_stream().unwrap();
        let dst = c
            .register_window(c.upload(&[0u32; 8], &st).unwrap())
            .unwrap();
        let src = c
            .register_window(c.upload(&[7u32, 8, 9], &st).unwrap())
            .unwrap();
        assert_eq!(calls(&path, "ncclWinGetUserPtr"), 2);
        let plain = c.upload(&[1u32; 3], &st).unwrap();
        match c.put_signal(&plain, 0, &dst, 0, &st) {
            Err(Error::InvalidArgument { reason, .. }) => assert!(reason.contains("symmetric window")),
            other => panic!("{other:?}"),
        }
        match c.put_signal(&src, 0, &dst, 6, &st) {
            Err(Error::InvalidArgument { argument, .. }) => assert_eq!(argument, "offset"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            calls(&path, "ncclPutSignal"),
            0,
            "refused before the library"
        );
        c.put_signal(&src, 0, &dst, 2, &st).unwrap();
        c.signal(0, &st).unwrap();
        c.wait_signal(&[SignalWait::new(0, 2)], &st).unwrap();
        st.synchronize().unwrap();
        assert_eq!(calls(&path, "put 12 bytes at 8"), 1);
        assert_eq!(calls(&path, "wait 2"), 1);
        assert_eq!(dst.copy_to_host(&st).unwrap(), [0, 0, 7, 8, 9, 0, 0, 0]);
        // A second wait counts new signals only: none were sent.
        assert!(c.wait_signal(&[SignalWait::new(0, 1)], &st).is_err());
        drop((src, dst));
        a_window_whose_start_the_library_names_otherwise_is_refused(&path, &c);
    }

    #[test]
    fn a_2_28_library_refuses_naming_2_29_2_before_any_call() {
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        let st = c.create_stream().unwrap();
        let w = c
            .register_window(c.upload(&[0u32; 8], &st).unwrap())
            .unwrap();
        for r in [
            c.put_signal(&w, 0, &w, 0, &st),
            c.signal(0, &st),
            c.wait_signal(&[SignalWait::new(0, 1)], &st),
        ] {
            match r {
                Err(Error::Unsupported { needs, .. }) => assert!(needs.contains("2.29.2"), "{needs}"),
                other => panic!("{other:?}"),
            }
        }
    }
}
