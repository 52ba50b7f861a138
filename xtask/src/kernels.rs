//! `kernels`: unicomm's GPU kernels built from their source (`nccl-api/kernels/*.cu`, the
//! symmetric kernels every runtime loads; `backend-nccl/kernels/*.cu`, the device-API
//! kernel) into the PTX the backends embed, with nvcc 13.0 from the CUDA kit; each PTX's
//! first line names its source's SHA-256, which the architecture test compares (a PTX
//! built from another source, or edited by hand, fails `cargo xtask test`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use crate::cargo::root;

/// Where the kernels' sources and their PTX lie.
pub(crate) const KERNELS_DIRS: [&str; 2] = ["nccl-api/kernels", "backend-nccl/kernels"];
/// The GPU architecture the PTX is built for (H100/H200; newer GPUs JIT it).
const ARCH: &str = "sm_90";
/// The NCCL whose device-API headers a kernel including `nccl_device.h` is built against
/// (nccl-api's `DEVICE_KERNEL_HEADERS`: the layout of the device communicator it takes).
const NCCL_HEADERS: &str = "nvidia-nccl-cu13==2.32.3";

/// The first line of a PTX built from `source` (its text).
pub(crate) fn header(source: &str) -> String {
    let digest = Sha256::digest(source.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("// unicomm: built by `cargo xtask kernels` from source sha256 {hex}")
}

/// The kernels' sources, sorted.
pub(crate) fn sources() -> Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = Vec::new();
    for d in KERNELS_DIRS {
        let dir = root().join(d);
        v.extend(
            std::fs::read_dir(&dir)
                .with_context(|| format!("reading {}", dir.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "cu")),
        );
    }
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

/// NCCL's headers of [`NCCL_HEADERS`] (from its wheel, `pip download`, once), for the
/// kernels written against its device API.
fn nccl_headers() -> Result<PathBuf> {
    let dir = crate::cargo::target_dir("cuda-kit").join("nccl-headers");
    let include = dir.join("nvidia/nccl/include");
    if include.join("nccl_device.h").is_file() {
        return Ok(include);
    }
    let wheels = dir.join("wheel");
    std::fs::create_dir_all(&wheels)?;
    let mut pip = Command::new("python3");
    pip.args(["-m", "pip", "download", "--no-deps", "--quiet"])
        .args([
            "--only-binary=:all:",
            "--platform",
            "manylinux_2_27_x86_64",
            "-d",
        ])
        .arg(&wheels)
        .arg(NCCL_HEADERS);
    crate::cargo::step(
        &format!("download {NCCL_HEADERS} for its headers (pip)"),
        pip,
    )?;
    // The headers alone (the wheel's library is not needed to build PTX).
    let script = "import sys, zipfile\nfor w in sys.argv[2:]:\n  z = zipfile.ZipFile(w)\n  [z.extract(n, sys.argv[1]) for n in z.namelist() if '/include/' in n]";
    let mut unzip = Command::new("python3");
    unzip.args(["-c", script]).arg(&dir);
    for w in std::fs::read_dir(&wheels)? {
        unzip.arg(w?.path());
    }
    crate::cargo::step("unpack NCCL's headers", unzip)?;
    Ok(include)
}

fn build(kit: &Path, src: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(src).with_context(|| format!("reading {}", src.display()))?;
    let nccl = match text.contains("#include <nccl_device.h>") {
        true => Some(nccl_headers()?),
        false => None,
    };
    let ptx = src.with_extension("ptx");
    let tmp = src.with_extension("ptx.tmp");
    let mut nvcc = Command::new(kit.join("bin/nvcc"));
    nvcc.args(["-ptx", "-O3", "-std=c++17", &format!("-arch={ARCH}")])
        .arg("-I")
        .arg(kit.join("include"));
    if let Some(include) = &nccl {
        nvcc.arg("-I").arg(include);
    }
    nvcc.arg("-o").arg(&tmp).arg(src);
    crate::cargo::step(&format!("nvcc -ptx {}", src.display()), nvcc)?;
    let body = std::fs::read_to_string(&tmp)?;
    std::fs::remove_file(&tmp)?;
    std::fs::write(&ptx, format!("{}\n{body}", header(&text)))
        .with_context(|| format!("writing {}", ptx.display()))?;
    eprintln!("kernels: {} from {}", ptx.display(), src.display());
    if nccl.is_none() {
        fatbin(kit, src, &body)?;
    }
    Ok(())
}

/// The kernels' image for CUDA 12 drivers beside their PTX (`<name>.fatbin`): the PTX declared
/// at ISA [`FATBIN_PTX_ISA`] (the lowest CUDA 12.8's `ptxas` accepts for what nvcc 13 emits),
/// assembled by that `ptxas` into SASS for each of [`FATBIN_SASS`], and kept as PTX for
/// newer GPUs, packed by nvcc 13's `fatbinary`.
fn fatbin(kit: &Path, src: &Path, body: &str) -> Result<()> {
    let ptxas = crate::cuda_kit::ptxas12()?;
    let isa = format!(".version {}.{}", FATBIN_PTX_ISA.0, FATBIN_PTX_ISA.1);
    let lowered = retarget(body, &isa)?;
    let dir = src.with_extension("fatbin.d");
    std::fs::create_dir_all(&dir)?;
    let ptx = dir.join("kernels.ptx");
    std::fs::write(&ptx, &lowered)?;
    let mut pack = Command::new(kit.join("bin/fatbinary"));
    // Uncompressed: CUDA 13's default compression of the PTX may be one an older driver
    // cannot unpack.
    pack.args(["-64", "--compress=false"]).arg(format!(
        "--create={}",
        src.with_extension("fatbin").display()
    ));
    for sm in FATBIN_SASS {
        let cubin = dir.join(format!("sm_{sm}.cubin"));
        let mut asm = Command::new(&ptxas);
        asm.args(["-O3", &format!("-arch=sm_{sm}"), "-o"])
            .arg(&cubin)
            .arg(&ptx);
        crate::cargo::step(&format!("ptxas 12.8 sm_{sm} {}", src.display()), asm)?;
        pack.arg(format!(
            "--image3=kind=elf,sm={sm},file={}",
            cubin.display()
        ));
    }
    pack.arg(format!(
        "--image3=kind=ptx,sm={},file={}",
        FATBIN_SASS[0],
        ptx.display()
    ));
    crate::cargo::step(&format!("fatbinary {}", src.display()), pack)?;
    std::fs::remove_dir_all(&dir)?;
    eprintln!("kernels: {}", src.with_extension("fatbin").display());
    Ok(())
}

/// `body` (PTX) with its `.version` line replaced by `isa`.
pub(crate) fn retarget(body: &str, isa: &str) -> Result<String> {
    let mut found = false;
    let lines: Vec<&str> = body
        .lines()
        .map(|l| match l.starts_with(".version ") {
            true => {
                found = true;
                isa
            }
            false => l,
        })
        .collect();
    anyhow::ensure!(found, "no .version line in the PTX");
    Ok(lines.join("\n") + "\n")
}

/// The PTX ISA the fatbin's PTX is declared at: nccl-api's `SYMMETRIC_PTX_ISA`, whose test
/// reads it back from the fatbin (8.3: what nvcc 13 emits uses `used_bytes_mask`, 8.3's).
const FATBIN_PTX_ISA: (u32, u32) = (8, 3);
/// The GPUs the fatbin holds SASS for: nccl-api's `SYMMETRIC_SASS`, checked the same way.
const FATBIN_SASS: [u32; 2] = [90, 100];
