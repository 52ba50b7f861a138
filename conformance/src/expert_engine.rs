//! An expert library's engine ([`ExpertEngine::Library`]) held to the results unicomm's
//! kernels are held to (the references of `expert.rs`), on bf16 tokens of small integers
//! and binary-fraction weights (every sum exact in f32, in any order, so both round it to
//! the same bf16): each expert's count and its tokens as a set (a library orders them as
//! its kernels receive them), the combine bit-exact; eagerly with an expert that scales
//! its tokens, then a graph of dispatch and combine replayed with a new routing before
//! each (its capture proves no host synchronisation). A token names an expert at most
//! once (a library's contract: DeepEP's and NCCL EP's routings are top-k of distinct
//! experts). Where the engine does not run: `false` with why.

use unicomm_core::{
    bf16, each_rank, Buffer, Collective, Comm, DeviceStream, Error, ExpertConfig, ExpertEngine,
    ExpertGroup, ExpertOptions, ExpertTokens, RankMask, Result,
};

use crate::expert::{combined, received, routing, wrong, Routing, StepBuffers};

/// Rank `p`'s routing in round `k` as the engine takes it: an expert named twice by one
/// token dropped (`-1`), tokens of 0 to 7.
fn engine_routing(cfg: &ExpertConfig, k: usize, p: usize, n: Option<usize>) -> Routing {
    let mut rt = routing(cfg, k, p, n);
    for row in rt.ids.chunks_mut(cfg.top_k) {
        for q in 1..row.len() {
            if row[q] >= 0 && row[..q].contains(&row[q]) {
                row[q] = -1;
            }
        }
    }
    for x in &mut rt.tokens {
        *x = (*x as i64).rem_euclid(8) as f32;
    }
    rt
}

fn bits(v: &[f32]) -> Vec<u16> {
    v.iter().map(|&x| bf16::from_f32(x).to_bits()).collect()
}

/// One round's outputs against the references: each local expert's count and its rows as
/// a set, then the combine (expert `e` having scaled its rows by `scale(e)`) bit for bit.
fn check_round<C: Collective>(
    g: &ExpertGroup<'_, bf16, C>,
    got: ExpertTokens<&Buffer<bf16, C>, &Buffer<i32, C>>,
    back: &Buffer<bf16, C>,
    all: &[Routing],
    scale: &dyn Fn(usize) -> f32,
    round: &str,
    st: &C::Stream,
) -> Result<()> {
    let c = g.comm();
    let (r, w, cfg) = (c.rank(), c.world_size(), g.config());
    let none = RankMask::none(w);
    let h = cfg.hidden;
    let bad = |what: String| Err(wrong(r, format!("{round}: {}'s {what}", g.engine().name())));
    let Some(want) = received(&cfg, none, all, r) else {
        return bad("routing of distinct experts overflowed".into());
    };
    let (rows, n) = (got.tokens.copy_to_host(st)?, got.counts.copy_to_host(st)?);
    for (l, due) in want.iter().enumerate() {
        let from = l * w * cfg.max_tokens * h;
        let count = (n[l].max(0) as usize).min(w * cfg.max_tokens);
        let mut got: Vec<Vec<u16>> = (rows[from..from + count * h].chunks(h))
            .map(|x| x.iter().map(|y| y.to_bits()).collect())
            .collect();
        let mut due: Vec<Vec<u16>> = bits(due).chunks(h).map(<[u16]>::to_vec).collect();
        got.sort();
        due.sort();
        if n[l] as usize != due.len() || got != due {
            return bad(format!(
                "local expert {l}: {} tokens, {} due, or other rows",
                n[l],
                due.len()
            ));
        }
    }
    let got: Vec<u16> = back.copy_to_host(st)?.iter().map(|x| x.to_bits()).collect();
    if got != bits(&combined(&cfg, none, &all[r], scale)) {
        return bad("combine differs".into());
    }
    Ok(())
}

/// What an engine's run on one rank came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineRun {
    /// Every round and replay matched.
    Matched,
    /// The engine does not run here: its `Unsupported`, or its library not found.
    NotHere(String),
}

