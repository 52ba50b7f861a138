//! What building candle's CUDA backend needs on a machine without CUDA (the development
//! machine builds the GPU bundle): nvcc and the CUDA headers from NVIDIA's Python wheels of
//! CUDA 13.0 (the GPU machine's driver and toolkit), and link stubs of the CUDA libraries
//! candle links (`dynamic-linking`), whose sonames the GPU machine's CUDA 13.0 provides. All
//! of it in `<target>/cuda-kit`, installed once; nothing system-wide.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use cargo_metadata::MetadataCommand;

use crate::cargo::{root, target_dir};

/// The wheels (`pip download`), pinned to the GPU machine's CUDA 13.0: nvcc, its front end
/// and NVVM, the runtime's headers, and CCCL (`<nv/target>`, which cuda_fp16.h includes).
const WHEELS: &[&str] = &[
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
];

/// The libraries candle's cudarc links (and, from the runtime wheel, libcudart.so.13, which
/// candle's kernels link), by cudarc module: the stub's name and the soname
/// of CUDA 13.0's library (what the binary will ask the GPU machine's loader for).
const STUBS: &[(&str, &str, &str)] = &[
    ("driver", "cuda", "libcuda.so.1"),
    ("cublas", "cublas", "libcublas.so.13"),
    ("cublaslt", "cublasLt", "libcublasLt.so.13"),
    ("curand", "curand", "libcurand.so.10"),
    ("nvrtc", "nvrtc", "libnvrtc.so.13"),
    ("nccl", "nccl", "libnccl.so.2"),
];

/// The toolkit's root (`bin/nvcc`, `include`, `lib/stubs`), installed on first use.
pub(crate) fn toolkit() -> Result<PathBuf> {
    let kit = target_dir("cuda-kit");
    let cuda = kit.join("nvidia/cu13");
    if cuda.join("bin/nvcc").is_file() && cuda.join("lib/stubs/libcudart.so").exists() {
        return Ok(cuda);
    }
    let wheels = kit.join("wheels");
    std::fs::create_dir_all(&wheels)?;
    let mut pip = Command::new("python3");
    pip.args(["-m", "pip", "download", "--no-deps", "--quiet", "-d"])
        .arg(&wheels)
        .args(WHEELS);
    crate::cargo::step("download CUDA 13.0's compiler and headers (pip)", pip)?;
    for w in std::fs::read_dir(&wheels)? {
        let w = w?.path();
        let mut unzip = Command::new("python3");
        unzip.args(["-m", "zipfile", "-e"]).arg(&w).arg(&kit);
        crate::cargo::step(&format!("unpack {}", w.display()), unzip)?;
    }
    executable(&cuda.join("bin"))?;
    executable(&cuda.join("nvvm/bin"))?;
    stubs(&cuda.join("lib/stubs"))?;
    // candle's kernels link the CUDA runtime (`-lcudart`): the wheel has only its soname.
    let cudart = cuda.join("lib/stubs/libcudart.so");
    let _ = std::fs::remove_file(&cudart);
    std::os::unix::fs::symlink(cuda.join("lib/libcudart.so.13"), &cudart)
        .context("linking libcudart.so to the wheel's libcudart.so.13")?;
    eprintln!(
        "cuda-kit: installed {} and link stubs of {} in {}",
        WHEELS.join(", "),
        STUBS.iter().map(|s| s.2).collect::<Vec<_>>().join(", "),
        cuda.display()
    );
    Ok(cuda)
}

/// CUDA 12.8's PTX assembler (`nvidia-cuda-nvcc-cu12`, whose wheel holds `ptxas` but no
/// `nvcc`), installed on first use: it assembles the kernels' PTX, declared at the lowest ISA
/// it accepts, into SASS that loads on CUDA 12 drivers.
pub(crate) fn ptxas12() -> Result<PathBuf> {
    let kit = target_dir("cuda-kit").join("cu12");
    let ptxas = kit.join("nvidia/cuda_nvcc/bin/ptxas");
    if ptxas.is_file() {
        return Ok(ptxas);
    }
    let wheels = kit.join("wheels");
    std::fs::create_dir_all(&wheels)?;
    let mut pip = Command::new("python3");
    pip.args(["-m", "pip", "download", "--no-deps", "--quiet", "-d"])
        .arg(&wheels)
        .arg(PTXAS_12);
    crate::cargo::step("download CUDA 12.8's ptxas (pip)", pip)?;
    for w in std::fs::read_dir(&wheels)? {
        let mut unzip = Command::new("python3");
        unzip.args(["-m", "zipfile", "-e"]).arg(w?.path()).arg(&kit);
        crate::cargo::step("unpack CUDA 12.8's ptxas", unzip)?;
    }
    executable(&kit.join("nvidia/cuda_nvcc/bin"))?;
    Ok(ptxas)
}

/// The wheel of [`ptxas12`], pinned.
const PTXAS_12: &str = "nvidia-cuda-nvcc-cu12==12.8.93";

/// The environment of [`with_toolkit`] as shell `export` lines, for an engine's own build
/// (`eval "$(cargo xtask cuda-kit)"`), with the link stubs on the linker's search path.
pub(crate) fn exports(cuda: &Path, compute_cap: &str) -> String {
    let q = |p: &Path| format!("'{}'", p.display().to_string().replace('\'', "'\\''"));
    format!(
        "export PATH={bin}:\"$PATH\"\n\
         export CUDA_ROOT={root}\n\
         export CUDA_COMPUTE_CAP={compute_cap}\n\
         export CUDARC_CUDA_VERSION=13000\n\
         export LIBRARY_PATH={stubs}${{LIBRARY_PATH:+:$LIBRARY_PATH}}\n",
        bin = q(&cuda.join("bin")),
        root = q(cuda),
        stubs = q(&cuda.join("lib/stubs")),
    )
}

