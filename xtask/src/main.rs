//! `cargo xtask build|run|test|bench|doctor|bundle [--vendor auto|cuda|rocm|mock] [--release]
//! [-- args]`: the project's commands, per vendor. The vendor picks the cargo features
//! (cuda -> nccl, rocm -> rccl, mock -> mock); `auto` compiles every backend and lets the
//! program pick the GPU it finds, falling back to the mock and saying why.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

mod launch;
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "unicomm's build, run, test and bundle commands"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
enum Vendor {
    Auto,
    Cuda,
    Rocm,
    Mock,
}

#[derive(clap::Args, Clone)]
struct Opts {
    /// Which vendor's backend.
    #[arg(long, value_enum, default_value = "auto")]
    vendor: Vendor,
    /// Optimised build.
    #[arg(long)]
    release: bool,
    /// Arguments passed through to the program.
    #[arg(last = true)]
    args: Vec<String>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build the library and examples for the vendor.
    Build(Opts),
    /// Run an example (allreduce_ub by default) on the vendor.
    Run {
        #[command(flatten)]
        opts: Opts,
        /// The example to run.
        #[arg(long, default_value = "allreduce_ub")]
        example: String,
        /// One rank per process: start N processes with torchrun's variables (a launcher
        /// for development; output prefixed by rank, the others stopped when one fails).
        #[arg(long)]
        procs: Option<usize>,
        /// With --procs: stop every rank after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout_s: u64,
        /// With --procs: every rank on GPU 0, NCCL told they are on different hosts (a
        /// machine with one GPU runs one-rank-per-process programs; for correctness, not
        /// speed).
        #[arg(long, requires = "procs")]
        share_gpu: bool,
    },
    /// Run the tests: the workspace suite (the mock's conformance suite, the loaders); with
    /// --vendor cuda also the GPU tests.
    Test(Opts),
    /// Run unicomm-bench (nccl-tests' method; every mode side by side); arguments after `--`.
    Bench(Opts),
    /// Calibrate the automatic policy on this machine: time the registered, window and
    /// copy-engine paths of every collective and size, and write the fastest per size to a
    /// file for UNICOMM_TUNE_FILE (default unicomm-tune.txt).
    Tune {
        #[command(flatten)]
        opts: Opts,
        /// Where to write the thresholds.
        #[arg(long, default_value = "unicomm-tune.txt")]
        out: PathBuf,
    },
    /// Print what this machine offers: devices, libraries, versions, capabilities, variables.
    Doctor(Opts),
    /// Build release binaries and a run script into dist/unicomm-bundle for a GPU machine
    /// without a Rust toolchain.
    Bundle(Opts),
    /// Start any program as N ranks, one per process, with torchrun's variables (what
    /// `run --procs` does for an example): `cargo xtask launch --procs 2 -- ./prog args`.
    Launch {
        /// Number of processes.
        #[arg(long)]
        procs: usize,
        /// Stop every rank after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout_s: u64,
        /// Every rank on GPU 0, each process with a host id of its own for NCCL
        /// (`NCCL_HOSTID`), which refuses two ranks of one host on one GPU: a machine with
        /// one GPU runs one-rank-per-process programs (for correctness, not speed).
        #[arg(long)]
        share_gpu: bool,
        /// The program and its arguments.
        #[arg(last = true, required = true)]
        program: Vec<String>,
    },
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf()
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

/// Runs one step, showing it first; a failure names the step and the command.
fn step(name: &str, mut cmd: Command) -> Result<()> {
    let shown = format!("{cmd:?}").replace('"', "");
    eprintln!("==> {name}: {shown}");
    let st = cmd
        .status()
        .with_context(|| format!("step `{name}`: could not start {shown}"))?;
    if !st.success() {
        bail!("step `{name}` failed ({st}): {shown}");
    }
    Ok(())
}

fn features(v: Vendor) -> &'static str {
    match v {
        Vendor::Auto => "mock,nccl,rccl",
        Vendor::Cuda => "nccl",
        Vendor::Rocm => "rccl",
        Vendor::Mock => "mock",
    }
}

