//! The copy-engine path's signals on a real GPU: ordering two streams, the host's release
//! after an abort, their cost per operation, and the protocol between two processes.
#![cfg(any(feature = "nccl", feature = "rccl"))]

unicomm_gpu_tests::on_gpu! {
    copy_engine_signals_order_two_streams => signals_order_two_streams;
    copy_engine_signals_released_by_the_host => signals_released_by_the_host;
    copy_engine_signals_latency_on_one_gpu => signals_latency_on_one_gpu;
    #[cfg(target_os = "linux")]
    copy_engine_signals_across_processes => signals_across_processes("copy_engine_signals_across_processes");
}
