//! The opt-in GPU tests: which GPUs this machine has, and the vendor's suite at the world
//! sizes they allow (never skipped: a world the machine lacks is named, not passed).

use std::process::Command;

use anyhow::Result;

use crate::cargo::{cargo, step};

/// The conformance suite's world sizes (comm-core's rstest tables), the one list the xtask
/// and the bundle's run script use to say which sizes a machine has GPUs for. rstest names
/// a case by the value's position and value: `world_<index from 1>_<size>`.
pub(crate) const SUITE_WORLDS: [usize; 5] = [1, 2, 3, 4, 8];

/// `(size, rstest name)` of every suite world larger than `gpus`.
fn worlds_beyond(gpus: usize) -> Vec<(usize, String)> {
    SUITE_WORLDS
        .iter()
        .enumerate()
        .filter(|&(_, &w)| w > gpus.max(1))
        .map(|(i, &w)| (w, format!("world_{}_{w}", i + 1)))
        .collect()
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum GpuVendor {
    Cuda,
    Rocm,
}

impl GpuVendor {
    /// The GPU test crate's feature for this vendor, and the prefix of its binaries in the
    /// bundle.
    pub(crate) fn feature(self) -> &'static str {
        match self {
            GpuVendor::Cuda => "nccl",
            GpuVendor::Rocm => "rccl",
        }
    }
    /// The GPU test crate's test files (one per area) this vendor builds.
    pub(crate) fn areas(self) -> &'static [&'static str] {
        match self {
            GpuVendor::Cuda => &[
                "conformance",
                "groups",
                "registration",
                "ranks",
                "ipc",
                "signals",
                "cuda",
                "symmetric",
                "device_api",
                "config_log",
            ],
            GpuVendor::Rocm => &[
                "conformance",
                "groups",
                "registration",
                "ranks",
                "ipc",
                "signals",
                "symmetric",
            ],
        }
    }
    pub(crate) fn library(self) -> &'static str {
        match self {
            GpuVendor::Cuda => "NCCL",
            GpuVendor::Rocm => "RCCL",
        }
    }
}

/// The opt-in GPU tests of one vendor (the `unicomm-gpu-tests` crate, one file per area):
/// conformance at the world sizes the machine has GPUs for, registration, windows,
/// init_rank, the copy engines' exchange and signals, and the vendor's own.
/// Without the vendor's GPU they fail with `NoDevice`/`LibraryNotFound`; never skipped.
pub(crate) fn gpu_tests(v: GpuVendor, args: &[String], gpus: usize) -> Result<()> {
    let mut g = cargo();
    g.args([
        "test",
        "--release",
        "-p",
        "unicomm-gpu-tests",
        "--features",
        v.feature(),
        "--",
        "--test-threads=1",
    ]);
    for (w, name) in worlds_beyond(gpus) {
        eprintln!("GPU conformance: world size {w} not run ({gpus} GPU(s) here)");
        g.args(["--skip", &name]);
    }
    g.env("UNICOMM_GPU_WORLD", gpus.max(1).to_string());
    g.args(args);
    step(&format!("GPU tests on {}", v.library()), g)
}

/// AMD GPUs visible here (KFD topology nodes with compute units), 0 without ROCm.
pub(crate) fn amd_gpus() -> usize {
    std::fs::read_dir("/sys/class/kfd/kfd/topology/nodes")
        .map(|rd| {
            rd.flatten()
                .filter(|n| {
                    std::fs::read_to_string(n.path().join("properties"))
                        .map(|p| {
                            p.lines()
                                .any(|l| l.starts_with("simd_count") && !l.ends_with(" 0"))
                        })
                        .unwrap_or(false)
                })
                .count()
        })
        .unwrap_or(0)
}

/// NVIDIA GPUs visible here (`nvidia-smi -L`), 0 when there is no driver.
pub(crate) fn nvidia_gpus() -> usize {
    Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.starts_with("GPU"))
                .count()
        })
        .unwrap_or(0)
}
