//! GPU tests of the RCCL backend: the shared suite of the NCCL-API layer (conformance,
//! registration, windows, init_rank, errors; `unicomm_nccl_api::gpu_tests`), the same
//! harness NCCL passes on 2x H200. Opt-in (`--features gpu-tests`), run by
//! `cargo xtask test --vendor rocm` or the bundle's run script. No AMD GPU has run them yet:
//! without one every test fails with `NoDevice`/`LibraryNotFound`; nothing is skipped.
#![cfg(feature = "gpu-tests")]

use unicomm_nccl_api::gpu_tests::{Gpu, Vendor};
use unicomm_rccl::HipRuntime;

static RCCL: Gpu<HipRuntime> = Gpu::new(Vendor {
    backend: "rccl",
    library: "RCCL",
    local_comms: unicomm_rccl::local_comms,
    unique_id: unicomm_rccl::unique_id,
    init_rank: unicomm_rccl::init_rank,
    api: unicomm_rccl::rccl,
    runtime: unicomm_rccl::hip,
});

unicomm_nccl_api::gpu_test_suite!(RCCL);
