//! `ncclCommGrow` and `ncclCommGetUniqueId` (NCCL 2.29.2) against fake NCCLs of 2.28 and
//! 2.32: the id from the root, NCCL's parameter rules for each caller (the root with its id,
//! an existing rank with none, a new rank with no communicator, the id and its rank), the
//! grown communicator's size and rank, and a 2.28 library refusing naming 2.29.2 before any
//! call. In a process of its own (the fake's counters).

use std::sync::Arc;

use crate::common::{calls, comm, fake, flavors, Host};
use unicomm_core::{Collective, CommConfig, Error};
use unicomm_nccl_api::sys::api::UniqueId;
use unicomm_nccl_api::{Api, ApiComm};

isolated! {
    #[test]
    fn every_caller_passes_what_nccl_asks_and_gets_the_grown_world() {
        let path = fake("nccl232");
        let api = Arc::new(Api::open(flavors(false, false), &path).unwrap());
        let c = comm(flavors(false, false), &path);
        let id = c.grow_id().unwrap();
        assert_eq!(id, [9; 128]);
        let g = c.grow(3, Some(&id)).unwrap();
        assert_eq!((g.rank(), g.world_size()), (0, 3));
        assert_eq!(calls(&path, "grow root to 3"), 1);
        // An existing rank other than the root passes no id (called on the backend: at world 1
        // the only rank is the root).
        let e = c.backend().grow(4, None, &CommConfig::default()).unwrap();
        assert_eq!((e.rank(), e.world_size()), (0, 4));
        assert_eq!(calls(&path, "grow existing to 4"), 1);
        let n = ApiComm::init_grown_with(
            api,
            Arc::new(Host),
            UniqueId::from_bytes(id),
            unicomm_core::Place::new(2, 3, 0),
            &CommConfig::default(),
        )
        .unwrap();
        assert_eq!((n.rank(), n.world_size()), (2, 3));
        assert_eq!(calls(&path, "grow new rank 2 to 3"), 1);
    }

    #[test]
    fn a_2_28_library_refuses_naming_2_29_2_before_any_call() {
        let path = fake("nccl228");
        let api = Arc::new(Api::open(flavors(false, false), &path).unwrap());
        let c = comm(flavors(false, false), &path);
        let needs = |r: Result<(), Error>| match r {
            Err(Error::Unsupported { needs, .. }) => needs,
            other => panic!("{other:?}"),
        };
        assert!(needs(c.grow_id().map(drop)).contains("2.29.2"));
        assert!(needs(c.grow(2, Some(&[9; 128])).map(drop)).contains("2.29.2"));
        let n = ApiComm::init_grown_with(
            api,
            Arc::new(Host),
            UniqueId::from_bytes([9; 128]),
            unicomm_core::Place::new(1, 2, 0),
            &CommConfig::default(),
        );
        assert!(needs(n.map(drop)).contains("2.29.2"));
    }
}
