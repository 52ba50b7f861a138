//! `test`: what the machine has, then the workspace suite (the mock's conformance suite,
//! the loaders, the fake NCCL), `Vendor::Auto` with every backend compiled in, one rank per
//! process on the mock through the launcher, and with `--vendor cuda|rocm` the GPU tests.

use anyhow::{Context, Result};

use crate::cargo::{cargo, step, with_profile};
use crate::cli::{Opts, Vendor};
use crate::gpu::{amd_gpus, gpu_tests, nvidia_gpus, GpuVendor};
use crate::launch;
use crate::run::{run_procs, run_procs_side_by_side};

/// `cargo xtask test`: the probe, the workspace suite, `Vendor::Auto` with every backend,
/// the examples as processes on the mock, the flight recorder's dumps, unicomm-bench as
/// processes, then the vendor's GPU tests.
pub(crate) fn test(o: &Opts) -> Result<()> {
    // Everything is built once, with the workspace's features: the probe, the examples and
    // the benchmark below are the artifacts of this build (a build of one package would
    // resolve features anew and compile its dependencies again).
    crate::cargo::build_with_workspace_features();
    let mut b = cargo();
    b.args(["test", "--workspace", "--no-run"]);
    with_profile(&mut b, o.release);
    step("build the workspace's tests and examples", b)?;
    // What the machine has (informational), then the suite.
    let auto = Opts {
        vendor: Vendor::Auto,
        release: o.release,
        args: vec![],
    };
    let d = std::process::Command::new(crate::cargo::example_binary(&auto, "doctor")?);
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
    // Vendor::Auto with every backend compiled in must be an error, never the mock (a
    // production job never lands on CPU threads): the workspace's build compiles every
    // backend in, and tests/vendor_auto.rs checks that it did.
    t.env("UNICOMM_EXPECT_ALL_BACKENDS", "1");
    with_profile(&mut t, o.release);
    t.arg("--").args(&o.args);
    step(
        "workspace tests (mock conformance suite, loaders, fake NCCL ABI)",
        t,
    )?;
    // One rank per process on the mock, through this launcher: the examples as a
    // user launched by torchrun would run them.
    if cfg!(target_os = "linux") {
        mock_examples(o)?;
        flight_dumps(o)?;
        bench_in_processes(o)?;
        rendezvous_at_scale(o)?;
    }
    match o.vendor {
        Vendor::Cuda => gpu_tests(GpuVendor::Cuda, &o.args, nvidia_gpus()),
        Vendor::Rocm => gpu_tests(GpuVendor::Rocm, &o.args, amd_gpus()),
        Vendor::Auto | Vendor::Mock => Ok(()),
    }
}

/// The mock's options for an example's arguments.
fn mock(o: &Opts, args: &[&str]) -> Opts {
    Opts {
        vendor: Vendor::Mock,
        release: o.release,
        args: args.iter().map(|a| a.to_string()).collect(),
    }
}

