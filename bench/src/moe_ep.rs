//! `unicomm-bench moe-ep`: expert parallelism's dispatch and combine timed as a MoE layer
//! runs them (DeepSeek-V3's decode by default: 128 tokens a rank, hidden 7168, top-8 of 256
//! experts, bf16; `--tokens 4096` for a prefill), eagerly and in a graph (`-G`), the
//! combine's result checked against a fixed-order f32 reference (identity experts: each
//! token's weighted sum of itself). Device events, back-to-back steps, us per step (a
//! dispatch and a combine). `--max-recv N` times the high-throughput mode (a prefill's
//! packed rows). `--engine library` times the backend's expert library (NCCL EP)
//! on the same routing, for a ratio in one run. A backend that does not run the engine
//! says why (and `--engine library` then fails: it was asked for by name).

use anyhow::{bail, Context};
use clap::Parser;
use unicomm::{
    bf16, ExpertConfig, ExpertEngine, ExpertMode, ExpertOptions, ExpertTokens, Graph, Vendor,
};

/// `unicomm-bench moe-ep` arguments.
#[derive(Parser, Debug)]
#[command(name = "unicomm-bench moe-ep")]
struct MoeArgs {
    /// auto, cuda, rocm or mock.
    #[arg(long, default_value = "auto")]
    vendor: String,
    /// Ranks of a local world (one process; under a launcher, the launcher's).
    #[arg(long)]
    ranks: Option<usize>,
    /// Tokens per rank.
    #[arg(long, default_value_t = 128)]
    tokens: usize,
    /// Elements per token.
    #[arg(long, default_value_t = 7168)]
    hidden: usize,
    /// Experts in all (a multiple of the world size).
    #[arg(long, default_value_t = 256)]
    experts: usize,
    /// Experts per token.
    #[arg(long, default_value_t = 8)]
    top_k: usize,
    /// Timed steps.
    #[arg(short = 'n', long, default_value_t = 20)]
    iters: usize,
    /// Warm-up steps.
    #[arg(short = 'w', long, default_value_t = 5)]
    warmup: usize,
    /// Launches of a graph of `iters` steps (0: no graph).
    #[arg(short = 'G', long, default_value_t = 0)]
    graphs: usize,
    /// Who runs the dispatch and combine: `kernels` (unicomm's) or `library` (the
    /// backend's expert library: NCCL EP on NCCL, where its library is found).
    #[arg(long, default_value = "kernels", value_parser = ["kernels", "library"])]
    engine: String,
    /// The high-throughput mode with at most this many token copies a rank (prefill's:
    /// rows packed expert-major); unset: the low-latency mode.
    #[arg(long)]
    max_recv: Option<usize>,
}

impl MoeArgs {
    /// The group's options.
    fn options(&self) -> ExpertOptions {
        ExpertOptions {
            engine: self.engine(),
            mode: match self.max_recv {
                Some(max_recv) => ExpertMode::HighThroughput { max_recv },
                None => ExpertMode::LowLatency,
            },
            ..ExpertOptions::default()
        }
    }

    fn engine(&self) -> ExpertEngine {
        match self.engine.as_str() {
            "library" => ExpertEngine::Library,
            _ => ExpertEngine::Kernels,
        }
    }
}

/// One rank's figures: us per step eagerly and in a graph, elements that differ.
struct Figures {
    eager_us: f64,
    graph_us: Option<f64>,
    wrong: usize,
}

/// `unicomm-bench moe-ep ARGS`.
pub fn moe_ep(args: impl IntoIterator<Item = String>) -> anyhow::Result<()> {
    let a = MoeArgs::parse_from(args);
    let (vendor, _) =
        unicomm::resolve(a.vendor.parse::<Vendor>()?).context("choosing the vendor")?;
    let comms = crate::communicators(a.ranks, vendor)?;
    let w = comms[0].world_size();
    let cfg = ExpertConfig {
        experts: a.experts,
        max_tokens: a.tokens,
        hidden: a.hidden,
        top_k: a.top_k,
    };
    let got = unicomm::each_rank(&comms, |c| rank(c, &a, cfg)).map_err(anyhow::Error::from)?;
    if comms[0].rank() == 0 {
        println!(
            "# unicomm-bench moe-ep: {} ranks ({}, {}, {:?}), {} tokens a rank, hidden {}, top-{} of {} experts, bf16, {} steps",
            w, comms[0].capabilities().backend, a.engine().name(), a.options().mode, a.tokens, a.hidden, a.top_k, a.experts, a.iters
        );
        println!("# rank  eager (us/step)  graph (us/step)  #wrong");
    }
    for (c, f) in comms.iter().zip(&got) {
        match f {
            Err(why) => println!("  {:>4}  not run here: {why}", c.rank()),
            Ok(f) => println!(
                "  {:>4}  {:>15.2}  {:>15}  {:>6}",
                c.rank(),
                f.eager_us,
                f.graph_us.map_or("-".into(), |g| format!("{g:.2}")),
                f.wrong
            ),
        }
    }
    let wrong: usize = got.iter().flatten().map(|f| f.wrong).sum();
    if got.iter().all(Result::is_err) && a.engine() == ExpertEngine::Library {
        bail!("{} did not run", a.engine().name());
    }
    if wrong > 0 {
        bail!("{wrong} wrong elements");
    }
    Ok(())
}

