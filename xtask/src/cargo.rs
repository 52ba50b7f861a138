//! Running cargo: the project root, one step shown before it runs, the facade's build for a
//! vendor, and the artifacts a build made, asked of cargo itself (its JSON messages), so
//! that a `CARGO_TARGET_DIR` anywhere is honoured.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use cargo_metadata::{Artifact, Message, TargetKind};

use crate::cli::{Opts, Vendor};

/// The workspace root (the xtask's parent folder).
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf()
}

/// `cargo` (the one that runs the xtask), in the workspace root.
pub(crate) fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

/// `<target>/<sub>`: the target directory (`CARGO_TARGET_DIR` where set, else the
/// workspace's `target`) for a build of its own workspace.
pub(crate) fn target_dir(sub: &str) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
        .join(sub)
}

/// Runs one step, showing it first; a failure names the step and the command.
pub(crate) fn step(name: &str, mut cmd: Command) -> Result<()> {
    let shown = format!("{cmd:?}").replace('"', "");
    eprintln!("==> {name}: {shown}");
    let started = std::time::Instant::now();
    let st = cmd
        .status()
        .with_context(|| format!("step `{name}`: could not start {shown}"))?;
    // How long each step took: what shows which one grew when CI slows down.
    eprintln!("<== {name}: {:.1} s", started.elapsed().as_secs_f64());
    if !st.success() {
        bail!("step `{name}` failed ({st}): {shown}");
    }
    Ok(())
}

pub(crate) fn with_profile(c: &mut Command, release: bool) {
    if release {
        c.arg("--release");
    }
}

/// `cargo SUB -p unicomm` with the vendor's features.
pub(crate) fn facade(sub: &str, o: &Opts) -> Command {
    let mut c = cargo();
    c.args([
        sub,
        "-p",
        "unicomm",
        "--no-default-features",
        "--features",
        o.vendor.features(),
    ]);
    with_profile(&mut c, o.release);
    c
}

/// `cargo <sub> -p P` for the package whose example `example` is: the facade's, or
/// unicomm-candle's (`candle/examples`), with the features the vendor needs. candle's CUDA
/// tensors need the `cuda` feature, which compiles candle's kernels with nvcc; without a
/// CUDA vendor the candle examples run candle's CPU tensors on the mock.
pub(crate) fn example_command(sub: &str, o: &Opts, example: &str) -> Command {
    let dir = root().join("candle/examples");
    if !dir.join(example).is_dir() && !dir.join(format!("{example}.rs")).is_file() {
        return facade(sub, o);
    }
    let features = match o.vendor {
        Vendor::Cuda => "cuda",
        Vendor::Auto | Vendor::Mock | Vendor::Rocm => "mock",
    };
    let mut c = cargo();
    c.args([
        sub,
        "-p",
        "unicomm-candle",
        "--no-default-features",
        "--features",
        features,
    ]);
    with_profile(&mut c, o.release);
    c
}

/// `cargo run --release -p unicomm-bench --bin BIN --` (the benchmark or the rendezvous'
/// harness), its arguments to follow.
fn bench_package_run(bin: &str) -> Command {
    let mut c = cargo();
    c.args([
        "run",
        "--release",
        "-p",
        "unicomm-bench",
        "--bin",
        bin,
        "--",
    ]);
    c
}

/// `cargo run --release -p unicomm-bench -- --vendor V` (bench and tune add their arguments).
pub(crate) fn bench_command(v: Vendor) -> Command {
    let mut c = bench_package_run("unicomm-bench");
    c.args(["--vendor", v.arg()]);
    c
}

/// `rendezvous-scale` (unicomm-bench's second binary) in release with `args`.
pub(crate) fn rendezvous_command(args: &[String]) -> Command {
    let mut c = bench_package_run("rendezvous-scale");
    c.args(args);
    c
}

