//! `kernels`: unicomm's GPU kernels built from their source (`backend-nccl/kernels/*.cu`)
//! into the PTX the CUDA backend embeds, with nvcc 13.0 from the CUDA kit; each PTX's
//! first line names its source's SHA-256, which the architecture test compares (a PTX
//! built from another source, or edited by hand, fails `cargo xtask test`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use crate::cargo::root;

/// Where the kernels' sources and their PTX lie.
pub(crate) const KERNELS_DIR: &str = "backend-nccl/kernels";
/// The GPU architecture the PTX is built for (H100/H200; newer GPUs JIT it).
const ARCH: &str = "sm_90";

/// The first line of a PTX built from `source` (its text).
pub(crate) fn header(source: &str) -> String {
    let digest = Sha256::digest(source.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("// unicomm: built by `cargo xtask kernels` from source sha256 {hex}")
}

/// The kernels' sources, sorted.
pub(crate) fn sources() -> Result<Vec<PathBuf>> {
    let dir = root().join(KERNELS_DIR);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    v.sort();
    Ok(v)
}

/// Builds every source's PTX beside it.
pub(crate) fn kernels() -> Result<()> {
    let kit = crate::cuda_kit::toolkit()?;
    for src in sources()? {
        build(&kit, &src)?;
    }
    Ok(())
}

fn build(kit: &Path, src: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(src).with_context(|| format!("reading {}", src.display()))?;
    let ptx = src.with_extension("ptx");
    let tmp = src.with_extension("ptx.tmp");
    let mut nvcc = Command::new(kit.join("bin/nvcc"));
    nvcc.args(["-ptx", "-O3", "-std=c++17", &format!("-arch={ARCH}")])
        .arg("-I")
        .arg(kit.join("include"))
        .arg("-o")
        .arg(&tmp)
        .arg(src);
    crate::cargo::step(&format!("nvcc -ptx {}", src.display()), nvcc)?;
    let body = std::fs::read_to_string(&tmp)?;
    std::fs::remove_file(&tmp)?;
    std::fs::write(&ptx, format!("{}\n{body}", header(&text)))
        .with_context(|| format!("writing {}", ptx.display()))?;
    eprintln!("kernels: {} from {}", ptx.display(), src.display());
    Ok(())
}
