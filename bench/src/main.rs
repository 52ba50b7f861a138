//! `unicomm-bench` (`cargo xtask bench`): unicomm's collectives measured as nccl-tests
//! measures them, every mode side by side in one run.
//!
//! - Sizes from `-b` to `-e` by factor `-f` (default 8 B to 512 MiB by 4); `-d` type, `-o`
//!   reduction, `-w` warm-up and `-n` timed iterations, `-c 1` data check.
//! - Timing: device events (`DeviceStream::record`) around `-n` back-to-back iterations, one
//!   more event between iterations for the per-iteration spread; no host synchronisation
//!   inside the timed loop. A collective is as slow as its slowest rank: the reported time is
//!   the maximum over ranks.
//! - algbw and busbw with nccl-tests' formulas (its doc/PERFORMANCE.md): algbw = size / time;
//!   busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather, reduce_scatter and
//!   all_to_all, x 1 for broadcast. `size` is nccl-tests' too: the per-rank buffer for
//!   all_reduce and broadcast, the whole gathered/scattered/exchanged buffer otherwise.
//! - Modes (`--modes`): `plain` buffers, `registered` (`ncclCommRegister`), `window`
//!   (symmetric windows), `raw` (the same NCCL calls through the function table, no unicomm
//!   layer, plain buffers; `raw-registered` and `raw-window` the same on registered and
//!   window buffers: every way of calling NCCL by hand), `ce` (the copy-engine path in windows; all_to_all and
//!   all_gather), `auto` (`register_auto`: the policy picks a path per call), `one-shot`,
//!   `two-shot`, `lamport` (unicomm's own all-reduce kernels over symmetric memory; float
//!   all_reduce by sum, max or min, out of place), `device-api` (the one-shot over NCCL's
//!   device API), `fused` and `fused-fp8` (the fused all-reduce + residual add + RMSNorm,
//!   one-shot, on the `decode` preset's rows; the residual checked). A mode the
//!   backend cannot run is skipped and said so. Each mode's device memory beyond its
//!   buffers (the library's registrations, the second communicator of `auto`) is reported.
//! - Output: the table on stdout, `-J FILE` JSON, `--plot FILE.svg`, a progress bar on
//!   stderr. On the mock it is a smoke test: times are host times of thread ranks.

#![deny(unsafe_code)]

mod mode;
mod moe_ep;
mod report;
mod run;
mod workloads;

pub use mode::Mode;
use workloads::workloads;

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use unicomm::{DataType, ReduceOp, Vendor};

/// The collectives the benchmark runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum Coll {
    /// ncclAllReduce.
    AllReduce,
    /// ncclAlltoAll.
    AllToAll,
    /// ncclAllGather.
    AllGather,
    /// ncclReduceScatter.
    ReduceScatter,
    /// ncclBroadcast (root 0).
    Broadcast,
    /// ncclGather (root 0; grouped send/recv before NCCL 2.28.3).
    Gather,
    /// ncclScatter (root 0).
    Scatter,
    /// All-to-all with per-peer counts (skewed as MoE routing is; the `moe` preset's from a
    /// top-k routing): RCCL's ncclAllToAllv, grouped send/recv on NCCL.
    AllToAllV,
}

impl Coll {
    /// nccl-tests' bus-bandwidth factor for `n` ranks.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::AllToAll
            | Coll::AllGather
            | Coll::ReduceScatter
            | Coll::Gather
            | Coll::Scatter
            | Coll::AllToAllV => (n - 1.0) / n,
            Coll::Broadcast => 1.0,
        }
    }
    /// Whether `size` is the whole buffer of all ranks' chunks (counts are then per rank).
    pub fn per_rank(self) -> bool {
        matches!(
            self,
            Coll::AllToAll
                | Coll::AllGather
                | Coll::ReduceScatter
                | Coll::Gather
                | Coll::Scatter
                | Coll::AllToAllV
        )
    }
    /// The library's operation (reductions as sums, root 0).
    pub fn kind(self) -> unicomm::core::Kind {
        use unicomm::core::Kind;
        match self {
            Coll::AllReduce => Kind::AllReduce { op: ReduceOp::Sum },
            Coll::AllToAll => Kind::AllToAll,
            Coll::AllGather => Kind::AllGather,
            Coll::ReduceScatter => Kind::ReduceScatter { op: ReduceOp::Sum },
            Coll::Broadcast => Kind::Broadcast { root: 0 },
            Coll::Gather => Kind::Gather { root: 0 },
            Coll::Scatter => Kind::Scatter { root: 0 },
            Coll::AllToAllV => Kind::AllToAllV,
        }
    }
    /// The name in tables, JSON and tune files: the operation's ([`Kind::snake_name`],
    /// what the automatic policy reads).
    ///
    /// [`Kind::snake_name`]: unicomm::core::Kind::snake_name
    pub fn name(self) -> &'static str {
        self.kind().snake_name()
    }
}

