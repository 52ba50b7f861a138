//! Expert parallelism's dispatch and combine, the same on every backend that runs them:
//! routings drawn per rank and round (`-1` entries, one token's experts repeated, ranks
//! with no token, ranks that receive nothing, top-k above the world), the dispatch's
//! expert-major output and counts bit-exact, the combine equal to a fixed-order f32
//! reference (exact on the small integers and binary-fraction weights used); eagerly with
//! an expert that scales its tokens, then a graph of dispatch and combine replayed with a
//! new routing and new tokens before each. A capacity exceeded, or an expert id out of
//! range, on one rank is the same `InvalidArgument` on every rank, and the ranks stay in
//! step. Where the backend lacks them: `Unsupported`.

use unicomm_core::graph::Graph;
use unicomm_core::{
    each_rank, Buffer, Collective, Comm, DeviceStream, Element, Error, ExpertConfig, ExpertGroup,
    ExpertTokens, RankMask, Result,
};

/// A routing and the tokens of rank `p` in round `k`.
pub(crate) struct Routing {
    pub(crate) n: usize,
    pub(crate) ids: Vec<i32>,
    pub(crate) weights: Vec<f32>,
    pub(crate) tokens: Vec<f32>,
}

fn mix(x: u64) -> u64 {
    let x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x ^ (x >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9) >> 17
}

/// Rank `p`'s routing in round `k`, with `n` tokens (or a count of its own drawn where
/// `n` is `None`).
pub(crate) fn routing(cfg: &ExpertConfig, k: usize, p: usize, n: Option<usize>) -> Routing {
    let (e, kk, h) = (cfg.experts, cfg.top_k, cfg.hidden);
    let n = n.unwrap_or((p * 5 + k * 3) % (cfg.max_tokens * 3 / 4 + 1));
    let mut ids = Vec::with_capacity(n * kk);
    for t in 0..n {
        for q in 0..kk {
            let r = mix((k * 1_000_003 + p * 10_007 + t * 101 + q) as u64) as usize;
            ids.push(match r % 7 {
                0 => -1,
                // The entry before repeated (one token's expert twice).
                1 if q > 0 => ids[t * kk + q - 1],
                _ => ((r / 7) % e) as i32,
            });
        }
    }
    let weights = (0..n * kk).map(|i| ((i % 4) + 1) as f32 * 0.25).collect();
    let tokens = (0..n * h)
        .map(|i| (p * 1000 + (i / h) * 10 + i % h % 7 + k % 5) as f32)
        .collect();
    Routing {
        n,
        ids,
        weights,
        tokens,
    }
}

/// What rank `r` must receive: per local expert its rows (source-rank order, each source's
/// `(token, k)` order); or `None` where a slot exceeds `max_tokens`.
pub(crate) fn received(
    cfg: &ExpertConfig,
    mask: RankMask,
    all: &[Routing],
    r: usize,
) -> Option<Vec<Vec<f32>>> {
    let local = cfg.experts / mask.world();
    for rt in all {
        // A masked rank's experts receive nothing, so they never overflow.
        for e in (0..cfg.experts).filter(|e| !mask.is_masked(e / local)) {
            if rt.ids.iter().filter(|&&x| x == e as i32).count() > cfg.max_tokens {
                return None;
            }
        }
    }
    Some(rows_for(cfg, mask, all, r))
}

/// Rank `r`'s rows per local expert, whatever the capacities.
pub(crate) fn rows_for(
    cfg: &ExpertConfig,
    mask: RankMask,
    all: &[Routing],
    r: usize,
) -> Vec<Vec<f32>> {
    let (h, kk) = (cfg.hidden, cfg.top_k);
    let local = cfg.experts / mask.world();
    (0..local)
        .map(|l| {
            let e = (mask.layout_rank(r) * local + l) as i32;
            let mut rows = Vec::new();
            for rt in all {
                for (i, _) in rt.ids.iter().enumerate().filter(|(_, &x)| x == e) {
                    let t = i / kk;
                    rows.extend_from_slice(&rt.tokens[t * h..(t + 1) * h]);
                }
            }
            rows
        })
        .collect()
}

/// Rank `r`'s combined tokens where expert `e` multiplies by `scale(e)`: in `k` order, f32;
/// `-1` entries and a masked rank's experts contribute nothing.
pub(crate) fn combined(
    cfg: &ExpertConfig,
    mask: RankMask,
    rt: &Routing,
    scale: impl Fn(usize) -> f32,
) -> Vec<f32> {
    let (h, kk) = (cfg.hidden, cfg.top_k);
    let local = cfg.experts / mask.world();
    let mut out = Vec::with_capacity(rt.n * h);
    for t in 0..rt.n {
        for j in 0..h {
            let mut acc = 0.0f32;
            for q in 0..kk {
                let id = rt.ids[t * kk + q];
                if id >= 0 && !mask.is_masked(id as usize / local) {
                    acc += rt.weights[t * kk + q] * (rt.tokens[t * h + j] * scale(id as usize));
                }
            }
            out.push(acc);
        }
    }
    out
}

