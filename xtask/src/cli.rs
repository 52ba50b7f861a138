//! The command line: the commands and their options.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "unicomm's build, run, test and bundle commands"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
pub(crate) enum Vendor {
    Auto,
    Cuda,
    Rocm,
    Mock,
}

/// A bundle of one part's binaries only.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
pub(crate) enum BundlePart {
    /// The kernels part (`PARTS=kernels`): the stage probes, `rank_conformance`, the
    /// benchmark and the launcher, small enough to carry to a short device call.
    Kernels,
}

#[derive(clap::Args, Clone)]
pub(crate) struct Opts {
    /// Which vendor's backend.
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) vendor: Vendor,
    /// Optimised build.
    #[arg(long)]
    pub(crate) release: bool,
    /// Arguments passed through to the program.
    #[arg(last = true)]
    pub(crate) args: Vec<String>,
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
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
        /// With --procs: every rank on GPU 0, joined by NCCL's multi-rank mode where
        /// UNICOMM_NCCL_LIBRARY names a NCCL >= 2.30.3 (at most 2 ranks), else as separate
        /// hosts (a host id each); for correctness, not speed.
        #[arg(long, requires = "procs")]
        share_gpu: bool,
        /// With --procs: ranks whose death is expected (a fault test kills them): the others
        /// go on and the job succeeds if they do.
        #[arg(long, requires = "procs", value_delimiter = ',')]
        expect_lost: Vec<usize>,
    },
    /// Run the tests: the workspace suite (the mock's conformance suite, the loaders); with
    /// --vendor cuda also the GPU tests.
    Test(Opts),
    /// Run unicomm-bench (nccl-tests' method; every mode side by side); arguments after `--`.
    Bench(Opts),
    /// Time N ranks (threads of a few processes) joining the TCP rendezvous over loopback
    /// (`rendezvous-scale`; its arguments after `--`: `--ranks 1024,4096 --runs 3`, `--help`).
    Rendezvous {
        /// Its arguments.
        #[arg(last = true)]
        args: Vec<String>,
    },
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
    Bundle {
        #[command(flatten)]
        opts: Opts,
        /// Only one part's binaries (`kernels`), not every part's.
        #[arg(long, value_enum)]
        only: Option<BundlePart>,
    },
    /// Check that the workspace's rust-version is at least every dependency's.
    Msrv,
    /// Install what building candle's CUDA backend needs on a machine without a CUDA
    /// toolkit (nvcc 13.0 and the headers from NVIDIA's wheels, link stubs) under
    /// `<target>/cuda-kit`, and print the environment for an engine's own build
    /// (`eval "$(cargo xtask cuda-kit)"`, then `cargo build --features cuda`).
    CudaKit {
        /// The GPUs' compute capability the kernels are built for (90: H100/H200).
        #[arg(long, default_value = "90")]
        compute_cap: String,
    },
    /// Build unicomm's GPU kernels (backend-nccl/kernels/*.cu) into the PTX the CUDA
    /// backend embeds, with nvcc 13.0 from the CUDA kit (installed on first use).
    Kernels,
    /// `cargo check` a program using unicomm's NCCL backend beside its own cudarc, in each
    /// way engines build cudarc (candle's dynamic-linking, loading, cubecl's fallback).
    Consumers,
    /// Read every rank's flight-recorder dump in DIR (UNICOMM_FLIGHT_DIR of a job) and say
    /// where the ranks part: the first sequence number some never reached, or called
    /// differently, and what each was doing.
    Trace {
        /// The directory of the dumps.
        dir: PathBuf,
    },
    /// Start any program as N ranks, one per process, with torchrun's variables (what
    /// `run --procs` does for an example): `cargo xtask launch --procs 2 -- ./prog args`.
    Launch {
        /// Number of processes.
        #[arg(long)]
        procs: usize,
        /// Stop every rank after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout_s: u64,
        /// Every rank on GPU 0: NCCL's multi-rank mode where UNICOMM_NCCL_LIBRARY names a
        /// NCCL >= 2.30.3 (one host, at most 2 ranks), else a host id per process
        /// (`NCCL_HOSTID`: separate hosts over sockets); for correctness, not speed.
        #[arg(long)]
        share_gpu: bool,
        /// Ranks whose death is expected (a fault test kills them): the others go on and
        /// the job succeeds if they do.
        #[arg(long, value_delimiter = ',')]
        expect_lost: Vec<usize>,
        /// The program and its arguments.
        #[arg(last = true, required = true)]
        program: Vec<String>,
    },
}

impl Vendor {
    /// The facade's cargo features for this vendor.
    pub(crate) fn features(self) -> &'static str {
        match self {
            Vendor::Auto => "mock,nccl,rccl",
            Vendor::Cuda => "nccl",
            Vendor::Rocm => "rccl",
            Vendor::Mock => "mock",
        }
    }

    /// The programs' `--vendor` argument.
    pub(crate) fn arg(self) -> &'static str {
        match self {
            Vendor::Auto => "auto",
            Vendor::Cuda => "cuda",
            Vendor::Rocm => "rocm",
            Vendor::Mock => "mock",
        }
    }
}
