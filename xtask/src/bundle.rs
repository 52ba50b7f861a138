//! `bundle`: release binaries and the run scripts in `dist/unicomm-bundle`, for a GPU
//! machine without a Rust toolchain.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};
use cargo_metadata::TargetKind;

use crate::cargo::{cargo, named, root, target_dir};
use crate::cli::{BundlePart, Opts, Vendor};
use crate::gpu::{GpuVendor, SUITE_WORLDS};

/// The CUDA API of cudarc's bindings in a bundle, where `CUDARC_CUDA_VERSION` does not name
/// one: 12.8, what the bundles were verified with (driver 580). unicomm forces no version on
/// the programs around it, and without `nvcc` cudarc would take its newest bindings, whose
/// entry points an older driver may lack.
const BUNDLE_CUDA_API: &str = "12080";

/// `cargo` for a bundle's builds, with [`BUNDLE_CUDA_API`] unless the caller named one.
fn bundle_cargo() -> Command {
    let mut c = cargo();
    if std::env::var_os("CUDARC_CUDA_VERSION").is_none() {
        c.env("CUDARC_CUDA_VERSION", BUNDLE_CUDA_API);
    }
    c
}

/// The test binaries of `pkg` (its targets `names`, built with `features`), each named
/// `<prefix>-<target>` in the bundle.
fn test_binaries(
    pkg: &str,
    features: &str,
    names: &[&str],
    prefix: &str,
) -> Result<Vec<(PathBuf, String)>> {
    let mut t = bundle_cargo();
    t.args(["test", "--release", "-p", pkg, "--no-run"]);
    if !features.is_empty() {
        t.args(["--features", features]);
    }
    let what = format!("build test binaries of {pkg}");
    Ok(named(&what, t, TargetKind::Test, names)?
        .into_iter()
        .map(|(exe, target)| (exe, format!("{prefix}-{target}")))
        .collect())
}

/// The unit tests of `pkg`'s library as one binary called `name` in the bundle.
fn unit_tests(pkg: &str, name: &str) -> Result<Vec<(PathBuf, String)>> {
    let mut t = bundle_cargo();
    t.args(["test", "--release", "-p", pkg, "--lib", "--no-run"]);
    let what = format!("build the unit tests of {pkg}");
    let found = crate::cargo::executables(&what, t, |a| {
        (a.profile.test && a.target.is_kind(TargetKind::Lib)).then(|| name.to_string())
    })?;
    if found.is_empty() {
        bail!("{what}: cargo built no test binary of the library");
    }
    Ok(found)
}

/// Release binaries (examples, GPU test binaries, the overhead benchmark), `run.sh` and `parts.sh` in
/// `dist/unicomm-bundle`, for the vendor asked for (`auto`: both GPU vendors). Always a
/// release build: timings are part of the run.
pub(crate) fn bundle(o: &Opts, only: Option<BundlePart>) -> Result<()> {
    if !o.args.is_empty() {
        bail!("bundle takes no program arguments (got {:?})", o.args);
    }
    if only == Some(BundlePart::Kernels) && o.vendor != Vendor::Cuda {
        bail!("the kernels part is CUDA's: --vendor cuda");
    }
    let vendors: &[GpuVendor] = match o.vendor {
        Vendor::Cuda => &[GpuVendor::Cuda],
        Vendor::Rocm => &[GpuVendor::Rocm],
        Vendor::Auto => &[GpuVendor::Cuda, GpuVendor::Rocm],
        Vendor::Mock => bail!("the bundle is for GPU machines: --vendor cuda, rocm or auto"),
    };
    let out = root().join("dist/unicomm-bundle");
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    if only == Some(BundlePart::Kernels) {
        write_bundle(&out, &kernels_binaries()?)?;
        return with_nccl_ep(&out);
    }
    let mut copies = common_binaries(vendors)?;
    for &v in vendors {
        copies.extend(vendor_binaries(v)?);
    }
    write_bundle(&out, &copies)?;
    match vendors.contains(&GpuVendor::Cuda) {
        true => with_nccl_ep(&out),
        false => Ok(()),
    }
}

/// NCCL EP (its libraries for CUDA 12 and 13 drivers, the headers its JIT reads, NCCL's
/// headers) under `out/nccl-ep`, as fetched: run.sh points `NCCL_EP_HOME` and `NCCL_HOME`
/// at it.
fn with_nccl_ep(out: &std::path::Path) -> Result<()> {
    let kit = crate::cuda_kit::nccl_ep()?;
    let to = out.join("nccl-ep");
    std::fs::create_dir_all(&to).with_context(|| format!("creating {}", to.display()))?;
    let mut cp = Command::new("cp");
    cp.arg("-r")
        .arg(kit.join("ep"))
        .arg(kit.join("nccl"))
        .arg(&to);
    crate::cargo::step("copy NCCL EP into the bundle", cp)
}