/// The examples, one rank per process on the mock.
fn mock_examples(o: &Opts) -> Result<()> {
    let mock = |args: &[&str]| mock(o, args);
    let fast = [("UNICOMM_MOCK_TIMEOUT_MS", "3000")];
    // The file rendezvous instead of TCP (a fresh path of this run).
    let rdv = std::env::temp_dir().join(format!("unicomm-xtask-{}.id", std::process::id()));
    let rdv = rdv.to_string_lossy().into_owned();
    let file = [("UNICOMM_RENDEZVOUS_FILE", rdv.as_str())];
    let nccl232 = [("UNICOMM_MOCK_TARGET", "nccl-2.32.3")];
    let jobs = [
        ("allreduce_ub", 2, &[][..], &[][..], &[][..]),
        ("alltoall_ub", 4, &[], &[], &[]),
        ("from_env", 3, &[], &[], &[]),
        ("from_env", 3, &[], &file[..], &[]),
        // An engine's own bootstrap: the id through a file under the job's secret.
        ("by_id", 3, &[], &[], &[]),
        // A world of one grown by two processes (the mock as NCCL 2.32.3: grow is 2.29.2's).
        ("grow", 3, &[], &nccl232[..], &[]),
        ("faults", 2, &["--scenario", "skip"], &fast[..], &[]),
        ("faults", 2, &["--scenario", "abort"], &[], &[]),
        ("faults", 2, &["--scenario", "forget"], &[], &[]),
        ("faults", 2, &["--scenario", "completion-abort"], &[], &[]),
        // A peer that released its symmetric part: named at once, not at the deadline.
        ("faults", 2, &["--scenario", "sym-leave"], &[], &[]),
        // A rank SIGKILLed during the replays of a captured graph.
        ("faults", 3, &["--scenario", "kill-replay"], &fast[..], &[2]),
        // A rank SIGKILLed; the survivors shrink and go on (also without rank 0, whose
        // process served the mock's world).
        (
            "shrink",
            4,
            &["--victim", "3", "--settle-ms", "1000"],
            &[],
            &[3],
        ),
        (
            "shrink",
            4,
            &["--victim", "0", "--settle-ms", "1000", "--mode", "reform"],
            &[],
            &[0],
        ),
        // unicomm-candle's tensor-parallel Llama block, one rank per process: equal to
        // the unsharded forward; a rank SIGKILLed between the blocks (rank 0's process
        // too, which served the mock's world) ends the others with unicomm's error.
        ("llama_tp", 4, &[], &[], &[]),
        ("llama_tp", 2, &["--dtype", "bf16"], &[], &[]),
        ("llama_tp", 4, &["--victim", "3"], &fast[..], &[3]),
        ("llama_tp", 4, &["--victim", "0"], &fast[..], &[0]),
        // Two pipeline stages of two tensor-parallel ranks, the stages' hand-offs by
        // send/recv: equal to the unsharded forward on every rank.
        ("pipeline_tp", 4, &[], &[], &[]),
        // An expert-parallel MoE layer: equal to the unsharded one on every rank.
        ("moe_ep", 4, &[], &[], &[]),
        // A decode step's end on symmetric memory (unicomm's kernels, the fused norm, 200
        // replays), one rank per process.
        ("symmetric_decode", 3, &[], &[], &[]),
        // unicomm's own kernels alone, the fused norm's graph replays included, as the GPU
        // bundle's multi-rank part runs them.
        (
            "rank_conformance",
            2,
            &["--symmetric-only", "--replays", "50"],
            &[],
            &[],
        ),
    ]
    .map(|(example, n, args, env, expect_lost)| {
        let job = launch::Job {
            n,
            timeout: std::time::Duration::from_secs(300),
            share_gpu: false,
            expect_lost,
            env,
        };
        (mock(args), example, job)
    });
    // Three jobs side by side: on 2 cores the twelve took 2.5 minutes one after the other,
    // most of it ranks waiting out a deadline or a victim's settling.
    run_procs_side_by_side(&jobs, 3)
}