pub(crate) fn wrong(r: usize, what: String) -> Error {
    Error::invalid("expert", format!("rank {r}: {what}"))
}

/// The received rows and counts checked against `want`.
fn check_received<C: Collective>(
    g: &ExpertGroup<'_, f32, C>,
    got: ExpertTokens<&Buffer<f32, C>, &Buffer<i32, C>>,
    want: &[Vec<f32>],
    st: &C::Stream,
) -> Result<()> {
    let (c, cfg) = (g.comm(), g.config());
    let (out, counts) = (got.tokens, got.counts);
    let (r, w, h) = (c.rank(), c.world_size(), cfg.hidden);
    let (got, n) = (out.copy_to_host(st)?, counts.copy_to_host(st)?);
    for (l, rows) in want.iter().enumerate() {
        let from = l * w * cfg.max_tokens * h;
        if n[l] as usize * h != rows.len() || got[from..from + rows.len()] != rows[..] {
            return Err(wrong(
                r,
                format!(
                    "local expert {l}: {} tokens {:?}, {} with {:?} were due",
                    n[l],
                    &got[from..from + rows.len().min(3 * h)],
                    rows.len() / h,
                    &rows[..rows.len().min(3 * h)]
                ),
            ));
        }
    }
    Ok(())
}

/// `rounds` eager rounds (an expert that scales by `e + 1`), then `replays` replays of a
/// graph of dispatch and combine (identity experts) with a new routing before each. What
/// each rank saw: `true`, `false` where the backend lacks expert parallelism.
pub fn expert_dispatch_combine<C: Collective>(
    comms: &[Comm<C>],
    cfg: ExpertConfig,
    rounds: usize,
    replays: usize,
) -> Result<Vec<bool>> {
    let mask = RankMask::none(comms.first().map_or(0, |c| c.world_size()));
    expert_dispatch_combine_masked(comms, cfg, mask, rounds, replays)
}

/// [`expert_dispatch_combine`] over the survivors of a layout with masked ranks (`comms`:
/// the layout's unmasked ranks, in order): every routing names every expert, the masked
/// ranks' among them, which receive nothing and contribute nothing.
pub fn expert_dispatch_combine_masked<C: Collective>(
    comms: &[Comm<C>],
    cfg: ExpertConfig,
    mask: RankMask,
    rounds: usize,
    replays: usize,
) -> Result<Vec<bool>> {
    each_rank(comms, |c| -> Result<bool> {
        let st = c.create_stream()?;
        let g = match c.expert_group_masked::<f32>(cfg, mask, None) {
            Err(Error::Unsupported { .. }) => return Ok(false),
            other => other?,
        };
        if !eager(c, &g, rounds, &st)? {
            return Ok(false);
        }
        replayed(&g, rounds..rounds + replays, &st)?;
        st.synchronize()?;
        Ok(true)
    })
}

fn eager<C: Collective>(
    c: &Comm<C>,
    g: &ExpertGroup<'_, f32, C>,
    rounds: usize,
    st: &C::Stream,
) -> Result<bool> {
    let (r, w, cfg) = (c.rank(), c.world_size(), g.config());
    let local = g.local_experts();
    let mut out = c.alloc::<f32>(g.received_len())?;
    let mut counts = c.alloc::<i32>(local)?;
    let mut exact = 0;
    for k in 0..rounds {
        let all: Vec<Routing> = (0..w).map(|p| routing(&cfg, k, p, None)).collect();
        let mine = &all[r];
        let tokens = c.upload(&mine.tokens, st)?;
        let ids = c.upload(&mine.ids, st)?;
        let want = received(&cfg, g.mask(), &all, r);
        let sent = g.dispatch(
            &tokens,
            &ids,
            ExpertTokens {
                tokens: &mut out,
                counts: &mut counts,
            },
            st,
        );
        match (sent.and_then(|()| st.synchronize()), want) {
            (Err(Error::Unsupported { .. }), _) => return Ok(false),
            (
                Err(Error::InvalidArgument {
                    argument: "max_tokens",
                    ..
                }),
                None,
            ) => continue,
            (Ok(()), Some(want)) => {
                let got = ExpertTokens {
                    tokens: &out,
                    counts: &counts,
                };
                check_received(g, got, &want, st)?
            }
            (got, want) => {
                return Err(wrong(
                    r,
                    format!(
                        "round {k}: {got:?} where an overflow was {}",
                        want.is_none()
                    ),
                ))
            }
        }
        // The experts: expert `e` multiplies its tokens by `e + 1`.
        let mut scaled = out.copy_to_host(st)?;
        let rows = cfg.max_tokens * w * cfg.hidden;
        for (i, x) in scaled.iter_mut().enumerate() {
            *x *= (g.mask().layout_rank(r) * local + i / rows + 1) as f32;
        }
        let expert_out = c.upload(&scaled, st)?;
        let weights = c.upload(&mine.weights, st)?;
        let mut back = c.alloc::<f32>(mine.n * cfg.hidden)?;
        g.combine(&expert_out, &ids, &weights, &mut back, st)?;
        let want = combined(&cfg, g.mask(), mine, |e| (e + 1) as f32);
        if back.copy_to_host(st)? != want {
            return Err(wrong(r, format!("round {k}: the combine differs")));
        }
        exact += 1;
    }
    // The overflow path is every rank's refusal; the data path must have run too.
    if exact * 2 < rounds {
        return Err(wrong(
            r,
            format!("only {exact} of {rounds} rounds fit max_tokens"),
        ));
    }
    Ok(true)
}