/// Rank `r`'s routing: `top_k` distinct experts a token (`-1` for none on one token in
/// eleven), weights `1 / top_k`; tokens of small integers.
fn routing(r: usize, a: &MoeArgs) -> (Vec<i32>, Vec<f32>, Vec<bf16>) {
    let (n, k, e) = (a.tokens, a.top_k, a.experts);
    let mut ids = Vec::with_capacity(n * k);
    for t in 0..n {
        let start = (r * 131 + t * 17) % e;
        for q in 0..k {
            let id = (start + q * (e / k).max(1)) % e;
            ids.push(if (t + q) % 11 == 10 { -1 } else { id as i32 });
        }
    }
    let weights = vec![1.0 / k as f32; n * k];
    let tokens = (0..n * a.hidden)
        .map(|i| bf16::from_f32(((r + i) % 9) as f32 - 4.0))
        .collect();
    (ids, weights, tokens)
}

/// Each token's combine with identity experts: its weighted sum of itself, in `k` order.
fn reference(ids: &[i32], weights: &[f32], tokens: &[bf16], a: &MoeArgs) -> Vec<bf16> {
    let (h, k) = (a.hidden, a.top_k);
    (0..a.tokens * h)
        .map(|i| {
            let (t, j) = (i / h, i % h);
            let mut acc = 0.0f32;
            for q in 0..k {
                if ids[t * k + q] >= 0 {
                    acc += weights[t * k + q] * tokens[t * h + j].to_f32();
                }
            }
            bf16::from_f32(acc)
        })
        .collect()
}

/// One step's device operands and outputs.
struct Operands<'b> {
    tokens: &'b unicomm::Buffer<bf16>,
    ids: &'b unicomm::Buffer<i32>,
    weights: &'b unicomm::Buffer<f32>,
    out: &'b unicomm::Buffer<bf16>,
    counts: &'b unicomm::Buffer<i32>,
    back: &'b unicomm::Buffer<bf16>,
}

/// us per step of `a.graphs` launches of a graph of `a.iters` steps.
fn graphed(
    g: &unicomm::ExpertGroup<'_, bf16>,
    a: &MoeArgs,
    b: Operands<'_>,
    st: &unicomm::Stream,
) -> unicomm::Result<f64> {
    let Operands {
        tokens,
        ids,
        weights,
        out,
        counts,
        back,
    } = b;
    let graph = Graph::capture(st, |s| {
        (0..a.iters).try_for_each(|_| {
            let o = ExpertTokens {
                tokens: out,
                counts,
            };
            s.expert_dispatch(g, tokens, ids, o)?;
            s.expert_combine(g, out, ids, weights, back)
        })
    })?;
    graph.launch(st)?;
    let begin = st.record()?;
    for _ in 0..a.graphs {
        graph.launch(st)?;
    }
    let end = st.record()?;
    st.synchronize()?;
    Ok(begin.elapsed_ms(&end)? * 1e3 / (a.graphs * a.iters.max(1)) as f64)
}

/// Rank `c`'s figures, or why its backend does not run the engine.
fn rank(
    c: &unicomm::Comm,
    a: &MoeArgs,
    cfg: ExpertConfig,
) -> unicomm::Result<Result<Figures, String>> {
    let st = c.create_stream()?;
    let g = match c.expert_group_with::<bf16>(cfg, a.options()) {
        Err(e @ (unicomm::Error::Unsupported { .. } | unicomm::Error::LibraryNotFound { .. })) => {
            return Ok(Err(e.to_string()))
        }
        other => other?,
    };
    let (ids, weights, tokens) = routing(c.rank(), a);
    let want = reference(&ids, &weights, &tokens, a);
    let (ids_d, weights_d) = (c.upload(&ids, &st)?, c.upload(&weights, &st)?);
    let tokens_d = c.upload(&tokens, &st)?;
    let (mut out, mut counts) = (
        c.alloc::<bf16>(g.received_len())?,
        c.alloc::<i32>(g.counts_len())?,
    );
    let mut back = c.alloc::<bf16>(a.tokens * a.hidden)?;
    let mut step = |out: &mut unicomm::Buffer<bf16>, back: &mut unicomm::Buffer<bf16>| {
        let o = ExpertTokens {
            tokens: &mut *out,
            counts: &mut counts,
        };
        g.dispatch(&tokens_d, &ids_d, o, &st)?;
        g.combine(&*out, &ids_d, &weights_d, back, &st)
    };
    for _ in 0..a.warmup.max(1) {
        match step(&mut out, &mut back) {
            Err(e @ unicomm::Error::Unsupported { .. }) => return Ok(Err(e.to_string())),
            other => other?,
        }
    }
    let begin = st.record()?;
    for _ in 0..a.iters {
        step(&mut out, &mut back)?;
    }
    let end = st.record()?;
    st.synchronize()?;
    let eager_us = begin.elapsed_ms(&end)? * 1e3 / a.iters.max(1) as f64;
    let got = back.copy_to_host(&st)?;
    let wrong = got
        .iter()
        .zip(&want)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    let graph_us = match a.graphs {
        0 => None,
        _ => {
            let b = Operands {
                tokens: &tokens_d,
                ids: &ids_d,
                weights: &weights_d,
                out: &out,
                counts: &counts,
                back: &back,
            };
            Some(graphed(&g, a, b, &st)?)
        }
    };
    Ok(Ok(Figures {
        eager_us,
        graph_us,
        wrong,
    }))
}