/// `rounds` eager rounds and `replays` replays on `engine`'s group of bf16 tokens: what
/// each rank saw.
pub fn expert_engine_matches_the_kernels<C: Collective>(
    comms: &[Comm<C>],
    engine: ExpertEngine,
    cfg: ExpertConfig,
    rounds: usize,
    replays: usize,
) -> Result<Vec<EngineRun>> {
    each_rank(comms, |c| -> Result<EngineRun> {
        let st = c.create_stream()?;
        let g = match c.expert_group_with::<bf16>(
            cfg,
            ExpertOptions {
                engine,
                ..Default::default()
            },
        ) {
            Err(e @ (Error::Unsupported { .. } | Error::LibraryNotFound { .. })) => {
                return Ok(EngineRun::NotHere(e.to_string()));
            }
            other => other?,
        };
        eager(&g, rounds, &st)?;
        if replays > 0 {
            replayed(&g, rounds..rounds + replays, &st)?;
        }
        st.synchronize()?;
        Ok(EngineRun::Matched)
    })
}

fn eager<C: Collective>(g: &ExpertGroup<'_, bf16, C>, rounds: usize, st: &C::Stream) -> Result<()> {
    let c = g.comm();
    let (r, w, cfg) = (c.rank(), c.world_size(), g.config());
    let mut out = c.alloc::<bf16>(g.received_len())?;
    let mut counts = c.alloc::<i32>(g.local_experts())?;
    // The experts: expert `e` multiplies its tokens by `e + 1`.
    let scale = |e: usize| (e + 1) as f32;
    for k in 0..rounds {
        // At least one token a rank: an empty dispatch is not this case's question.
        let n = |p: usize| 1 + (p * 5 + k * 3) % cfg.max_tokens;
        let all: Vec<Routing> = (0..w)
            .map(|p| engine_routing(&cfg, k, p, Some(n(p))))
            .collect();
        let mine = &all[r];
        let tokens = c.upload(&to_bf16(&mine.tokens), st)?;
        let ids = c.upload(&mine.ids, st)?;
        let o = ExpertTokens {
            tokens: &mut out,
            counts: &mut counts,
        };
        g.dispatch(&tokens, &ids, o, st)?;
        let (rows, local) = (cfg.max_tokens * w * cfg.hidden, g.local_experts());
        let scaled: Vec<bf16> = (out.copy_to_host(st)?.iter().enumerate())
            .map(|(i, x)| bf16::from_f32(x.to_f32() * scale(r * local + i / rows)))
            .collect();
        let expert_out = c.upload(&scaled, st)?;
        let weights = c.upload(&mine.weights, st)?;
        let mut back = c.alloc::<bf16>(mine.n * cfg.hidden)?;
        g.combine(&expert_out, &ids, &weights, &mut back, st)?;
        let got = ExpertTokens {
            tokens: &out,
            counts: &counts,
        };
        check_round(g, got, &back, &all, &scale, &format!("round {k}"), st)?;
    }
    Ok(())
}

fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

/// A graph of dispatch and combine (the dispatch's output as the experts' output),
/// replayed with a new routing and new tokens of the same count before each.
fn replayed<C: Collective>(
    g: &ExpertGroup<'_, bf16, C>,
    rounds: std::ops::Range<usize>,
    st: &C::Stream,
) -> Result<()> {
    let (c, from) = (g.comm(), rounds.start);
    let (r, w, cfg) = (c.rank(), c.world_size(), g.config());
    let n = |p: usize| (p * 3 + 1) % (cfg.max_tokens / 2 + 1) + 1;
    let first = engine_routing(&cfg, from, r, Some(n(r)));
    let b = StepBuffers::new(g, &first, &to_bf16(&first.tokens), st)?;
    let graph = b.capture(g, st)?;
    for k in rounds {
        let all: Vec<Routing> = (0..w)
            .map(|p| engine_routing(&cfg, k, p, Some(n(p))))
            .collect();
        let mine = &all[r];
        b.write(mine, &to_bf16(&mine.tokens), st)?;
        graph.launch(st)?;
        let what = format!("replay {k}");
        check_round(g, b.received(), &b.back, &all, &|_| 1.0, &what, st)?;
    }
    Ok(())
}