/// The examples, the benchmark and the launcher, with the features of `vendors`.
fn common_binaries(vendors: &[GpuVendor]) -> Result<Vec<(PathBuf, String)>> {
    let mut copies: Vec<(PathBuf, String)> = Vec::new();
    let features = if vendors.len() == 2 {
        "nccl,rccl,mock"
    } else if vendors[0] == GpuVendor::Cuda {
        "nccl,mock"
    } else {
        "rccl,mock"
    };
    let examples = [
        "allreduce_ub",
        "alltoall_ub",
        "by_id",
        "doctor",
        "from_env",
        "faults",
        "grow",
        "rank_conformance",
        "engine_mesh",
        "shrink",
        "split_abort",
        "symmetric_decode",
    ];
    copies.extend(facade_examples(features, &examples)?);
    // The rendezvous's own tests (a squatter, a replayed hello, a stale rank 0 sharing the
    // port, strangers' connections): run on the GPU machine's network stack too.
    copies.extend(unit_tests("unicomm-bootstrap", "bootstrap-unit")?);
    copies.extend(bench_and_launcher()?);
    Ok(copies)
}

/// The facade's `examples`, released with `features`.
fn facade_examples(features: &str, examples: &[&str]) -> Result<Vec<(PathBuf, String)>> {
    let mut ex = bundle_cargo();
    ex.args([
        "build",
        "--release",
        "-p",
        "unicomm",
        "--features",
        features,
    ]);
    for e in examples {
        ex.args(["--example", e]);
    }
    named("build release examples", ex, TargetKind::Example, examples)
}

/// The benchmark and the launcher (`xtask launch --procs N -- prog`, one rank per process).
fn bench_and_launcher() -> Result<Vec<(PathBuf, String)>> {
    let mut b = bundle_cargo();
    b.args(["build", "--release", "-p", "unicomm-bench", "-p", "xtask"]);
    named(
        "build the benchmark and the launcher",
        b,
        TargetKind::Bin,
        &["unicomm-bench", "xtask"],
    )
}

/// One vendor's benchmarks, loader tests, test runtime and GPU test binaries.
fn vendor_binaries(v: GpuVendor) -> Result<Vec<(PathBuf, String)>> {
    let mut copies = Vec::new();
    match v {
        GpuVendor::Cuda => {
            let mut ov = bundle_cargo();
            ov.args([
                "build",
                "--release",
                "-p",
                "unicomm-nccl",
                "--example",
                "overhead",
                "--example",
                "overlap",
            ]);
            copies.extend(named(
                "build the overhead and overlap benchmarks",
                ov,
                TargetKind::Example,
                &["overhead", "overlap"],
            )?);
            copies.extend(test_binaries("unicomm-nccl", "", &["loader"], "nccl")?);
            copies.extend(candle_binaries()?);
            copies.extend(kernel_probes()?);
        }
        GpuVendor::Rocm => {
            copies.extend(test_binaries("unicomm-rccl", "", &["hip_loader"], "rccl")?);
            // The test-only HIP runtime over the CUDA driver: the RCCL backend's code on
            // an NVIDIA GPU (run.sh's `rccl-on-cuda` part). Its own workspace, no deps.
            let target = target_dir("hip-on-cuda");
            let mut shim = bundle_cargo();
            shim.args(["build", "--release", "--offline", "--manifest-path"])
                .arg(root().join("backend-rccl/tests/hip-on-cuda/Cargo.toml"))
                .arg("--target-dir")
                .arg(&target);
            crate::cargo::step("build the HIP-on-CUDA test runtime", shim)?;
            copies.push((
                target.join("release/libunicomm_hip_on_cuda.so"),
                "libunicomm_hip_on_cuda.so".to_string(),
            ));
        }
    }
    // The GPU test crate, one binary per area: `<vendor>-<area>`.
    copies.extend(test_binaries(
        "unicomm-gpu-tests",
        v.feature(),
        v.areas(),
        v.feature(),
    )?);
    Ok(copies)
}

/// unicomm-candle's examples on candle's CUDA backend (`llama_tp`, `pipeline_tp`,
/// `allreduce_cost`): candle's
/// kernels are compiled by nvcc 13.0 from NVIDIA's wheels (`cuda_kit`), in a target
/// directory of their own (cudarc is built with candle's features there).
fn candle_binaries() -> Result<Vec<(PathBuf, String)>> {
    let kit = crate::cuda_kit::toolkit()?;
    let mut c = bundle_cargo();
    crate::cuda_kit::with_toolkit(&mut c, &kit);
    c.args(["build", "--release", "-p", "unicomm-candle"])
        .args(["--features", "bench-candle-nccl"])
        .args(["--example", "llama_tp", "--example", "allreduce_cost"])
        .args(["--example", "pipeline_tp", "--example", "captured_step"])
        .arg("--target-dir")
        .arg(target_dir("candle-cuda"));
    named(
        "build unicomm-candle's examples on candle's CUDA backend",
        c,
        TargetKind::Example,
        &["llama_tp", "allreduce_cost", "pipeline_tp", "captured_step"],
    )
}