/// The flight recorder: a skipped collective and a lost rank, named by the dumps.
fn flight_dumps(o: &Opts) -> Result<()> {
    let mock = |args: &[&str]| mock(o, args);
    // The flight recorder: a rank skips a collective; every rank's dump, read back the
    // way `cargo xtask trace` reads it, names the sequence number and the rank.
    let fl = std::env::temp_dir().join(format!("unicomm-xtask-flight-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&fl);
    let fl_s = fl.to_string_lossy().into_owned();
    let env = [
        ("UNICOMM_MOCK_TIMEOUT_MS", "3000"),
        ("UNICOMM_FLIGHT_DIR", fl_s.as_str()),
    ];
    let job = launch::Job {
        n: 2,
        timeout: std::time::Duration::from_secs(300),
        share_gpu: false,
        expect_lost: &[],
        env: &env,
    };
    run_procs(&mock(&["--scenario", "skip"]), "faults", &job)
        .context("faults skip with the flight recorder on the mock")?;
    let said = crate::trace::analyze(&crate::trace::read_dir(&fl)?).join("\n");
    let _ = std::fs::remove_dir_all(&fl);
    println!("{said}");
    anyhow::ensure!(
        said.contains("first divergence at sequence number 1")
            && said.contains("rank(s) 1 never did"),
        "the flight recorder's dumps do not name the skipped collective:\n{said}"
    );
    // The same for one of unicomm's symmetric kernels (recorded at the backend's one door
    // like a collective): the dumps name the kernel a rank never reached.
    let _ = std::fs::remove_dir_all(&fl);
    run_procs(&mock(&["--scenario", "sym-skip"]), "faults", &job)
        .context("faults sym-skip with the flight recorder on the mock")?;
    let said = crate::trace::analyze(&crate::trace::read_dir(&fl)?).join("\n");
    println!("{said}");
    anyhow::ensure!(
        said.contains("first divergence at sequence number 1")
            && said.contains("symmetric_all_reduce")
            && said.contains("rank(s) 1 never did"),
        "the flight recorder's dumps do not name the skipped symmetric all-reduce:\n{said}"
    );
    // The recorder at a lost rank: the survivors' dumps name the rank that left none.
    let _ = std::fs::remove_dir_all(&fl);
    let env = [("UNICOMM_FLIGHT_DIR", fl_s.as_str())];
    let job = launch::Job {
        n: 4,
        timeout: std::time::Duration::from_secs(300),
        share_gpu: false,
        expect_lost: &[3],
        env: &env,
    };
    run_procs(
        &mock(&["--victim", "3", "--settle-ms", "1000"]),
        "shrink",
        &job,
    )
    .context("shrink with the flight recorder on the mock")?;
    let said = crate::trace::analyze(&crate::trace::read_dir(&fl)?).join("\n");
    let _ = std::fs::remove_dir_all(&fl);
    println!("{said}");
    anyhow::ensure!(
        said.contains("no dump from rank(s) 3") && said.contains("sequence number 10"),
        "the flight recorder's dumps do not name the lost rank:\n{said}"
    );
    Ok(())
}

/// unicomm-bench in two processes on the mock.
fn bench_in_processes(o: &Opts) -> Result<()> {
    // unicomm-bench with one rank per process (its figures combined through
    // the communicator), data checked: a smoke test, no timing asserted.
    // Where cargo put it (CARGO_TARGET_DIR honoured).
    let bench = crate::cargo::bin_binary(o, "unicomm-bench")?;
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
    let job = launch::Job {
        n: 2,
        timeout: std::time::Duration::from_secs(300),
        share_gpu: false,
        expect_lost: &[],
        env: &[],
    };
    launch::run(&bench, &args, &job).context("unicomm-bench in 2 processes on the mock")?;
    Ok(())
}

/// 1,024 ranks join the TCP rendezvous together (threads of 4 processes over loopback): a
/// regression to retries or closed connections shows as a bound exceeded. Generous for a
/// debug build on 2 busy cores: 0.14 s and 1.0 connections per rank in a release build on
/// the 2-core machine. Then the same through each "host"'s first rank (hosts of 8): at most
/// 0.2 TCP connections per rank (0.126 measured: one per host, plus rank 0's host's own).
fn rendezvous_at_scale(o: &Opts) -> Result<()> {
    let exe = crate::cargo::bin_binary(o, "rendezvous-scale")?;
    let mut c = std::process::Command::new(&exe);
    c.args(["--ranks", "1024", "--procs", "4", "--timeout-s", "60"]);
    c.args(["--max-seconds", "10", "--max-connections-per-rank", "1.1"]);
    step("1,024 ranks join the rendezvous", c)?;
    let mut c = std::process::Command::new(exe);
    c.args(["--ranks", "1024", "--procs", "4", "--timeout-s", "60"]);
    c.args(["--forward", "8", "--max-seconds", "10"]);
    c.args(["--max-connections-per-rank", "0.2"]);
    step("1,024 ranks join through their hosts' first ranks", c)
}
