//! `cargo xtask doctor`: what this machine offers unicomm. Devices, driver and runtime
//! versions, the NCCL/RCCL library path and version, capabilities, and the environment
//! variables that change NCCL/RCCL behaviour. "Not found" lines say what was tried.

fn main() {
    println!("unicomm {} doctor", env!("CARGO_PKG_VERSION"));
    for vendor in [
        unicomm::Vendor::Cuda,
        unicomm::Vendor::Rocm,
        unicomm::Vendor::Mock,
    ] {
        println!("\n[{vendor}]");
        match unicomm::probe(vendor) {
            Ok(found) => println!("  found: {found}"),
            Err(e) => println!("  not usable: {e}"),
        }
        match unicomm::local_comms_n(vendor, Some(1)) {
            Ok(comms) => {
                let caps = comms[0].capabilities();
                println!(
                    "  library: {} {} at {}",
                    caps.backend, caps.version, caps.library_path
                );
                println!(
                    "  capabilities: registration={} windows={} native_all_to_all={} graph_capture={} mem_alloc={}",
                    caps.registration, caps.windows, caps.native_all_to_all, caps.graph_capture, caps.mem_alloc
                );
            }
            Err(e) => println!("  no communicator: {e}"),
        }
    }
    let (v, why) = unicomm::resolve(unicomm::Vendor::Auto);
    println!("\n--vendor auto picks {v}: {why}");
    println!("\nenvironment:");
    let mut keys: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| {
            k.starts_with("NCCL_")
                || k.starts_with("RCCL_")
                || k.starts_with("UNICOMM_")
                || k.starts_with("HIP_")
                || k.starts_with("ROCM_")
                || k.starts_with("HSA_")
                || k.starts_with("CUDA_")
                || k.starts_with("NVSHMEM_")
                || k.starts_with("TORCH_SYMM")
                || k == "LD_LIBRARY_PATH"
        })
        .collect();
    keys.sort();
    if keys.is_empty() {
        println!("  (no NCCL_*, RCCL_*, UNICOMM_*, HIP_*, ROCM_*, HSA_*, CUDA_* variables set)");
    }
    for (k, v) in keys {
        println!("  {k}={v}");
    }
}