/// The order of the measurements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Order {
    /// The modes take turns at each size (a collective at a time): a slow phase of a shared
    /// host hits every mode of the sizes it overlaps, so the modes' ratios hold.
    Size,
    /// Each mode runs every size before the next mode (nccl-tests' order, one mode a run).
    Mode,
}

/// Fixed workloads instead of a size sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// Ulysses sequence parallelism of a diffusion model: bf16 all_to_all of (1, 4096/W, 24,
    /// 128) and (1, 7680/W, 40, 128) per rank, the all_gathers of (1, S/W, H, 128), and a
    /// (1, 512, 512) all_reduce.
    Visualgen,
    /// MoE dispatch without DeepEP, as PyTorch's `all_to_all_single` with split sizes: 4096
    /// tokens per rank routed top-8 among 256 experts spread over the ranks, the experts'
    /// popularity skewed (a Zipf-like draw), each token sent once to each rank holding one
    /// of its experts; hidden 7168 (DeepSeek-V3), in the run's type (`-d bfloat16`, `-d
    /// f8e4m3`).
    Moe,
    /// A decode step's tensor-parallel all-reduces: bf16, hidden 4096 (Llama 3 8B) and 8192
    /// (70B), batch 1 to 64 tokens (8 KiB to 1 MiB per call); latency-bound, so run it eager
    /// and captured (`-G`) side by side.
    Decode,
}

/// A MoE layer's routing, for the all_to_all_v of the `moe` preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeShape {
    /// Tokens per rank.
    pub tokens: usize,
    /// Elements per token.
    pub hidden: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Experts in all (spread evenly over the ranks).
    pub experts: usize,
}

/// The command line (nccl-tests' short options where it has them).
#[derive(Parser, Debug, Clone)]
#[command(
    name = "unicomm-bench",
    about = "unicomm's collectives measured as nccl-tests measures them"
)]
pub struct Args {
    /// auto, cuda, rocm or mock.
    #[arg(long, default_value = "auto")]
    pub vendor: String,
    /// Ranks (default: every GPU, or UNICOMM_MOCK_RANKS on the mock).
    #[arg(long)]
    pub ranks: Option<usize>,
    /// Collectives, comma-separated.
    #[arg(
        long = "coll",
        value_delimiter = ',',
        default_value = "all_reduce,all_to_all,all_gather,reduce_scatter,broadcast"
    )]
    pub colls: Vec<Coll>,
    /// Smallest size (bytes; K, M, G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = parse_size)]
    pub min_bytes: usize,
    /// Largest size.
    #[arg(short = 'e', long = "maxbytes", default_value = "512M", value_parser = parse_size)]
    pub max_bytes: usize,
    /// Size multiplier between steps.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 4)]
    pub step_factor: usize,
    /// Element type: float, double, half, bfloat16, int8, uint8, int32, uint32, int64, uint64,
    /// f8e4m3, f8e5m2.
    #[arg(short = 'd', long = "datatype", default_value = "float", value_parser = parse_dtype)]
    pub dtype: DataType,
    /// Reduction: sum, prod, max, min, avg, premulsum (each rank's scalar 1).
    #[arg(short = 'o', long = "op", default_value = "sum", value_parser = parse_op)]
    pub op: ReduceOp,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    pub warmup: usize,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: usize,
    /// Capture each turn's timed iterations into a graph per rank and launch it this many
    /// times, timing the launches (nccl-tests' -G): the device's time without the host's
    /// per-call cost. 0: call directly. Through `unicomm::Graph` on every backend (the mock
    /// included) where a thread drives one rank; with `--single-thread` over several ranks,
    /// and for the `raw` modes, CUDA's own capture (NCCL only).
    #[arg(short = 'G', long = "cudagraph", default_value_t = 0)]
    pub graphs: usize,
    /// Check the data (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: u8,
    /// Modes, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "plain,registered,window,raw,raw-registered,raw-window,ce,auto"
    )]
    pub modes: Vec<Mode>,
    /// Placements: out (out of place), in (in place).
    #[arg(long, value_delimiter = ',', default_value = "out,in")]
    pub place: Vec<String>,
    /// One thread drives every rank inside a group (default: one thread per rank).
    #[arg(long)]
    pub single_thread: bool,
    /// Measurement order: size (the modes take turns at each size) or mode (each mode
    /// sweeps every size before the next).
    #[arg(long, value_enum, default_value = "size")]
    pub order: Order,
    /// With `--order size`: the timed iterations of a size in this many turns of every
    /// mode (each turn after `-w`/rounds warm-up iterations), so a slow phase of the host
    /// lands on one turn of one mode. Ignored with `--order mode`.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Write the results as JSON.
    #[arg(short = 'J', long = "json")]
    pub json: Option<PathBuf>,
    /// Draw bus bandwidth and latency against size, one line per mode, as SVG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// A fixed workload instead of the size sweep.
    #[arg(long)]
    pub preset: Option<Preset>,
    /// Write the automatic policy's thresholds measured by this run (the fastest of the
    /// registered, window and ce modes per collective and size, out of place) to FILE, for
    /// `UNICOMM_TUNE_FILE` (`cargo xtask tune`).
    #[arg(long)]
    pub tune: Option<PathBuf>,
    /// After the run, the floors of rank 0's GPU beside each all-reduce (CUDA).
    #[arg(long)]
    pub floor: bool,
    /// Only re-draw `--plot` from a run's JSON (no measurement).
    #[arg(long)]
    pub replot: Option<PathBuf>,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("{s:?} is not a size (bytes, or with K, M, G)"))
}

