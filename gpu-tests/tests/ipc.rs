//! Device memory exported and mapped again (the copy-engine path across processes): in this
//! process, and into a second process on the same GPU (this binary re-run as it).
#![cfg(any(feature = "nccl", feature = "rccl"))]

unicomm_gpu_tests::on_gpu! {
    exported_memory_maps_back_with_its_bytes => export_import_round_trip;
    #[cfg(target_os = "linux")]
    exported_memory_maps_into_another_process => export_import_across_processes("exported_memory_maps_into_another_process");
}
