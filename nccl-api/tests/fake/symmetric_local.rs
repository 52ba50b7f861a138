//! Symmetric memory on ranks created together in one process (`init_local`): every rank's
//! allocation exported and mapped by every other rank, as for one rank per process (a
//! mapping keeps a peer's memory alive after its owner frees it, which peer access would
//! not), over the local world's own exchange. Against the fake NCCL (a barrier world of two
//! ranks on the host runtime, whose import gives the exporter's address back). Alone in its
//! binary: the fake's worlds and the runtime's switches are process-wide.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::common::{fake, flavors, Host, EXPORT, IMPORTS, MAPPED, UNMAPS};
use unicomm_core::Comm;
use unicomm_nccl_api::{Api, ApiComm};

isolated! {
    #[test]
    fn ranks_created_together_map_each_other_s_symmetric_memory() {
        // Before the fake is loaded or any thread runs.
        std::env::set_var("FAKE_NCCL_BARRIER_WORLDS", "1");
        MAPPED.store(true, Ordering::SeqCst);
        EXPORT.store(true, Ordering::SeqCst);
        let path = fake("nccl232");
        let api = Arc::new(Api::open(flavors(false, false), &path).expect("load the fake"));
        let comms: Vec<Comm<ApiComm<Host>>> = ApiComm::init_local(api, Arc::new(Host), &[0, 0])
            .expect("a local world of two")
            .into_iter()
            .map(Comm::from_backend)
            .collect();
        let seen = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let sym = c.alloc_symmetric::<f32>(64).expect("symmetric memory");
                        let mine = sym.peer_address(c.rank()).unwrap();
                        let theirs = sym.peer_address(1 - c.rank()).unwrap();
                        drop(sym);
                        (mine, theirs)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        // Each rank's view of its peer is that peer's own memory (the host runtime's import
        // hands the exporter's address back), and each rank imported its peer's.
        assert_eq!(seen[0].1, seen[1].0);
        assert_eq!(seen[1].1, seen[0].0);
        assert_eq!(IMPORTS.load(Ordering::SeqCst), 2);
        // Each rank's mapping of its peer goes once its view is released (on a helper thread
        // after its device is idle).
        let t = std::time::Instant::now();
        while UNMAPS.load(Ordering::SeqCst) < 2 && t.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(UNMAPS.load(Ordering::SeqCst), 2);
    }
}