fn parse_dtype(s: &str) -> Result<DataType, String> {
    Ok(match s {
        "float" | "f32" => DataType::F32,
        "double" | "f64" => DataType::F64,
        "half" | "f16" => DataType::F16,
        "bfloat16" | "bf16" => DataType::Bf16,
        "int8" | "i8" => DataType::I8,
        "uint8" | "u8" => DataType::U8,
        "int32" | "int" | "i32" => DataType::I32,
        "uint32" | "u32" => DataType::U32,
        "int64" | "i64" => DataType::I64,
        "uint64" | "u64" => DataType::U64,
        "f8e4m3" | "fp8" => DataType::F8E4M3,
        "f8e5m2" => DataType::F8E5M2,
        _ => return Err(format!("{s:?} is not a data type")),
    })
}

fn parse_op(s: &str) -> Result<ReduceOp, String> {
    Ok(match s {
        "sum" => ReduceOp::Sum,
        "prod" => ReduceOp::Prod,
        "max" => ReduceOp::Max,
        "min" => ReduceOp::Min,
        "avg" => ReduceOp::Avg,
        // A pre-multiplied sum with each rank's scalar 1 of the run's type (its operator
        // created and destroyed per call): what the scaled sum costs over a plain sum.
        "premulsum" => ReduceOp::pre_mul_sum(1u8),
        _ => return Err(format!("{s:?} is not a reduction")),
    })
}

/// One workload: a collective at one size and type.
#[derive(Debug, Clone, Copy)]
pub struct Work {
    /// Which collective.
    pub coll: Coll,
    /// nccl-tests' size, bytes.
    pub bytes: usize,
    /// Element type.
    pub dtype: DataType,
    /// A label (the preset's shape), or empty.
    pub label: &'static str,
    /// The routing of an all_to_all_v (the `moe` preset), or the sweep's skewed counts.
    pub moe: Option<MoeShape>,
    /// The row length of the decode preset's shapes (the fused modes' norm), or `None`.
    pub hidden: Option<usize>,
}

fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    if let Err(e) = bench() {
        eprintln!("unicomm-bench: {e:#}");
        std::process::exit(1);
    }
}

