//! `cargo xtask build|run|test|bench|doctor|bundle [--vendor auto|cuda|rocm|mock] [--release]
//! [-- args]`: the project's commands, per vendor. The vendor picks the cargo features
//! (cuda -> nccl, rocm -> rccl, mock -> mock); `auto` compiles every backend and lets the
//! program pick the GPU it finds, falling back to the mock and saying why.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
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
    },
    /// Run the tests: the workspace suite (the mock's conformance suite, the loaders); with
    /// --vendor cuda also the GPU tests.
    Test(Opts),
    /// Run the benchmark: the mock's speed check, or unicomm's overhead over NCCL on cuda.
    Bench(Opts),
    /// Print what this machine offers: devices, libraries, versions, capabilities, variables.
    Doctor(Opts),
    /// Build release binaries and a run script into dist/unicomm-bundle for a GPU machine
    /// without a Rust toolchain.
    Bundle(Opts),
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
        std::process::exit(1);
    }
}

fn xtask(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Build(o) => {
            let mut c = facade("build", &o);
            c.args(["--lib", "--examples"]);
            step("build", c)
        }
        Cmd::Run { opts, example } => run_example(&opts, &example),
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
            with_profile(&mut t, o.release);
            t.arg("--").args(&o.args);
            step(
                "workspace tests (mock conformance suite, loaders, fake NCCL ABI)",
                t,
            )?;
            match o.vendor {
                Vendor::Cuda => {
                    let gpus = nvidia_gpus();
                    let mut g = cargo();
                    g.args(["test", "--release", "-p", "backend-nccl", "--features", "gpu-tests", "--test", "gpu", "--", "--test-threads=1"]);
                    // World sizes beyond this machine's GPUs are not run, and we say so.
                    for (w, name) in [(2, "world_2_2"), (3, "world_3_3"), (4, "world_4_4"), (8, "world_5_8")] {
                        if gpus < w {
                            eprintln!("GPU conformance: world size {w} not run ({gpus} GPU(s) here)");
                            g.args(["--skip", name]);
                        }
                    }
                    g.env("UNICOMM_GPU_WORLD", gpus.max(1).to_string());
                    g.args(&o.args);
                    step("GPU tests on NCCL", g)
                }
                Vendor::Rocm => bail!("GPU tests on ROCm: none exist yet (no AMD GPU has been available); see docs/rocm.md"),
                Vendor::Auto | Vendor::Mock => Ok(()),
            }
        }
        Cmd::Bench(o) => match o.vendor {
            Vendor::Mock | Vendor::Auto => {
                let mut c = cargo();
                c.args(["bench", "-p", "backend-mock", "--bench", "mock_allreduce"]);
                step("mock all_reduce speed vs memcpy", c)
            }
            Vendor::Cuda => {
                let mut c = cargo();
                c.args([
                    "run",
                    "--release",
                    "-p",
                    "backend-nccl",
                    "--example",
                    "overhead",
                    "--",
                ])
                .args(&o.args);
                step("unicomm overhead over raw NCCL", c)
            }
            Vendor::Rocm => {
                bail!("no ROCm benchmark yet: no AMD GPU has been available (docs/rocm.md)")
            }
        },
        Cmd::Bundle(o) => bundle(&o),
    }
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

/// Release binaries (examples, GPU test binaries, overhead bench) and `run.sh`.
fn bundle(_o: &Opts) -> Result<()> {
    let out = root().join("dist/unicomm-bundle");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut copies: Vec<(PathBuf, &str)> = Vec::new();
    let mut ex = cargo();
    ex.args([
        "build",
        "--release",
        "-p",
        "unicomm",
        "--features",
        "nccl,rccl,mock",
        "--examples",
    ]);
    step("build release examples", ex)?;
    for e in ["allreduce_ub", "alltoall_ub", "doctor", "from_env"] {
        copies.push((root().join("target/release/examples").join(e), e));
    }
    let mut ov = cargo();
    ov.args([
        "build",
        "--release",
        "-p",
        "backend-nccl",
        "--example",
        "overhead",
    ]);
    step("build the overhead benchmark", ov)?;
    copies.push((root().join("target/release/examples/overhead"), "overhead"));
    // Test binaries: their paths come from cargo's JSON messages.
    let mut t = cargo();
    t.args([
        "test",
        "--release",
        "-p",
        "backend-nccl",
        "--features",
        "gpu-tests",
        "--no-run",
        "--message-format=json",
    ]);
    eprintln!("==> build GPU test binaries: {t:?}");
    let o = t
        .output()
        .context("step `build GPU test binaries`: could not start cargo")?;
    if !o.status.success() {
        bail!(
            "step `build GPU test binaries` failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let mut found = Vec::new();
    for line in text.lines().filter(|l| l.contains("\"executable\":\"")) {
        for name in ["gpu", "loader"] {
            let tag = format!("\"name\":\"{name}\"");
            if line.contains(&tag) {
                if let Some(p) = line
                    .split("\"executable\":\"")
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                {
                    found.push((PathBuf::from(p), name));
                }
            }
        }
    }
    if found.len() != 2 {
        bail!("step `build GPU test binaries`: expected the gpu and loader test binaries, found {found:?}");
    }
    copies.extend(found);
    for (src, name) in &copies {
        let dst = out.join(name);
        std::fs::copy(src, &dst)
            .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
        // Smaller transfers; a missing strip only costs size.
        let _ = Command::new("strip").arg(&dst).status();
    }
    let script = out.join("run.sh");
    std::fs::write(&script, include_str!("../bundle-run.sh")).context("writing run.sh")?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    }
    eprintln!(
        "bundle ready: {} (copy it to the GPU machine and run ./run.sh)",
        out.display()
    );
    Ok(())
}