/// The environment of a build of candle's CUDA backend with `cuda`: nvcc first on PATH,
/// the toolkit for candle's kernels and cudarc's link search, sm_90 (the H200), and
/// cudarc's bindings of CUDA 13.0.
pub(crate) fn with_toolkit(c: &mut Command, cuda: &Path) {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![cuda.join("bin")];
    paths.extend(std::env::split_paths(&path));
    if let Ok(p) = std::env::join_paths(paths) {
        c.env("PATH", p);
    }
    c.env("CUDA_ROOT", cuda)
        .env("CUDA_COMPUTE_CAP", "90")
        .env("CUDARC_CUDA_VERSION", "13000");
}

/// The wheels' programs lose their mode bits in the zip.
fn executable(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for f in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let f = f?.path();
        if f.is_file() {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    Ok(())
}

/// One shared library per entry of [`STUBS`], defining every function cudarc declares for
/// that library (empty bodies: they are only linked against, never loaded).
fn stubs(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let meta = MetadataCommand::new()
        .manifest_path(root().join("Cargo.toml"))
        .exec()
        .context("cargo metadata")?;
    let cudarc = meta
        .packages
        .iter()
        .find(|p| p.name.as_str() == "cudarc")
        .context("cudarc is not among the workspace's packages")?;
    let src = cudarc.manifest_path.parent().context("cudarc's folder")?;
    for (module, lib, soname) in STUBS {
        let sys = src.join(format!("src/{module}/sys/mod.rs"));
        let text = std::fs::read_to_string(&sys).with_context(|| format!("reading {sys}"))?;
        let mut names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("fn "))
            .filter_map(|l| l.split('(').next())
            .filter(|n| n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .collect();
        names.sort_unstable();
        names.dedup();
        if names.is_empty() {
            bail!("no functions found in {sys}");
        }
        let c_file = dir.join(format!("{lib}.c"));
        let body: String = names
            .iter()
            .map(|n| format!("void {n}(void) {{}}\n"))
            .collect();
        std::fs::write(&c_file, body)?;
        let mut cc = Command::new("cc");
        cc.args(["-shared", "-fPIC", "-o"])
            .arg(dir.join(format!("lib{lib}.so")))
            .arg(format!("-Wl,-soname,{soname}"))
            .arg(&c_file);
        crate::cargo::step(
            &format!("link stub {soname} ({} functions)", names.len()),
            cc,
        )?;
    }
    Ok(())
}

/// NVIDIA's NCCL EP wheel and the NCCL whose headers its JIT compiles against (the release
/// the GPU bundle carries), pinned. The library is fetched, never committed.
const NCCL_EP_WHEELS: &[&str] = &["nccl-extensions==0.1.0", "nvidia-nccl-cu13==2.32.3"];

/// NCCL EP for the bundle, unpacked once into `<target>/cuda-kit/nccl-ep`: `ep/` (its
/// libraries for CUDA 12 and 13 drivers, `lib/cu12` and `lib/cu13`, and its JIT's headers,
/// `include/`: `NCCL_EP_HOME`) and `nccl/include` (NCCL's headers: `NCCL_HOME`).
pub(crate) fn nccl_ep() -> Result<PathBuf> {
    let kit = target_dir("cuda-kit").join("nccl-ep");
    if kit.join("ep/lib/cu13/libnccl_ep.so").is_file() && kit.join("nccl/include/nccl.h").is_file()
    {
        return Ok(kit);
    }
    let wheels = kit.join("wheels");
    std::fs::create_dir_all(&wheels)?;
    let mut pip = Command::new("python3");
    // The wheel of this machine's Python: its libraries are the same in each.
    pip.args(["-m", "pip", "download", "--no-deps", "--quiet", "-d"])
        .arg(&wheels)
        .args(NCCL_EP_WHEELS);
    crate::cargo::step("download NCCL EP and NCCL's headers (pip)", pip)?;
    // Only the wheels' `nccl/ep/` and `nvidia/nccl/include/`: NCCL's own library stays out.
    let script = "import sys, zipfile, pathlib\n\
        out = pathlib.Path(sys.argv[1])\n\
        for w in sys.argv[2:]:\n\
        \x20   z = zipfile.ZipFile(w)\n\
        \x20   for n in z.namelist():\n\
        \x20       for pre, to in (('nccl/ep/', 'ep/'), ('nvidia/nccl/include/', 'nccl/include/')):\n\
        \x20           if n.startswith(pre) and not n.endswith('/'):\n\
        \x20               p = out / (to + n[len(pre):])\n\
        \x20               p.parent.mkdir(parents=True, exist_ok=True)\n\
        \x20               p.write_bytes(z.read(n))\n";
    let mut unzip = Command::new("python3");
    unzip.args(["-c", script]).arg(&kit);
    for w in std::fs::read_dir(&wheels)? {
        unzip.arg(w?.path());
    }
    crate::cargo::step("unpack NCCL EP and NCCL's headers", unzip)?;
    Ok(kit)
}
