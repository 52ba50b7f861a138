//! The copy-engine path's signals on a real GPU: ordering two streams, the host's release
//! after an abort, their cost per operation, and the protocol between two processes.
#![cfg(any(feature = "nccl", feature = "rccl"))]

use unicomm_core::Result;
use unicomm_gpu_tests as t;
use unicomm_gpu_tests::GPU;

#[test]
fn copy_engine_signals_order_two_streams() -> Result<()> {
    t::signals_order_two_streams(&GPU)
}
#[test]
fn copy_engine_signals_released_by_the_host() -> Result<()> {
    t::signals_released_by_the_host(&GPU)
}
#[test]
fn copy_engine_signals_latency_on_one_gpu() -> Result<()> {
    t::signals_latency_on_one_gpu(&GPU)
}
#[cfg(target_os = "linux")]
#[test]
fn copy_engine_signals_across_processes() -> Result<()> {
    t::signals_across_processes(&GPU, "copy_engine_signals_across_processes")
}
