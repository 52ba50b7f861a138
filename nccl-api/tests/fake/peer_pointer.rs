//! A window's peer addresses (NCCL 2.29.2's `ncclGetPeerDevicePointer`) against fake NCCLs
//! of 2.28 and 2.32: the window's own handle and offset 0 reach the library and its answer
//! comes back; a rank outside the world is refused before the library; a 2.28 library
//! refuses naming 2.29.2. In a process of its own (the fake's counters).

use crate::common::{calls, comm, fake, flavors};
use unicomm_core::Error;

isolated! {
    #[test]
    fn the_library_answers_for_the_window_on_2_32_and_2_28_is_refused() {
        let path = fake("nccl232");
        let c = comm(flavors(false, false), &path);
        let st = c.create_stream().unwrap();
        let w = c
            .register_window(c.upload(&[0u32; 16], &st).unwrap())
            .unwrap();
        assert_eq!(w.peer_address(0).unwrap(), Some(w.device_ptr()));
        assert_eq!(calls(&path, "peer pointer 0 at 0"), 1);
        match w.peer_address(1) {
            Err(Error::InvalidArgument { argument, .. }) => assert_eq!(argument, "rank"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            calls(&path, "peer pointer 1 at 0"),
            0,
            "refused before the library"
        );
        drop(w);

        let old = fake("nccl228");
        let c = comm(flavors(false, false), &old);
        let st = c.create_stream().unwrap();
        let w = c
            .register_window(c.upload(&[0u32; 16], &st).unwrap())
            .unwrap();
        match w.peer_address(0) {
            Err(Error::Unsupported { needs, .. }) => assert!(needs.contains("2.29.2"), "{needs}"),
            other => panic!("{other:?}"),
        }
    }
}
