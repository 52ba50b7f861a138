//! `cargo xtask build|run|test|bench|doctor|bundle|trace [--vendor auto|cuda|rocm|mock] [--release]
//! [-- args]`: the project's commands, per vendor. The vendor picks the cargo features
//! (cuda -> nccl, rocm -> rccl, mock -> mock); `auto` compiles every backend and lets the
//! program pick the GPU it finds, falling back to the mock and saying why.

#![deny(unsafe_code)]

mod bundle;
mod cargo;
mod cli;
mod consumers;
mod cuda_kit;
mod gpu;
mod kernels;
mod launch;
mod msrv;
mod run;
mod test;
#[cfg(test)]
mod tidy;
mod trace;

use std::path::Path;

use anyhow::{Context, Result};
use clap::Parser;

use cargo::{bench_command, facade, root, step};
use cli::{Cli, Cmd, Opts, Vendor};

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
            expect_lost,
        } => run::run_procs(
            &opts,
            &example,
            &launch::Job {
                n,
                timeout: std::time::Duration::from_secs(timeout_s),
                share_gpu,
                expect_lost: &expect_lost,
                env: &[],
            },
        ),
        Cmd::Run { opts, example, .. } => run::run_example(&opts, &example),
        Cmd::Doctor(o) => {
            let o = Opts {
                vendor: Vendor::Auto,
                ..o
            };
            let mut c = facade("run", &o);
            c.args(["--example", "doctor"]);
            step("doctor", c)
        }
        Cmd::Test(o) => test::test(&o),
        Cmd::Bench(o) => bench(&o),
        Cmd::Rendezvous { args } => {
            step("rendezvous-scale", crate::cargo::rendezvous_command(&args))
        }
        Cmd::Tune { opts, out } => tune(&opts, &out),
        Cmd::Bundle { opts, only } => bundle::bundle(&opts, only),
        Cmd::Msrv => msrv::msrv(),
        Cmd::CudaKit { compute_cap } => cuda_kit_exports(&compute_cap),
        Cmd::Consumers => consumers::consumers(),
        Cmd::Kernels => kernels::kernels(),
        Cmd::Trace { dir } => trace::trace(&dir),
        Cmd::Launch {
            procs,
            timeout_s,
            share_gpu,
            expect_lost,
            program,
        } => {
            let (prog, args) = program.split_first().context("no program given")?;
            let job = launch::Job {
                n: procs,
                timeout: std::time::Duration::from_secs(timeout_s),
                share_gpu,
                expect_lost: &expect_lost,
                env: &[],
            };
            launch::run(Path::new(prog), args, &job)
        }
    }
}

/// unicomm-bench: nccl-tests' method, every mode side by side. Its arguments follow `--`
/// (`-b 8 -e 512M -f 4 -J out.json --plot out.svg`, `--help`).
fn bench(o: &Opts) -> Result<()> {
    let mut c = bench_command(o.vendor);
    c.args(&o.args);
    if o.vendor == Vendor::Mock && std::env::var_os("UNICOMM_MOCK_RANKS").is_none() {
        c.env("UNICOMM_MOCK_RANKS", "4");
    }
    step(&format!("unicomm-bench on {}", o.vendor.arg()), c)
}

/// The automatic policy's thresholds calibrated by unicomm-bench into `out`.
fn tune(opts: &Opts, out: &Path) -> Result<()> {
    let mut c = bench_command(opts.vendor);
    c.args([
        "--modes",
        "registered,window,ce",
        "--place",
        "out",
        "--coll",
        "all_reduce,all_to_all,all_gather,reduce_scatter,broadcast",
    ]);
    c.arg("--tune").arg(root().join(out).as_os_str());
    c.args(&opts.args);
    step("calibrate the automatic policy", c)?;
    eprintln!(
        "thresholds written: export UNICOMM_TUNE_FILE={}",
        root().join(out).display()
    );
    Ok(())
}

/// The environment that builds candle's CUDA backend with the CUDA kit, for sm`cap`.
fn cuda_kit_exports(cap: &str) -> Result<()> {
    if cap.is_empty() || !cap.bytes().all(|b| b.is_ascii_digit()) {
        anyhow::bail!(
            "--compute-cap {cap:?}: digits, as nvidia-smi's compute_cap without the dot (90)"
        );
    }
    let kit = cuda_kit::toolkit()?;
    print!("{}", cuda_kit::exports(&kit, cap));
    Ok(())
}
