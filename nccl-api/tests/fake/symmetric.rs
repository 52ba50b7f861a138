//! Symmetric memory on a runtime without unicomm's kernels (the host runtime the fake NCCL
//! runs on, as HIP is today): `Unsupported` naming the kernels, with no device memory left
//! allocated by the library; the sizes compared first on every rank. An expert group is
//! refused before any memory is made (its kernels are the runtime's).

use crate::common::{calls, comm, fake, flavors};
use unicomm_core::{Error, ExpertConfig};

isolated! {
    #[test]
    fn a_runtime_without_the_kernels_refuses_symmetric_memory_naming_them() {
        let path = fake("nccl232");
        let c = comm(flavors(false, false), &path);
        let allocs = calls(&path, "ncclMemAlloc");
        match c.alloc_symmetric::<f32>(64) {
            Err(Error::Unsupported { what, .. }) => {
                assert!(what.contains("symmetric kernels"), "{what}")
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("symmetric memory without the kernels"),
        }
        assert_eq!(
            calls(&path, "ncclMemAlloc"),
            allocs,
            "refused before the library allocated anything"
        );
    }

    #[test]
    fn an_expert_group_is_unsupported_before_any_memory_is_made() {
        let path = fake("nccl232");
        let c = comm(flavors(false, false), &path);
        assert!(!c.capabilities().device_counts);
        // Nor its high-throughput layout (the same kernels').
        assert!(!c.capabilities().packed_dispatch);
        let allocs = calls(&path, "ncclMemAlloc");
        let cfg = ExpertConfig {
            experts: 1,
            max_tokens: 4,
            hidden: 8,
            top_k: 1,
        };
        match c.expert_group::<f32>(cfg) {
            Err(Error::Unsupported { what, found, .. }) => {
                assert!(what.contains("expert"), "{what}");
                assert!(found.contains("nccl"), "{found}");
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("an expert group without its kernels"),
        }
        assert_eq!(calls(&path, "ncclMemAlloc"), allocs);
    }
}