fn bench() -> anyhow::Result<()> {
    match std::env::args().nth(1).as_deref() {
        Some("report") => return report::report(std::env::args().skip(1)),
        Some("moe-ep") => return moe_ep::moe_ep(std::env::args().skip(1)),
        _ => {}
    }
    let args = Args::parse();
    if let Some(json) = &args.replot {
        let out = args
            .plot
            .as_ref()
            .context("--replot needs --plot OUT.svg")?;
        return report::replot(json, out);
    }
    let vendor: Vendor = args.vendor.parse()?;
    let (vendor, why) = unicomm::resolve(vendor).context("choosing the vendor")?;
    let comms = communicators(args.ranks, vendor)?;
    let w = comms[0].world_size();
    // Only rank 0 reports (one process per rank under a launcher).
    let lead = comms[0].rank() == 0;
    let caps = comms[0].capabilities();
    if args.graphs > 0 && caps.backend != "nccl" && args.single_thread && comms.len() > 1 {
        bail!(
            "-G with --single-thread over several ranks captures them all in one CUDA graph: the CUDA backend only; this run has {} (drop --single-thread: a thread per rank captures through unicomm::Graph)",
            caps.backend
        );
    }
    let work = workloads(&args, w)?;
    let modes = runnable_modes(&args, &caps);
    let places = placements(&args)?;
    let dtype = work.first().map_or(args.dtype, |w| w.dtype);
    let devices = run::devices(&comms).context("gathering every rank's device")?;
    let header = report::Header::new(&args, dtype, vendor, &why, &caps, w, devices);
    if lead {
        header.print();
    }
    let partial = |so_far: &[run::Measure]| {
        if let Some(p) = &args.json {
            if let Err(e) = report::json(p, &header, so_far) {
                eprintln!("# could not write the partial JSON: {e:#}");
            }
        }
    };
    let (results, memory, failed) = run::sweep(
        &comms,
        &args,
        &work,
        &modes,
        &places,
        &|m: &[run::Measure]| {
            if lead {
                partial(m)
            }
        },
    )?;
    if lead {
        write_reports(&args, &header, &results, &memory)?;
        if args.floor {
            let (iters, graphs, json) = (args.iters, args.graphs, args.json.as_deref());
            report::floors(&comms[0], iters, graphs, &results, json)?;
        }
    }
    if let Some(e) = failed {
        // Communicators were aborted; nothing to finalize.
        return Err(e.context("the sweep stopped (the results above are what it measured)"));
    }
    for c in comms {
        c.finalize()?;
    }
    let wrong: u64 = results.iter().filter_map(|r| r.wrong).sum();
    if wrong > 0 {
        bail!("{wrong} wrong elements");
    }
    Ok(())
}

/// Under a launcher (torchrun, mpirun, srun, `cargo xtask launch`): this process's one rank,
/// the figures combined across processes; else every rank of a local world of `ranks`
/// (`None`: `local_comms`' default).
pub(crate) fn communicators(
    ranks: Option<usize>,
    vendor: Vendor,
) -> anyhow::Result<Vec<unicomm::Comm>> {
    if unicomm::bootstrap::LaunchEnv::detect().is_ok() {
        if ranks.is_some() {
            bail!("--ranks is for one process driving every rank; under a launcher the launcher sets the world");
        }
        return Ok(vec![
            unicomm::from_env(vendor).context("joining the launched world")?
        ]);
    }
    unicomm::local_comms_n(vendor, ranks).context("creating communicators")
}

/// The modes asked for that this backend runs (the others named as skipped, with why).
fn runnable_modes(args: &Args, caps: &unicomm::Capabilities) -> Vec<Mode> {
    let mut modes = Vec::new();
    for &m in &args.modes {
        let why = run::unsupported(m, caps).or_else(|| {
            (m == Mode::Ce && args.single_thread).then(|| {
                "the copy-engine path does not run inside a group: not with --single-thread".into()
            })
        });
        match why {
            Some(why) => eprintln!("# mode {}: skipped ({why})", m.name()),
            None => modes.push(m),
        }
    }
    modes
}

/// `--place`: out of place (`false`) and/or in place (`true`).
fn placements(args: &Args) -> anyhow::Result<Vec<bool>> {
    args.place
        .iter()
        .map(|p| match p.as_str() {
            "out" => Ok(false),
            "in" => Ok(true),
            _ => bail!("--place takes out and/or in, not {p:?}"),
        })
        .collect()
}

/// The table and memory on stdout, and the JSON, plot and tune files asked for.
fn write_reports(
    args: &Args,
    header: &report::Header,
    results: &[run::Measure],
    memory: &[run::ModeMemory],
) -> anyhow::Result<()> {
    let w = header.world;
    report::table(results, w);
    report::memory(memory);
    if let Some(p) = &args.json {
        report::json_with_memory(p, header, results, memory)?;
    }
    if let Some(p) = &args.plot {
        report::plot(p, header, results)?;
    }
    if let Some(p) = &args.tune {
        report::tune(p, header, results)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The command line, the tables, the JSON and the tune files spell a collective one
    /// way: clap's snake-case value is the operation's own name, which the policy parses.
    #[test]
    fn every_collective_is_spelled_as_the_library_names_it() {
        for c in Coll::value_variants() {
            let value = c.to_possible_value().expect("a value");
            assert_eq!(value.get_name(), c.name());
            assert_eq!(
                unicomm::core::Kind::from_snake_name(c.name()),
                Some(c.kind())
            );
        }
    }
}