/// A graph's buffers: a routing's operands and what its dispatch and combine write.
pub(crate) struct StepBuffers<T: Element, C: Collective> {
    tokens: Buffer<T, C>,
    ids: Buffer<i32, C>,
    weights: Buffer<f32, C>,
    out: Buffer<T, C>,
    counts: Buffer<i32, C>,
    /// The combine's output.
    pub(crate) back: Buffer<T, C>,
}

impl<T: Element, C: Collective> StepBuffers<T, C> {
    /// Buffers for `g` of `first`'s count, holding `first` (its tokens as `tokens`).
    pub(crate) fn new(
        g: &ExpertGroup<'_, T, C>,
        first: &Routing,
        tokens: &[T],
        st: &C::Stream,
    ) -> Result<Self> {
        let c = g.comm();
        Ok(StepBuffers {
            tokens: c.upload(tokens, st)?,
            ids: c.upload(&first.ids, st)?,
            weights: c.upload(&first.weights, st)?,
            out: c.alloc::<T>(g.received_len())?,
            counts: c.alloc::<i32>(g.counts_len())?,
            back: c.alloc::<T>(first.n * g.config().hidden)?,
        })
    }

    /// A graph of a dispatch and a combine on `g` (the dispatch's output as the experts'
    /// output).
    pub(crate) fn capture<'a>(
        &'a self,
        g: &'a ExpertGroup<'_, T, C>,
        st: &'a C::Stream,
    ) -> Result<Graph<'a, C>> {
        Graph::capture(st, |s| {
            s.expert_dispatch(g, &self.tokens, &self.ids, self.received())?;
            s.expert_combine(g, &self.out, &self.ids, &self.weights, &self.back)
        })
    }

    /// `rt` (its tokens as `tokens`, of the first's count) for the next launch.
    pub(crate) fn write(&self, rt: &Routing, tokens: &[T], st: &C::Stream) -> Result<()> {
        self.tokens.write_from_host(tokens, st)?;
        self.ids.write_from_host(&rt.ids, st)?;
        self.weights.write_from_host(&rt.weights, st)
    }

    /// The dispatch's output and counts.
    pub(crate) fn received(&self) -> ExpertTokens<&Buffer<T, C>, &Buffer<i32, C>> {
        ExpertTokens {
            tokens: &self.out,
            counts: &self.counts,
        }
    }
}

/// A graph of dispatch and combine (the dispatch's output as the experts' output),
/// replayed with a new routing and new tokens of the same count before each.
fn replayed<C: Collective>(
    g: &ExpertGroup<'_, f32, C>,
    rounds: std::ops::Range<usize>,
    st: &C::Stream,
) -> Result<()> {
    let (c, from) = (g.comm(), rounds.start);
    let (r, w, cfg) = (c.rank(), c.world_size(), g.config());
    let n = |p: usize| (p * 3 + 1) % (cfg.max_tokens / 2 + 1);
    let first = routing(&cfg, from, r, Some(n(r)));
    let b = StepBuffers::new(g, &first, &first.tokens, st)?;
    let graph = b.capture(g, st)?;
    for k in rounds {
        let all: Vec<Routing> = (0..w).map(|p| routing(&cfg, k, p, Some(n(p)))).collect();
        let Some(want) = received(&cfg, g.mask(), &all, r) else {
            continue;
        };
        let mine = &all[r];
        b.write(mine, &mine.tokens, st)?;
        graph.launch(st)?;
        check_received(g, b.received(), &want, st)?;
        if b.back.copy_to_host(st)? != combined(&cfg, g.mask(), mine, |_| 1.0) {
            return Err(wrong(r, format!("replay {k}: the combine differs")));
        }
    }
    Ok(())
}
