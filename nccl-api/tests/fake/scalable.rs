//! NCCL's many-root creation (`ncclCommInitRankScalable`, NCCL 2.23): the layer passes the
//! ids in order, uses it only with several ids, and falls back to one root on a library
//! that predates it.

use std::sync::Arc;

use crate::common::{calls, fake, flavors, Host};
use unicomm_core::{CommConfig, Error};
use unicomm_nccl_api::{roots_for, Api, ApiComm, UniqueId};

fn ids(n: u8) -> Vec<UniqueId> {
    (1..=n).map(|k| UniqueId::from_bytes([k; 128])).collect()
}

isolated! {
    /// Every rank of a world passes the same ids, in order, to one ncclCommInitRankScalable
    /// call; the plain creation stays ncclCommInitRank.
    #[test]
    fn several_ids_create_the_world_through_the_scalable_call_in_order() {
        std::env::set_var("FAKE_NCCL_BARRIER_WORLDS", "1");
        let path = fake("nccl228");
        let api = Arc::new(Api::open(flavors(false, false), &path).expect("load the fake"));
        let tag = "ncclCommInitRankScalable:3:1,2,3";
        let (before, plain) = (calls(&path, tag), calls(&path, "ncclCommInitRank"));
        let ids = ids(3);
        let made: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|r| {
                    let (api, ids) = (api.clone(), &ids);
                    s.spawn(move || {
                        let cfg = CommConfig::default();
                        ApiComm::init_rank_scalable_with(
                            api,
                            Arc::new(Host),
                            ids,
                            unicomm_core::Place::new(r, 3, 0),
                            &cfg,
                        )
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let made: Vec<_> = made.into_iter().map(|m| m.unwrap()).collect();
        assert_eq!(calls(&path, tag), before + 3);
        assert_eq!(calls(&path, "ncclCommInitRank"), plain);
        drop(made);
    }

    /// One root per 128 ranks by default, at most 256 ids; one root where the world fits one.
    #[test]
    fn roots_follow_the_world_one_per_128_ranks_capped() {
        let path = fake("nccl228");
        let api = Api::open(flavors(false, false), &path).expect("load the fake");
        let got: Vec<usize> = [1, 128, 129, 1000, 4096, 1 << 20]
            .iter()
            .map(|&w| roots_for(&api, w).unwrap())
            .collect();
        assert_eq!(got, vec![1, 1, 2, 8, 32, 256]);
    }

    /// NCCL 2.18 predates the call: one root (the documented fallback), and asking for
    /// several ids is `Unsupported` naming 2.23, never a silent single root.
    #[test]
    fn a_library_before_2_23_creates_from_one_root_and_refuses_several_by_version() {
        let path = fake("default");
        let api = Arc::new(Api::open(flavors(false, false), &path).expect("load the fake"));
        assert_eq!(roots_for(&api, 4096).unwrap(), 1);
        let r = ApiComm::init_rank_scalable_with(
            api,
            Arc::new(Host),
            &ids(2),
            unicomm_core::Place::new(0, 2, 0),
            &CommConfig::default(),
        );
        match r {
            Err(e @ Error::Unsupported { .. }) => assert!(e.to_string().contains("2.23"), "{e}"),
            other => panic!("expected Unsupported naming 2.23, got {:?}", other.err()),
        }
    }

    /// Asked for explicitly, one id is the many-root call with one root (what a world of one
    /// rank can run on the GPU machine); `init_rank_with` stays the plain call.
    #[test]
    fn one_id_asked_through_the_scalable_call_takes_it() {
        let path = fake("nccl228");
        let api = Arc::new(Api::open(flavors(false, false), &path).expect("load the fake"));
        let tag = "ncclCommInitRankScalable:1:1";
        let before = calls(&path, tag);
        let cfg = CommConfig::default();
        // Kept until the count is read: dropping the last holder of the library unloads it,
        // and its counts with it.
        let _c = ApiComm::init_rank_scalable_with(
            api,
            Arc::new(Host),
            &ids(1),
            unicomm_core::Place::new(0, 1, 0),
            &cfg,
        );
        assert_eq!(calls(&path, tag), before + 1);
    }
}