fn vendor_arg(v: Vendor) -> &'static str {
    match v {
        Vendor::Auto => "auto",
        Vendor::Cuda => "cuda",
        Vendor::Rocm => "rocm",
        Vendor::Mock => "mock",
    }
}

fn with_profile(c: &mut Command, release: bool) {
    if release {
        c.arg("--release");
    }
}

fn facade(sub: &str, o: &Opts) -> Command {
    let mut c = cargo();
    c.args([
        sub,
        "-p",
        "unicomm",
        "--no-default-features",
        "--features",
        features(o.vendor),
    ]);
    with_profile(&mut c, o.release);
    c
}

/// `cargo run --release -p unicomm-bench -- --vendor V` (bench and tune add their arguments).
fn bench_command(v: Vendor) -> Command {
    let mut c = cargo();
    c.args([
        "run",
        "--release",
        "-p",
        "unicomm-bench",
        "--",
        "--vendor",
        vendor_arg(v),
    ]);
    c
}

/// Builds an example and returns its executable, read from cargo's JSON messages.
fn example_binary(o: &Opts, example: &str) -> Result<PathBuf> {
    use cargo_metadata::Message;
    let mut c = facade("build", o);
    c.args([
        "--example",
        example,
        "--message-format=json-render-diagnostics",
    ]);
    c.stdout(std::process::Stdio::piped());
    eprintln!("==> build {example}: {c:?}");
    let mut child = c.spawn().context("could not start cargo")?;
    let stdout = child.stdout.take().context("cargo's stdout")?;
    let mut exe = None;
    for m in Message::parse_stream(std::io::BufReader::new(stdout)) {
        if let Message::CompilerArtifact(a) = m.context("reading cargo's JSON messages")? {
            if a.target.is_kind(cargo_metadata::TargetKind::Example) && a.target.name == example {
                exe = a.executable.map(|p| p.into_std_path_buf());
            }
        }
    }
    let st = child.wait()?;
    if !st.success() {
        bail!("building {example} failed ({st})");
    }
    exe.with_context(|| format!("cargo built no executable for the example {example}"))
}

/// `run --procs N`: the example as N ranks, one per process (`env` added to theirs).
fn run_procs(
    o: &Opts,
    example: &str,
    n: usize,
    timeout_s: u64,
    env: &[(&str, &str)],
    share_gpu: bool,
) -> Result<()> {
    let exe = example_binary(o, example)?;
    let mut args = vec!["--vendor".to_string(), vendor_arg(o.vendor).to_string()];
    args.extend(o.args.iter().cloned());
    launch::run(
        &exe,
        &args,
        env,
        n,
        std::time::Duration::from_secs(timeout_s),
        share_gpu,
    )
}

fn run_example(o: &Opts, example: &str) -> Result<()> {
    let mut c = facade("run", o);
    c.args(["--example", example, "--", "--vendor", vendor_arg(o.vendor)]);
    c.args(&o.args);
    if std::env::var_os("UNICOMM_MOCK_RANKS").is_none() {
        c.env("UNICOMM_MOCK_RANKS", "4");
    }
    step(&format!("run {example} on {}", vendor_arg(o.vendor)), c)
}

fn main() {
    if let Err(e) = xtask(Cli::parse()) {
        eprintln!("xtask: {e:#}");
        // The launcher exits with its first failed rank's code.
        let code = e.downcast_ref::<launch::Failed>().map_or(1, |f| f.code);
        std::process::exit(code);
    }
}

