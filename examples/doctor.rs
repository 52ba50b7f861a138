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
                    "  capabilities: registration={} windows={} native_all_to_all={} graph_capture={} mem_alloc={} device_counts={}",
                    caps.registration, caps.windows, caps.native_all_to_all, caps.graph_capture, caps.mem_alloc, caps.device_counts
                );
                // NCCL's device API: a device communicator in the loaded library's own layout.
                match comms[0].device_comm(&unicomm::DeviceCommRequirements::runtime(1)) {
                    Ok(dc) => println!(
                        "  device API: a device communicator of {} bytes (the runtime layout of {})",
                        dc.kernel_arg().len(),
                        dc.layout_version()
                    ),
                    Err(e) => println!("  device API: {e}"),
                }
                #[cfg(feature = "nccl")]
                if vendor == unicomm::Vendor::Cuda {
                    match unicomm::nccl::cuda().and_then(|rt| rt.symmetric_kernels_image(0)) {
                        Ok(s) => println!("  unicomm's symmetric kernels on device 0: {s}"),
                        Err(e) => println!("  unicomm's symmetric kernels: {e}"),
                    }
                }
            }
            Err(e) => println!("  no communicator: {e}"),
        }
    }
    nccl_parameters();
    match unicomm::resolve(unicomm::Vendor::Auto) {
        Ok((v, why)) => println!("\nVendor::Auto picks {v}: {why}"),
        Err(e) => println!("\nVendor::Auto: {e}"),
    }
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
        })
        .collect();
    if let Some(p) = user_library_path() {
        keys.push(("LD_LIBRARY_PATH".into(), p));
    }
    keys.sort();
    if keys.is_empty() {
        println!("  (no NCCL_*, RCCL_*, UNICOMM_*, HIP_*, ROCM_*, HSA_*, CUDA_* variables set)");
    }
    for (k, v) in keys {
        println!("  {k}={v}");
    }
}

/// `LD_LIBRARY_PATH` as the user set it: `cargo run` (and so `cargo xtask doctor`) prepends
/// its own target and toolchain directories, which say nothing about this machine.
fn user_library_path() -> Option<String> {
    let p = std::env::var("LD_LIBRARY_PATH").ok()?;
    let target = std::env::current_exe().ok().and_then(|e| {
        e.ancestors()
            .find(|a| a.ends_with("target"))
            .map(|a| a.to_path_buf())
    });
    let kept: Vec<&str> = p
        .split(':')
        .filter(|d| !d.is_empty())
        .filter(|d| {
            !target
                .as_ref()
                .is_some_and(|t| std::path::Path::new(d).starts_with(t))
        })
        .filter(|d| !d.contains("/.rustup/toolchains/"))
        .collect();
    (!kept.is_empty()).then(|| kept.join(":"))
}

/// NCCL's parameters in effect (its parameter API, NCCL >= 2.30.4): every key NCCL documents
/// with its value, whether set by the environment, a config file or NCCL's default.
#[cfg(feature = "nccl")]
fn nccl_parameters() {
    match unicomm::nccl::nccl().and_then(|api| api.parameters()) {
        Ok(ps) => {
            println!("\nNCCL's parameters in effect ({}):", ps.len());
            for (k, v) in ps {
                println!("  {k}={v}");
            }
        }
        Err(e) => println!("\nNCCL's parameters: {e}"),
    }
}

#[cfg(not(feature = "nccl"))]
fn nccl_parameters() {}
