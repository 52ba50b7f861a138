//! The 2.29-2.32 calls on fake NCCLs of 2.28 and 2.32: suspend/resume and the memory
//! statistics (NCCL 2.29.7), a communicator's properties (2.29.2), NCCL's parameters
//! (2.30.4), each gated by the loaded release; a suspended communicator's calls never reach
//! the library.

use crate::common::{calls, comm, fake, flavors};
use unicomm_core::{Error, ReduceOp};
use unicomm_nccl_api::Api;

isolated! {
    #[test]
    fn suspend_frees_the_library_memory_and_calls_wait_for_resume() {
        let path = fake("nccl232");
        // Kept loaded past the communicator's end, so its counters can be read then.
        let _kept = Api::open(flavors(false, false), &path).unwrap();
        let c = comm(flavors(false, false), &path);
        let st = c.create_stream().unwrap();
        let mut b = c.alloc::<f32>(4).unwrap();
        let before = c.mem_stats().unwrap();
        assert_eq!((before.suspendable, before.suspended), (1 << 20, false));
        c.suspend().unwrap();
        let after = c.mem_stats().unwrap();
        assert_eq!(
            (after.suspendable, after.suspended, after.persistent),
            (0, true, 4096)
        );
        let reduces = calls(&path, "ncclAllReduce");
        match c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st) {
            Err(Error::InvalidArgument { reason, .. }) => {
                assert!(reason.contains("suspended"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            calls(&path, "ncclAllReduce"),
            reduces,
            "the library was called while suspended"
        );
        let allocs = calls(&path, "ncclMemAlloc");
        match c.alloc::<f32>(4) {
            Err(Error::InvalidArgument { reason, .. }) => {
                assert!(reason.contains("suspended"), "{reason}")
            }
            other => panic!("an allocation while suspended: {:?}", other.map(drop)),
        }
        assert_eq!(calls(&path, "ncclMemAlloc"), allocs);
        c.resume().unwrap();
        assert!(!c.mem_stats().unwrap().suspended);
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
        assert_eq!(calls(&path, "ncclAllReduce"), reduces + 1);
        // Finalizing a suspended communicator resumes it first.
        c.suspend().unwrap();
        let resumes = calls(&path, "ncclCommResume");
        drop(b);
        c.finalize().unwrap();
        assert_eq!(calls(&path, "ncclCommResume"), resumes + 1);
    }

    #[test]
    fn properties_are_read_with_a_version_the_library_accepts() {
        let path = fake("nccl232");
        let c = comm(flavors(false, false), &path);
        let p = c.properties().unwrap();
        assert_eq!((p.rank, p.world, p.device_api), (0, 1, true));
        assert_eq!((p.host_rma, p.lsa_teams), (Some(true), Some(1)));
    }

    #[test]
    fn the_parameters_in_effect_are_listed() {
        let api = Api::open(flavors(false, false), &fake("nccl232")).unwrap();
        let ps = api.parameters().unwrap();
        assert!(ps.contains(&("NCCL_MAX_CTAS".into(), "8".into())), "{ps:?}");
        assert!(
            ps.contains(&("NCCL_PROTO".into(), "LL,LL128,Simple".into())),
            "{ps:?}"
        );
    }

    #[test]
    fn a_2_28_library_refuses_each_naming_its_release() {
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        let needs = |r: Result<(), Error>| match r {
            Err(Error::Unsupported { needs, .. }) => needs,
            other => panic!("{other:?}"),
        };
        assert!(needs(c.suspend()).contains("2.29.7"));
        assert!(needs(c.mem_stats().map(drop)).contains("2.29.7"));
        assert!(needs(c.properties().map(drop)).contains("2.29.2"));
        let api = Api::open(flavors(false, false), &path).unwrap();
        assert!(needs(api.parameters().map(drop)).contains("2.30.4"));
    }
}