fn xtask(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Build(o) => {
            let mut c = facade("build", &o);
            c.args(["--lib", "--examples"]);
            step("build", c)
        }
        Cmd::Run {
            opts,
            example,
            procs: Some(n),
            timeout_s,
            share_gpu,
        } => run_procs(&opts, &example, n, timeout_s, &[], share_gpu),
        Cmd::Run { opts, example, .. } => run_example(&opts, &example),
        Cmd::Doctor(o) => {
            let o = Opts {
                vendor: Vendor::Auto,
                ..o
            };
            let mut c = facade("run", &o);
            c.args(["--example", "doctor"]);
            step("doctor", c)
        }
        Cmd::Test(o) => {
            // First what the machine has (informational), then the suite.
            let mut d = facade(
                "run",
                &Opts {
                    vendor: Vendor::Auto,
                    release: false,
                    args: vec![],
                },
            );
            d.args(["--example", "doctor"]);
            step("probe the machine", d)?;
            let mut t = cargo();
            t.args(["test", "--workspace"]);
            // The mock's 1 Mi-element conformance cases allocate ~100 MiB per eight-rank
            // case; glibc gives freed blocks back to the kernel and page-faults them in
            // again for the next case (a quarter of the suite's time on 2 cores). Keeping
            // them in the heap: the whole suite 107 s instead of 152 s (peak RSS 1.2 GiB).
            // Only where the caller did not set the variables.
            for (k, v) in [
                ("MALLOC_MMAP_THRESHOLD_", "33554432"),
                ("MALLOC_TRIM_THRESHOLD_", "17179869184"),
                ("MALLOC_TOP_PAD_", "268435456"),
            ] {
                if std::env::var_os(k).is_none() {
                    t.env(k, v);
                }
            }
            with_profile(&mut t, o.release);
            t.arg("--").args(&o.args);
            step(
                "workspace tests (mock conformance suite, loaders, fake NCCL ABI)",
                t,
            )?;
            // Vendor::Auto with every backend compiled in and none usable must be an error,
            // never the mock (issue #9); the default build proves the same with mock only.
            let mut auto = cargo();
            auto.args([
                "test",
                "-p",
                "unicomm",
                "--all-features",
                "--test",
                "vendor_auto",
            ]);
            step("Vendor::Auto with every backend compiled in", auto)?;
            // One rank per process on the mock, through this launcher: the examples as a
            // user launched by torchrun would run them.
            if cfg!(target_os = "linux") {
                let mock = |args: &[&str]| Opts {
                    vendor: Vendor::Mock,
                    release: o.release,
                    args: args.iter().map(|a| a.to_string()).collect(),
                };
                let fast = [("UNICOMM_MOCK_TIMEOUT_MS", "3000")];
                // The file rendezvous instead of TCP (a fresh path of this run).
                let rdv =
                    std::env::temp_dir().join(format!("unicomm-xtask-{}.id", std::process::id()));
                let rdv = rdv.to_string_lossy().into_owned();
                let file = [("UNICOMM_RENDEZVOUS_FILE", rdv.as_str())];
                for (example, n, args, env) in [
                    ("allreduce_ub", 2, &[][..], &[][..]),
                    ("alltoall_ub", 4, &[], &[]),
                    ("from_env", 3, &[], &[]),
                    ("from_env", 3, &[], &file[..]),
                    ("faults", 2, &["--scenario", "skip"], &fast[..]),
                    ("faults", 2, &["--scenario", "abort"], &[]),
                ] {
                    run_procs(&mock(args), example, n, 300, env, false).with_context(|| {
                        format!("{example} {args:?} in {n} processes on the mock")
                    })?;
                }
                // unicomm-bench with one rank per process (its figures combined through
                // the communicator), data checked: a smoke test, no timing asserted.
                let mut b = cargo();
                b.args(["build", "-p", "unicomm-bench"]);
                if o.release {
                    b.arg("--release");
                }
                step("build unicomm-bench", b)?;
                let bench = root()
                    .join("target")
                    .join(if o.release { "release" } else { "debug" })
                    .join("unicomm-bench");
                let args: Vec<String> = [
                    "--vendor",
                    "mock",
                    "-b",
                    "8",
                    "-e",
                    "64K",
                    "-f",
                    "32",
                    "-w",
                    "1",
                    "-n",
                    "2",
                    "-c",
                    "1",
                    "--coll",
                    "all_reduce,all_to_all,all_gather",
                ]
                .iter()
                .map(|a| a.to_string())
                .collect();
                launch::run(
                    &bench,
                    &args,
                    &[],
                    2,
                    std::time::Duration::from_secs(300),
                    false,
                )
                .context("unicomm-bench in 2 processes on the mock")?;
            }
            match o.vendor {
                Vendor::Cuda => gpu_tests(GpuVendor::Cuda, &o.args, nvidia_gpus()),
                Vendor::Rocm => gpu_tests(GpuVendor::Rocm, &o.args, amd_gpus()),
                Vendor::Auto | Vendor::Mock => Ok(()),
            }
        }
        Cmd::Bench(o) => {
            // unicomm-bench: nccl-tests' method, every mode side by side. Its arguments
            // follow `--` (`-b 8 -e 512M -f 4 -J out.json --plot out.svg`, `--help`).
            let mut c = bench_command(o.vendor);
            c.args(&o.args);
            if o.vendor == Vendor::Mock && std::env::var_os("UNICOMM_MOCK_RANKS").is_none() {
                c.env("UNICOMM_MOCK_RANKS", "4");
            }
            step(&format!("unicomm-bench on {}", vendor_arg(o.vendor)), c)
        }
        Cmd::Tune { opts, out } => {
            let mut c = bench_command(opts.vendor);
            c.args([
                "--modes",
                "registered,window,ce",
                "--place",
                "out",
                "--coll",
                "all_reduce,all_to_all,all_gather,reduce_scatter,broadcast",
            ]);
            c.arg("--tune").arg(root().join(&out).as_os_str());
            c.args(&opts.args);
            step("calibrate the automatic policy", c)?;
            eprintln!(
                "thresholds written: export UNICOMM_TUNE_FILE={}",
                root().join(&out).display()
            );
            Ok(())
        }
        Cmd::Bundle(o) => bundle(&o),
        Cmd::Launch {
            procs,
            timeout_s,
            share_gpu,
            program,
        } => {
            let (prog, args) = program.split_first().context("no program given")?;
            launch::run(
                Path::new(prog),
                args,
                &[],
                procs,
                std::time::Duration::from_secs(timeout_s),
                share_gpu,
            )
        }
    }
}

