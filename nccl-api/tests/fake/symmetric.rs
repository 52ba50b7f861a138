//! Symmetric memory on a runtime without unicomm's kernels (the host runtime the fake NCCL
//! runs on, as HIP is today): `Unsupported` naming the kernels, with no device memory left
//! allocated by the library; the sizes compared first on every rank.

use crate::common::{calls, comm, fake, flavors};
use unicomm_core::Error;

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
}