/// Runs the build `c` (shown as `what` first) and returns the executables it made that
/// `pick` names, each with the name `pick` gives it, read from cargo's JSON messages.
pub(crate) fn executables(
    what: &str,
    mut c: Command,
    pick: impl Fn(&Artifact) -> Option<String>,
) -> Result<Vec<(PathBuf, String)>> {
    c.arg("--message-format=json-render-diagnostics");
    c.stdout(std::process::Stdio::piped());
    eprintln!("==> {what}: {}", format!("{c:?}").replace('"', ""));
    let mut child = c.spawn().context("could not start cargo")?;
    let stdout = child.stdout.take().context("cargo's stdout")?;
    let mut found = Vec::new();
    for m in Message::parse_stream(std::io::BufReader::new(stdout)) {
        if let Message::CompilerArtifact(a) = m.context("reading cargo's JSON messages")? {
            if let (Some(exe), Some(name)) = (a.executable.clone(), pick(&a)) {
                found.push((exe.into_std_path_buf(), name));
            }
        }
    }
    let st = child.wait()?;
    if !st.success() {
        bail!("{what} failed ({st})");
    }
    Ok(found)
}

/// The executables of `kind` named in `names` that the build `c` made; every one of them,
/// or an error naming what is missing.
pub(crate) fn named(
    what: &str,
    c: Command,
    kind: TargetKind,
    names: &[&str],
) -> Result<Vec<(PathBuf, String)>> {
    let found = executables(what, c, |a| {
        (a.target.is_kind(kind.clone()) && names.contains(&a.target.name.as_str()))
            .then(|| a.target.name.clone())
    })?;
    for n in names {
        if !found.iter().any(|(_, f)| f == n) {
            bail!("{what}: cargo built no executable {n} (found {found:?})");
        }
    }
    Ok(found)
}

/// Whether examples and binaries are built with the whole workspace's features (`cargo
/// xtask test`): the artifacts of its `cargo test --workspace` then serve them, where a
/// build of one package resolves its dependencies' features anew and compiles them again
/// (half, the contract, the backends: 45 s of a 2-core CI run for the probe alone).
static WORKSPACE_BUILD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on, examples and binaries are built as the workspace's tests build them.
pub(crate) fn build_with_workspace_features() {
    WORKSPACE_BUILD.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// `cargo build` of `target` (`--example NAME`, `--bin NAME`): of its package with the
/// vendor's features, or with the workspace's after [`build_with_workspace_features`].
fn build_command(o: &Opts, example: &str, target: [&str; 2]) -> Command {
    if !WORKSPACE_BUILD.load(std::sync::atomic::Ordering::Relaxed) {
        let mut c = match target[0] {
            "--bin" => {
                let mut c = cargo();
                c.args(["build", "-p", example]);
                with_profile(&mut c, o.release);
                c
            }
            _ => example_command("build", o, example),
        };
        c.args(target);
        return c;
    }
    let mut c = cargo();
    c.args(["build", "--workspace"]).args(target);
    if target[0] == "--bin" {
        // Dev-dependencies' features count only in a build with a target that uses them
        // (resolver 2): a binary built alone resolved other features of nix, tracing-subscriber
        // and regex and compiled them and every unicomm crate again (30 s of CI on 2 cores).
        // With the examples (built already by the tests' build) it is the tests' build.
        c.arg("--examples");
    }
    with_profile(&mut c, o.release);
    c
}

/// Builds the binary `name` of the package of the same name and returns its executable.
pub(crate) fn bin_binary(o: &Opts, name: &str) -> Result<PathBuf> {
    let c = build_command(o, name, ["--bin", name]);
    let mut found = named(&format!("build {name}"), c, TargetKind::Bin, &[name])?;
    Ok(found.remove(0).0)
}

/// Builds an example (the facade's or unicomm-candle's) and returns its executable.
pub(crate) fn example_binary(o: &Opts, example: &str) -> Result<PathBuf> {
    let c = build_command(o, example, ["--example", example]);
    let mut found = named(
        &format!("build {example}"),
        c,
        TargetKind::Example,
        &[example],
    )?;
    Ok(found.remove(0).0)
}