/// The conformance suite's world sizes (comm-core's rstest tables), the one list the xtask
/// and the bundle's run script use to say which sizes a machine has GPUs for. rstest names
/// a case by the value's position and value: `world_<index from 1>_<size>`.
const SUITE_WORLDS: [usize; 5] = [1, 2, 3, 4, 8];

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
enum GpuVendor {
    Cuda,
    Rocm,
}

impl GpuVendor {
    fn package(self) -> &'static str {
        match self {
            GpuVendor::Cuda => "unicomm-nccl",
            GpuVendor::Rocm => "unicomm-rccl",
        }
    }
    fn library(self) -> &'static str {
        match self {
            GpuVendor::Cuda => "NCCL",
            GpuVendor::Rocm => "RCCL",
        }
    }
}

/// The opt-in GPU tests of one vendor: the shared suite (conformance at the world sizes the
/// machine has GPUs for, registration, windows, init_rank, errors) and the vendor's own.
/// Without the vendor's GPU they fail with `NoDevice`/`LibraryNotFound`; never skipped.
fn gpu_tests(v: GpuVendor, args: &[String], gpus: usize) -> Result<()> {
    let mut g = cargo();
    g.args([
        "test",
        "--release",
        "-p",
        v.package(),
        "--features",
        "gpu-tests",
        "--test",
        "gpu",
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
fn amd_gpus() -> usize {
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
fn nvidia_gpus() -> usize {
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

/// Builds test binaries with cargo and returns their paths by target name, read from
/// cargo's JSON messages with `cargo_metadata`.
fn test_binaries(pkg: &str, features: &str, names: &[&str]) -> Result<Vec<(PathBuf, String)>> {
    use cargo_metadata::Message;
    let mut t = cargo();
    t.args([
        "test",
        "--release",
        "-p",
        pkg,
        "--features",
        features,
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    t.stdout(std::process::Stdio::piped());
    eprintln!("==> build test binaries of {pkg}: {t:?}");
    let mut child = t
        .spawn()
        .with_context(|| format!("could not start cargo for {pkg}"))?;
    let stdout = child.stdout.take().context("cargo's stdout")?;
    let mut found = Vec::new();
    for m in Message::parse_stream(std::io::BufReader::new(stdout)) {
        if let Message::CompilerArtifact(a) = m.context("reading cargo's JSON messages")? {
            if let Some(exe) = a.executable {
                if a.target.is_kind(cargo_metadata::TargetKind::Test)
                    && names.contains(&a.target.name.as_str())
                {
                    found.push((
                        exe.into_std_path_buf(),
                        format!("{}-{}", pkg.trim_start_matches("unicomm-"), a.target.name),
                    ));
                }
            }
        }
    }
    let st = child.wait()?;
    if !st.success() {
        bail!("building the test binaries of {pkg} failed ({st})");
    }
    if found.len() != names.len() {
        bail!("expected the test binaries {names:?} of {pkg}, found {found:?}");
    }
    Ok(found)
}

/// Release binaries (examples, GPU test binaries, the overhead benchmark), `run.sh` and `parts.sh` in
/// `dist/unicomm-bundle`, for the vendor asked for (`auto`: both GPU vendors). Always a
/// release build: timings are part of the run.
fn bundle(o: &Opts) -> Result<()> {
    if !o.args.is_empty() {
        bail!("bundle takes no program arguments (got {:?})", o.args);
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
    let mut copies: Vec<(PathBuf, String)> = Vec::new();
    let mut ex = cargo();
    let features = if vendors.len() == 2 {
        "nccl,rccl,mock"
    } else if vendors[0] == GpuVendor::Cuda {
        "nccl,mock"
    } else {
        "rccl,mock"
    };
    ex.args([
        "build",
        "--release",
        "-p",
        "unicomm",
        "--features",
        features,
        "--examples",
    ]);
    step("build release examples", ex)?;
    for e in [
        "allreduce_ub",
        "alltoall_ub",
        "doctor",
        "from_env",
        "faults",
        "rank_conformance",
    ] {
        copies.push((
            root().join("target/release/examples").join(e),
            e.to_string(),
        ));
    }
    let mut b = cargo();
    b.args(["build", "--release", "-p", "unicomm-bench", "-p", "xtask"]);
    step("build the benchmark and the launcher", b)?;
    // The launcher (`xtask launch --procs N -- prog`) for one rank per process.
    copies.push((root().join("target/release/xtask"), "xtask".into()));
    copies.push((
        root().join("target/release/unicomm-bench"),
        "unicomm-bench".into(),
    ));
    for &v in vendors {
        match v {
            GpuVendor::Cuda => {
                let mut ov = cargo();
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
                step("build the overhead and overlap benchmarks", ov)?;
                for e in ["overhead", "overlap"] {
                    copies.push((root().join("target/release/examples").join(e), e.into()));
                }
                copies.extend(test_binaries(
                    "unicomm-nccl",
                    "gpu-tests",
                    &["gpu", "loader"],
                )?);
            }
            GpuVendor::Rocm => copies.extend(test_binaries(
                "unicomm-rccl",
                "gpu-tests",
                &["gpu", "hip_loader"],
            )?),
        }
    }
    for (src, name) in &copies {
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
