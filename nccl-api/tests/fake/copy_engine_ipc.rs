//! The copy-engine path of a communicator joined with `init_rank` (one rank per process)
//! against the fake NCCL: the window is exported and swapped over the exchange (`ipc.rs`);
//! where the runtime cannot export, every rank says no and the library's path runs; where
//! it can, the operation becomes barrier, copies, barrier. A world of one (the fake's
//! limit): the multi-rank exchange itself is tested in the crate (ipc.rs, threads as
//! ranks), and on GPUs by the per-process runs. In a process of its own (call counters).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::common::{calls, fake, flavors, Host, EXPORT, IMPORTS, UNMAPS};
use unicomm_core::Comm;
use unicomm_nccl_api::{Api, ApiComm};

isolated! {
    #[test]
    fn init_rank_windows_take_the_copy_engine_path_only_where_memory_can_be_exported() {
        let path = fake("nccl228");
        let api = Arc::new(Api::open(flavors(false, false), &path).expect("load the fake"));
        let id = api.unique_id().unwrap();
        let c = Comm::from_backend(ApiComm::init_rank(api, Arc::new(Host), id, 0, 1, 0).unwrap());
        assert!(c.capabilities().copy_engine);
        c.set_copy_engine(true).unwrap();
        let st = c.create_stream().unwrap();
        let mut send = c.alloc::<u32>(64).unwrap();
        send.copy_from_host(&(0..64).collect::<Vec<u32>>(), &st)
            .unwrap();

        // 1. The runtime cannot export: no rank takes the path, the library's all-to-all runs.
        EXPORT.store(false, Ordering::SeqCst);
        let mut recv = c.register_window(c.alloc::<u32>(64).unwrap()).unwrap();
        let a2a = calls(&path, "ncclAlltoAll");
        c.all_to_all(&send, &mut recv, &st).unwrap();
        assert_eq!(calls(&path, "ncclAlltoAll") - a2a, 1, "the library's path");
        assert_eq!(
            recv.copy_to_host(&st).unwrap(),
            (0..64).collect::<Vec<u32>>()
        );
        c.deregister_window(recv).unwrap();

        // 2. It can: the copies (a world of one waits for no peer: no barrier); exact data; the
        //    library's all-to-all not called.
        EXPORT.store(true, Ordering::SeqCst);
        let mut recv = c.register_window(c.alloc::<u32>(64).unwrap()).unwrap();
        let (a2a, ar) = (calls(&path, "ncclAlltoAll"), calls(&path, "ncclAllReduce"));
        c.all_to_all(&send, &mut recv, &st).unwrap();
        st.synchronize().unwrap();
        assert_eq!(
            recv.copy_to_host(&st).unwrap(),
            (0..64).collect::<Vec<u32>>()
        );
        assert_eq!(
            calls(&path, "ncclAlltoAll"),
            a2a,
            "the library's all-to-all ran"
        );
        assert_eq!(calls(&path, "ncclAllReduce") - ar, 0, "no barrier");
        // A world of one maps no peer: nothing to import or unmap.
        assert_eq!(IMPORTS.load(Ordering::SeqCst), 0);
        c.deregister_window(recv).unwrap();
        assert_eq!(UNMAPS.load(Ordering::SeqCst), 0);
    }
}
