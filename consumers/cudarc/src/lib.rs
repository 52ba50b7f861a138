//! Uses both: a device of the program's own cudarc and unicomm's NCCL vendor, so that the
//! check type-checks both sides of the link in the same binary.

/// Whether the program's cudarc sees a device, and unicomm's NCCL vendor probes.
pub fn both() -> (bool, bool) {
    let own = cudarc::driver::CudaContext::new(0).is_ok();
    let ours = unicomm::Vendor::Cuda.to_string() == "cuda";
    (own, ours)
}
