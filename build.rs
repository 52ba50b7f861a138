//! Short cfg names for feature combinations (as wgpu-hal does), so the facade's dispatch reads
//! `#[cfg(one_backend)]` instead of repeating the combination.
fn main() {
    cfg_aliases::cfg_aliases! {
        one_backend: { not(any(
            all(feature = "mock", feature = "nccl"),
            all(feature = "mock", feature = "rccl"),
            all(feature = "nccl", feature = "rccl")
        )) },
        all_backends: { all(feature = "mock", feature = "nccl", feature = "rccl") },
    }
}
