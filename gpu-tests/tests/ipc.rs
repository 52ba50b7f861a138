//! Device memory exported and mapped again (the copy-engine path across processes): in this
//! process, and into a second process on the same GPU (this binary re-run as it).
#![cfg(any(feature = "nccl", feature = "rccl"))]

use unicomm_core::Result;
use unicomm_gpu_tests as t;
use unicomm_gpu_tests::GPU;

#[test]
fn exported_memory_maps_back_with_its_bytes() -> Result<()> {
    t::export_import_round_trip(&GPU)
}
#[cfg(target_os = "linux")]
#[test]
fn exported_memory_maps_into_another_process() -> Result<()> {
    t::export_import_across_processes(&GPU, "exported_memory_maps_into_another_process")
}