/// What the kernels part runs: the doctor and `rank_conformance`, the benchmark and the
/// launcher, the kernel probes.
fn kernels_binaries() -> Result<Vec<(PathBuf, String)>> {
    let mut copies = facade_examples("nccl,mock", &["doctor", "rank_conformance"])?;
    copies.extend(bench_and_launcher()?);
    copies.extend(kernel_probes()?);
    Ok(copies)
}

/// The kernel probes (`bench/probe/`: where a world-1 launch of the symmetric kernels spends
/// its time), built by their script with the toolkit candle's kernels use, for the
/// `kernels` part.
fn kernel_probes() -> Result<Vec<(PathBuf, String)>> {
    let kit = crate::cuda_kit::toolkit()?;
    let out = target_dir("kernel-probes");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut c = Command::new("bash");
    c.arg(root().join("bench/probe/build.sh"))
        .arg(&out)
        .env("CUDA_KIT", &kit);
    crate::cargo::step("build the kernel probes (nvcc 13.0)", c)?;
    Ok(["probe", "stages"]
        .into_iter()
        .map(|p| (out.join(p), p.to_string()))
        .collect())
}

/// The binaries (stripped), the suite's world sizes and the run scripts, into `out`.
fn write_bundle(out: &std::path::Path, copies: &[(PathBuf, String)]) -> Result<()> {
    for (src, name) in copies {
        let dst = out.join(name);
        std::fs::copy(src, &dst)
            .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
        // Smaller transfers; a missing strip only costs size.
        let _ = Command::new("strip").arg(&dst).status();
    }
    // The suite's world sizes for the run script, from the one list above.
    let worlds: String = SUITE_WORLDS
        .iter()
        .enumerate()
        .map(|(i, w)| format!("{w} world_{}_{w}\n", i + 1))
        .collect();
    std::fs::write(out.join("worlds.txt"), worlds).context("writing worlds.txt")?;
    // run.sh runs the tests and benchmarks (PARTS picks some); parts.sh runs it once per
    // part of PARTS_LIST with one tarball of logs each (for calls that bring few files back).
    for (name, text) in [
        ("run.sh", include_str!("../bundle-run.sh")),
        ("parts.sh", include_str!("../bundle-parts.sh")),
        ("multirank.sh", include_str!("../bundle-multirank.sh")),
        ("kernels.sh", include_str!("../bundle-kernels.sh")),
    ] {
        let script = out.join(name);
        std::fs::write(&script, text).with_context(|| format!("writing {name}"))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    eprintln!(
        "bundle ready: {} (copy it to the GPU machine and run ./run.sh, or PARTS_LIST=\"...\" ./parts.sh)",
        out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The bundle's `run.sh` (and the part scripts it sources) in a folder of their own with
    /// no binaries, run for `PARTS=part`: whether it passed, and what it printed.
    #[cfg(unix)]
    fn run_part_without_binaries(part: &str) -> (bool, String) {
        let dir =
            std::env::temp_dir().join(format!("unicomm-bundle-{part}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in [
            ("run.sh", include_str!("../bundle-run.sh")),
            ("kernels.sh", include_str!("../bundle-kernels.sh")),
        ] {
            std::fs::write(dir.join(name), text).unwrap();
        }
        let out = std::process::Command::new("bash")
            .arg(dir.join("run.sh"))
            .env("PARTS", part)
            .env("OUT", dir.join("logs"))
            .env_remove("NCCL")
            .output()
            .expect("bash runs the bundle's run.sh");
        let _ = std::fs::remove_dir_all(&dir);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// A part run from a bundle that holds none of a vendor's binaries (a slim tar made
    /// for a short device call) fails saying so: once it passed in 4 s having run nothing.
    #[cfg(unix)]
    #[test]
    fn a_part_without_any_vendor_binaries_fails_instead_of_passing() {
        for part in ["groups", "faults", "conformance"] {
            let (passed, text) = run_part_without_binaries(part);
            assert!(!passed, "PARTS={part} passed: {text}");
            assert!(
                text.contains("holds no vendor's binaries") && text.contains("overall rc=1"),
                "PARTS={part}: {text}"
            );
        }
    }

    /// The kernels part from a bundle without its probes and benchmark (one built without
    /// CUDA, or a slim tar) fails naming what is missing, rather than timing nothing.
    #[cfg(unix)]
    #[test]
    fn the_kernels_part_without_its_binaries_fails_naming_them() {
        let (passed, text) = run_part_without_binaries("kernels");
        assert!(!passed, "PARTS=kernels passed: {text}");
        assert!(text.contains("this bundle has no stages"), "{text}");
    }
}
