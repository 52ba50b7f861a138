//! The copy-engine path against the fake NCCL (a one-rank world in this process): an
//! all-to-all and an all-gather into a window become a barrier, device copies and a
//! barrier, with exact data, and never reach the library's all-to-all or all-gather. In a
//! process of its own so the fake's call counters see no other test.

use crate::common::{calls, comm, fake, flavors, library_moves};
use unicomm_core::Capabilities;

isolated! {
    #[test]
    fn all_to_all_and_all_gather_into_windows_take_the_copy_engine_path() {
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        let caps: Capabilities = c.capabilities();
        assert!(caps.copy_engine, "{caps:?}");
        c.set_copy_engine(true).unwrap();
        let st = c.create_stream().unwrap();
        let mut send = c.alloc::<u32>(1001).unwrap();
        send.copy_from_host(&(0..1001).collect::<Vec<u32>>(), &st)
            .unwrap();
        let mut recv = c.register_window(c.alloc::<u32>(1001).unwrap()).unwrap();
        let (moves, ar) = (library_moves(&path), calls(&path, "ncclAllReduce"));
        c.all_to_all(&send, &mut recv, &st).unwrap();
        st.synchronize().unwrap();
        assert_eq!(
            recv.copy_to_host(&st).unwrap(),
            (0..1001).collect::<Vec<u32>>()
        );
        c.all_gather(&send.slice(..1001).unwrap(), &mut recv, &st)
            .unwrap();
        assert_eq!(
            recv.copy_to_host(&st).unwrap(),
            (0..1001).collect::<Vec<u32>>()
        );
        assert_eq!(
            library_moves(&path),
            moves,
            "the library's all-to-all or all-gather ran"
        );
        assert_eq!(
            calls(&path, "ncclAllReduce") - ar,
            0,
            "a world of one waits for no peer"
        );
        assert_eq!(
            c.backend().copy_engine_sync(),
            Some(unicomm_nccl_api::CopyEngineSync::Alone)
        );

        // Inside a group the copies could not wait for the group's end: the library's path.
        c.group(|| c.all_to_all(&send, &mut recv, &st)).unwrap();
        assert_eq!(calls(&path, "ncclAlltoAll") - moves.0, 1);

        // Off again: the library's path.
        c.set_copy_engine(false).unwrap();
        c.all_to_all(&send, &mut recv, &st).unwrap();
        assert_eq!(calls(&path, "ncclAlltoAll") - moves.0, 2);
        c.deregister_window(recv).unwrap();
    }
}
