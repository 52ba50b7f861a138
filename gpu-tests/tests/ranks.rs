//! Ranks joined by unique id (`init_rank`), one thread per GPU: the plain path and the
//! copy-engine path between them.
#![cfg(any(feature = "nccl", feature = "rccl"))]

use unicomm_core::Result;
use unicomm_gpu_tests as t;
use unicomm_gpu_tests::GPU;

#[test]
fn explicit_init_rank_from_one_thread_per_gpu() -> Result<()> {
    t::init_rank_per_thread(&GPU)
}
#[test]
fn copy_engine_path_with_init_rank_moves_exact_data() -> Result<()> {
    t::copy_engine_init_rank(&GPU)
}
