//! The conformance suite's subset for one rank per process: run it under a launcher
//! (`cargo xtask run --procs N --example rank_conformance`, torchrun, mpirun, srun); every
//! process runs the same cases in the same order and checks its own rank's output.

#[expect(
    dead_code,
    reason = "its own arguments and one rank: only main_with is used"
)]
mod common;

use anyhow::{bail, Context as _};
use unicomm_conformance::{process_subset, run_case_on_rank, run_groups_on_rank_refusing};

/// The captured steps' kinds: plain, registered and window buffers, the copy engines.
const GRAPH_KINDS: [&str; 4] = ["none", "buffer", "window", "ce"];

fn main() {
    common::main_with(run)
}

fn run() -> anyhow::Result<()> {
    // `--vendor V` and `--no-windows` (transports without symmetric memory, such as NCCL's
    // network transport standing in for two nodes: the window cases are then not run, and
    // the output says so).
    // `--groups-only`: the process groups' part alone (split, the mesh, gather/scatter, the
    // variable-size exchanges, scaled sums, fp8, ordering between streams).
    // `--replays N`: the captured steps' replays, each checked (20 by default).
    // `--graphs-only KINDS`: the captured steps alone, of the comma-separated kinds among
    // none, buffer, window, ce (a long replay run within one launch's time).
    // `--symmetric-only`: unicomm's own kernels alone (the symmetric all-reduces, the fused
    // norm, the device-API kernel), each replayed `--replays` times.
    let mut vendor = unicomm::Vendor::Auto;
    let mut windows = true;
    let mut subset = true;
    let mut replays: u64 = 20;
    let mut only_graphs: Option<String> = None;
    let mut symmetric_only = false;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--vendor" => vendor = it.next().context("--vendor needs a value")?.parse()?,
            "--no-windows" => windows = false,
            "--groups-only" => subset = false,
            "--replays" => replays = it.next().context("--replays needs a value")?.parse()?,
            "--symmetric-only" => symmetric_only = true,
            "--graphs-only" => {
                let kinds = it.next().context("--graphs-only needs kinds")?;
                if let Some(bad) = kinds.split(',').find(|k| !GRAPH_KINDS.contains(k)) {
                    bail!(
                        "--graphs-only: unknown kind {bad} (expected {})",
                        GRAPH_KINDS.join(", ")
                    );
                }
                only_graphs = Some(kinds);
                subset = false;
            }
            other => {
                bail!("unknown argument {other} (expected --vendor V, --no-windows, --groups-only, --graphs-only KINDS, --symmetric-only, --replays N)")
            }
        }
    }
    let comm = unicomm::from_env(vendor).context("joining the job")?;
    let (r, w) = (comm.rank(), comm.world_size());
    if symmetric_only {
        let t = std::time::Instant::now();
        if !own_kernels(&comm, replays)? {
            // Never a pass that ran nothing.
            bail!("rank {r}: unicomm's symmetric kernels are Unsupported here: --symmetric-only ran nothing");
        }
        comm.finalize()?;
        println!(
            "rank_conformance: rank {r} of {w}: unicomm's own kernels alone ({replays} replays of each) in {:.1} s; PASSED",
            t.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    // A communicator without symmetric windows (NCCL 2.32.3 gives none to ranks it sees on
    // separate hosts, where 2.28.9 gave one): the window cases and checks are not run, and
    // the output says so; the checks that need one must then be Unsupported.
    if windows {
        if let Some(why) = no_window_here(&comm)? {
            println!("rank_conformance: rank {r}: no symmetric window here ({why}): window cases NOT run");
            windows = false;
        }
    }
    let all = process_subset(w);
    let cases: Vec<_> = all
        .iter()
        .copied()
        .filter(|c| subset && (windows || !c.reg.is_collective()))
        .collect();
    if cases.len() < all.len() && subset {
        println!(
            "rank_conformance: rank {r}: --no-windows: {} window cases NOT run",
            all.len() - cases.len()
        );
    }
    let t = std::time::Instant::now();
    let fp8_reduce = comm.capabilities().fp8_reduce;
    for (i, case) in cases.iter().enumerate() {
        // Every backend refuses the documented case families of the library it is (or, the
        // mock, stands for).
        let refused = unicomm_conformance::refused_by_design(case, fp8_reduce);
        if let Err(e) = run_case_on_rank(&comm, *case, refused) {
            let _ = comm.abort();
            bail!("rank {r}: case {i} of {}: {e}", cases.len());
        }
    }
    let refused = |check: &str| {
        unicomm_conformance::group_check_refused_by_design(check, w, fp8_reduce)
            || (!windows && WINDOW_CHECKS.contains(&check))
    };
    let kinds: Vec<&str> = match &only_graphs {
        Some(k) => k.split(',').collect(),
        None => GRAPH_KINDS.to_vec(),
    };
    if only_graphs.is_none() {
        if let Err(e) = run_groups_on_rank_refusing(&comm, &refused) {
            let _ = comm.abort();
            bail!("rank {r}: process groups: {e}");
        }
    }
    // The sleep mode and properties where the library has them (NCCL 2.29.7, 2.29.2).
    if only_graphs.is_none() {
        let one = std::slice::from_ref(&comm);
        reported(
            &comm,
            "sleep mode, properties",
            unicomm_conformance::sleep_mode_and_properties(one).map(first),
        )?;
        // One-sided puts and signals around the ring where the library has them (NCCL
        // 2.29.2) and the communicator NCCL's host RMA; into windows, so only where the
        // communicator has them; then the same ring captured in a graph and replayed (NCCL
        // 2.30.3).
        if windows {
            let ring = unicomm_conformance::one_sided_put_signal(one).map(first);
            reported(&comm, "one-sided ring", ring)?;
            let graph = unicomm_conformance::one_sided_in_graph(one, 200).map(first);
            reported(&comm, "one-sided in a graph", graph)?;
        } else {
            println!(
                "rank_conformance: rank {r}: no symmetric window here: the one-sided ring NOT run"
            );
        }
        own_kernels(&comm, replays)?; // printed; a backend without them says `false`
                                      // Per-call options where the library has them (NCCL 2.32).
        let options = unicomm_conformance::call_options(one).map(first);
        reported(&comm, "per-call options", options)?;
    }
    // A captured step of every collective, replayed (CUDA or HIP graphs across the
    // processes; the mock's replays).
    let graphs = comm.capabilities().graph_capture;
    if graphs {
        let one = std::slice::from_ref(&comm);
        // Plain buffers, a registered one and (where the transport has symmetric memory) a
        // window, each replayed into across the processes.
        use unicomm_conformance::Reg;
        let regs = [
            ("none", Reg::None),
            ("buffer", Reg::Buffer),
            ("window", Reg::Window),
        ];
        let regs = regs
            .into_iter()
            .filter(|(k, reg)| kinds.contains(k) && (windows || *reg != Reg::Window))
            .map(|(_, reg)| reg);
        for reg in regs {
            if let Err(e) = unicomm_conformance::captured_step_replays(one, replays, reg) {
                let _ = comm.abort();
                bail!("rank {r}: captured step ({reg:?}): {e}");
            }
        }
        // The copy engines inside a graph, where the ranks have them and windows.
        if !kinds.contains(&"ce") {
            println!("rank_conformance: rank {r}: copy engines in a graph not asked for");
        } else if comm.capabilities().copy_engine && windows {
            if let Err(e) = unicomm_conformance::captured_copy_engine_replays(one, replays) {
                let _ = comm.abort();
                bail!("rank {r}: copy engines in a captured step: {e}");
            }
            println!(
                "rank_conformance: rank {r}: copy engines in a graph, {replays} replays exact"
            );
        } else {
            println!("rank_conformance: rank {r}: no copy engines here: their graph NOT run");
        }
    } else {
        println!("rank_conformance: rank {r}: no graph capture on this backend: graphs NOT run");
    }
    comm.finalize()?;
    println!(
        "rank_conformance: rank {r} of {w}: {} cases, {}, captured steps of {} ({replays} replays of each kind) in {:.1} s; PASSED",
        cases.len(),
        if only_graphs.is_some() { "no process groups" } else { "the process groups" },
        kinds.join(", "),
        t.elapsed().as_secs_f64(),
    );
    Ok(())
}

/// unicomm's own kernels across the processes, where the backend has them: the symmetric
/// all-reduces of every algorithm exact eagerly and over `replays` graph replays, the fused
/// norm likewise, and the kernel on the library's device API (NCCL >= 2.32.3). Whether the
/// symmetric kernels ran (`false`: the backend has no symmetric memory).
fn own_kernels(comm: &unicomm::Comm, replays: u64) -> anyhow::Result<bool> {
    let one = std::slice::from_ref(comm);
    let replays = replays as usize;
    // Each block's time printed: the replays' rate on a time-shared GPU.
    let timed =
        |what: &str, t: std::time::Instant| format!("{what} ({:.1} s)", t.elapsed().as_secs_f64());
    let t = std::time::Instant::now();
    // 4,099 floats: two blocks, element by element (no whole vector); 1,000 bf16: one block
    // of vectors; 2^18 floats and 2^17 + 8 bf16: 64 and 17 blocks of vectors.
    let sym =
        unicomm_conformance::symmetric_all_reduce::<f32, _>(one, 4099, replays).and_then(|a| {
            let b = unicomm_conformance::symmetric_all_reduce::<unicomm::bf16, _>(one, 1000, 20)?;
            let c = unicomm_conformance::symmetric_all_reduce::<f32, _>(one, 1 << 18, 20)?;
            let d = unicomm_conformance::symmetric_all_reduce::<unicomm::bf16, _>(
                one,
                (1 << 17) + 8,
                20,
            )?;
            Ok(a[0] && b[0] && c[0] && d[0])
        });
    let ran = matches!(sym, Ok(true));
    reported(comm, &timed("symmetric all-reduces", t), sym)?;
    let t = std::time::Instant::now();
    let norm =
        unicomm_conformance::symmetric_rms_norm::<f32, _>(one, 1024, 3, 1e-5, replays).map(first);
    let ran = ran && matches!(norm, Ok(true));
    reported(comm, &timed("fused norm", t), norm)?;
    let t = std::time::Instant::now();
    #[cfg(feature = "nccl")]
    let reqs = unicomm::nccl::device_kernel_requirements(4);
    #[cfg(not(feature = "nccl"))]
    let reqs = unicomm::DeviceCommRequirements::runtime(4);
    let dev = unicomm_conformance::device_api_all_reduce::<f32, _>(one, 4099, replays, &reqs);
    reported(comm, &timed("device API kernel", t), dev.map(first))?;
    let t = std::time::Instant::now();
    let experts = expert_kernels(comm, replays);
    let ran = ran && matches!(experts, Ok(true));
    reported(
        comm,
        &timed("expert dispatch and combine, all_to_all_vdev", t),
        experts,
    )?;
    let t = std::time::Instant::now();
    // NCCL EP where its library is found (`UNICOMM_NCCL_EP_LIBRARY`, or NVIDIA's wheel):
    // held to the kernels' results; elsewhere the line says why it did not run.
    let cfg = unicomm::ExpertConfig {
        experts: 8 * comm.world_size(),
        max_tokens: 32,
        hidden: 2048,
        top_k: 8,
    };
    let ep = unicomm_conformance::expert_engine_matches_the_kernels(
        one,
        unicomm::ExpertEngine::Library,
        cfg,
        8,
        replays.min(100),
    );
    reported(
        comm,
        &timed("NCCL EP held to the kernels' results", t),
        ep.map(first_run),
    )?;
    let t = std::time::Instant::now();
    let recorded = unicomm_conformance::every_kind_of_work_is_recorded_once(one, Some(&reqs));
    reported(
        comm,
        &timed("every kind of work recorded once", t),
        recorded.map(|k| k.concat().join(" ")),
    )?;
    if comm.world_size() > 1 {
        disagreements(comm)?;
    }
    // The high-throughput mode last (its GPU kernel is the newest): `false` where the
    // backend has no kernel of it.
    let t = std::time::Instant::now();
    let cfg = unicomm::ExpertConfig {
        experts: 2 * comm.world_size(),
        max_tokens: 16,
        hidden: 5,
        top_k: 3,
    };
    let packed = unicomm_conformance::expert_dispatch_combine_packed(one, cfg, 28, 8, replays);
    reported(
        comm,
        &timed("high-throughput dispatch and combine", t),
        packed.map(first),
    )?;
    let wide = unicomm::ExpertConfig {
        experts: 8 * comm.world_size(),
        max_tokens: 32,
        hidden: 64,
        top_k: 8,
    };
    let packed = unicomm_conformance::expert_dispatch_combine_packed(one, wide, 160, 8, 20);
    reported(
        comm,
        &timed("high-throughput, rows of 16-byte vectors", t),
        packed.map(first),
    )?;
    let mode = unicomm::ExpertMode::HighThroughput {
        max_recv: (wide.max_tokens + wide.top_k) * comm.world_size(),
    };
    let fp8 = unicomm_conformance::expert_dispatch_fp8_in(one, wide, 2, mode, 6, 20);
    reported(
        comm,
        &timed("high-throughput FP8 dispatch", t),
        fp8.map(first),
    )?;
    Ok(ran)
}

/// Expert dispatch and combine: rows of 5 floats (element by element) with top-3 of two
/// experts a rank, rows of 64 (16-byte vectors) with top-8 of eight a rank, both eager
/// (routings that overflow a slot among them: refused on every rank, the group going on)
/// and replayed; a layout one rank larger with its rank 1 masked; FP8 tokens with two
/// scales each; the all-to-all with counts on the device.
fn expert_kernels(comm: &unicomm::Comm, replays: usize) -> unicomm::Result<bool> {
    let one = std::slice::from_ref(comm);
    let w = comm.world_size();
    let small = unicomm::ExpertConfig {
        experts: 2 * w,
        max_tokens: 16,
        hidden: 5,
        top_k: 3,
    };
    let wide = unicomm::ExpertConfig {
        experts: 8 * w,
        max_tokens: 32,
        hidden: 64,
        top_k: 8,
    };
    let mask = unicomm::RankMask::new(w + 1, &[1])?;
    let layout = unicomm::ExpertConfig {
        experts: 2 * (w + 1),
        ..small
    };
    use unicomm_conformance as conf;
    // The all-to-all with counts on the device: 5 elements at most a pair (element by
    // element), 64 (16-byte vectors).
    let seen = [
        conf::expert_dispatch_combine(one, small, 8, replays)?,
        conf::expert_dispatch_combine(one, wide, 8, 20)?,
        conf::expert_dispatch_combine_masked(one, layout, mask, 6, 20)?,
        conf::expert_dispatch_fp8(one, wide, 2, 6, 20)?,
        conf::symmetric_all_to_all_v(one, 5, replays)?,
        conf::symmetric_all_to_all_v(one, 64, 20)?,
    ];
    Ok(seen.into_iter().all(first))
}

/// Ranks that disagree: Lamport calls of count 0 among others exact (20 fresh
/// allocations), then every disagreement of every algorithm on a child communicator of its
/// own (a kernel's `Mismatch` ends its communicator on the GPU), each rank's outcome and
/// its time printed.
fn disagreements(comm: &unicomm::Comm) -> anyhow::Result<()> {
    let r = comm.rank();
    let t = std::time::Instant::now();
    let zero = unicomm_conformance::lamport_count_zero_sequence(comm, 20);
    reported(
        comm,
        &format!(
            "Lamport count-0 sequence x20 ({:.1} s)",
            t.elapsed().as_secs_f64()
        ),
        zero,
    )?;
    for algorithm in unicomm_conformance::ALGORITHMS {
        for d in unicomm_conformance::Disagreement::all(algorithm) {
            let t = std::time::Instant::now();
            let seen = unicomm_conformance::symmetric_disagreement_ending(comm, d, algorithm)
                .map_err(|e| anyhow::anyhow!("rank {r}: {d:?} in {}: {e}", algorithm.name()))?;
            println!(
                "rank_conformance: rank {r}: {d:?} in {} ({:.2} s): {}",
                algorithm.name(),
                t.elapsed().as_secs_f64(),
                seen.as_deref().unwrap_or("no symmetric memory")
            );
        }
    }
    Ok(())
}

/// The groups suite's checks that register a symmetric window.
const WINDOW_CHECKS: [&str; 2] = [
    "a child as a full communicator",
    "all_to_all_v into a window, copy-engine path",
];

/// Why this communicator has no symmetric window (a window registration, collective, is
/// `Unsupported`), or `None` where it has one.
fn no_window_here(comm: &unicomm::Comm) -> anyhow::Result<Option<String>> {
    match comm.register_window(comm.alloc::<f32>(1)?) {
        Ok(w) => {
            comm.deregister_window(w)?;
            Ok(None)
        }
        Err(e) => match e.error {
            unicomm::Error::Unsupported { .. } => Ok(Some(e.error.to_string())),
            other => Err(other.into()),
        },
    }
}

/// What a block of checks saw on this rank, printed; its failure aborts the communicator
/// (so that the other ranks stop waiting) and is this rank's error.
fn reported<T: std::fmt::Debug>(
    comm: &unicomm::Comm,
    what: &str,
    seen: unicomm::Result<T>,
) -> anyhow::Result<()> {
    let r = comm.rank();
    match seen {
        Ok(seen) => {
            println!("rank_conformance: rank {r}: {what}: {seen:?}");
            Ok(())
        }
        Err(e) => {
            let _ = comm.abort();
            bail!("rank {r}: {what}: {e}")
        }
    }
}

/// This rank's engine run ([`first`] of a run that is not `Copy`).
fn first_run(seen: Vec<unicomm_conformance::EngineRun>) -> unicomm_conformance::EngineRun {
    seen.into_iter()
        .next()
        .unwrap_or(unicomm_conformance::EngineRun::NotHere("no rank".into()))
}

/// This rank's outcome of a check run over one communicator (the one entry it returns).
fn first<T: Copy>(seen: Vec<T>) -> T {
    seen[0]
}
