//! Process groups and the collectives built on them on the vendor's GPUs, one thread per
//! GPU (the per-process form runs in the bundle: `rank_conformance` under the launcher).
#![cfg(any(feature = "nccl", feature = "rccl"))]

use unicomm_conformance::Failure;
use unicomm_gpu_tests as t;
use unicomm_gpu_tests::GPU;

#[test]
fn split_mesh_gather_scatter_variable_exchanges_scaled_sums_fp8_and_stream_order(
) -> Result<(), Failure> {
    t::groups(&GPU)
}
