//! Expert parallelism's high-throughput dispatch and combine (`ExpertMode::HighThroughput`):
//! the routings of `expert.rs`, each rank's received rows packed expert-major bit-exact
//! with each local expert's count and first row, the combine equal to the fixed-order f32
//! reference; eagerly with an expert that scales its tokens, then a graph replayed with a
//! new routing before each. A rank whose token copies would pass `max_recv` is the same
//! `InvalidArgument` on every rank, and the ranks stay in step. Where the backend lacks the
//! mode: `Unsupported`.

use unicomm_core::{
    each_rank, Buffer, Collective, Comm, DeviceStream, Error, ExpertConfig, ExpertGroup,
    ExpertMode, ExpertOptions, ExpertTokens, RankMask, Result,
};

use crate::expert::{combined, routing, rows_for, wrong, Routing, StepBuffers};

/// Rank `r`'s packed rows and its counts then first rows, or `None` where some rank's
/// copies pass `max_recv` (every rank refuses then).
fn packed(
    cfg: &ExpertConfig,
    all: &[Routing],
    r: usize,
    max_recv: usize,
) -> Option<(Vec<f32>, Vec<i32>)> {
    let none = RankMask::none(all.len());
    let each: Vec<Vec<Vec<f32>>> = (0..all.len())
        .map(|p| rows_for(cfg, none, all, p))
        .collect();
    let h = cfg.hidden;
    if each
        .iter()
        .any(|ls| ls.iter().map(|x| x.len() / h).sum::<usize>() > max_recv)
    {
        return None;
    }
    let counts: Vec<i32> = each[r].iter().map(|x| (x.len() / h) as i32).collect();
    let firsts = counts.iter().scan(0, |at, &c| {
        let f = *at;
        *at += c;
        Some(f)
    });
    let words = counts.iter().copied().chain(firsts).collect();
    Some((each[r].concat(), words))
}

/// The dispatch's packed rows and words checked against `want`.
fn check<C: Collective>(
    c: &Comm<C>,
    got: ExpertTokens<&Buffer<f32, C>, &Buffer<i32, C>>,
    want: &(Vec<f32>, Vec<i32>),
    round: &str,
    st: &C::Stream,
) -> Result<()> {
    let (rows, words) = (got.tokens.copy_to_host(st)?, got.counts.copy_to_host(st)?);
    if words != want.1 || rows[..want.0.len()] != want.0[..] {
        return Err(wrong(
            c.rank(),
            format!(
                "{round}: counts and first rows {words:?}, {:?} were due, or other rows",
                want.1
            ),
        ));
    }
    Ok(())
}

/// `rounds` eager rounds (an expert that scales by `e + 1`), then `replays` replays of a
/// graph of dispatch and combine with a new routing before each, on groups of `max_recv`
/// packed rows. What each rank saw: `true`, `false` where the backend lacks the mode.
pub fn expert_dispatch_combine_packed<C: Collective>(
    comms: &[Comm<C>],
    cfg: ExpertConfig,
    max_recv: usize,
    rounds: usize,
    replays: usize,
) -> Result<Vec<bool>> {
    each_rank(comms, |c| -> Result<bool> {
        let st = c.create_stream()?;
        let options = ExpertOptions {
            mode: ExpertMode::HighThroughput { max_recv },
            ..ExpertOptions::default()
        };
        let g = match c.expert_group_with::<f32>(cfg, options) {
            Err(Error::Unsupported { .. }) => return Ok(false),
            other => other?,
        };
        eager(&g, max_recv, rounds, &st)?;
        replayed(&g, max_recv, rounds..rounds + replays, &st)?;
        st.synchronize()?;
        Ok(true)
    })
}

fn eager<C: Collective>(
    g: &ExpertGroup<'_, f32, C>,
    max_recv: usize,
    rounds: usize,
    st: &C::Stream,
) -> Result<()> {
    let c = g.comm();
    let (r, w, cfg) = (c.rank(), c.world_size(), g.config());
    let mut out = c.alloc::<f32>(g.received_len())?;
    let mut counts = c.alloc::<i32>(g.counts_len())?;
    let mut exact = 0;
    for k in 0..rounds {
        let all: Vec<Routing> = (0..w).map(|p| routing(&cfg, k, p, None)).collect();
        let mine = &all[r];
        let (tokens, ids) = (c.upload(&mine.tokens, st)?, c.upload(&mine.ids, st)?);
        let want = packed(&cfg, &all, r, max_recv);
        let o = ExpertTokens {
            tokens: &mut out,
            counts: &mut counts,
        };
        let sent = g
            .dispatch(&tokens, &ids, o, st)
            .and_then(|()| st.synchronize());
        let want = match (sent, want) {
            (
                Err(Error::InvalidArgument {
                    argument: "max_recv",
                    ..
                }),
                None,
            ) => continue,
            (Ok(()), Some(want)) => want,
            (got, want) => {
                let due = want.is_some();
                return Err(wrong(
                    r,
                    format!("round {k}: {got:?} where a fit was {due}"),
                ));
            }
        };
        check(
            c,
            ExpertTokens {
                tokens: &out,
                counts: &counts,
            },
            &want,
            &format!("round {k}"),
            st,
        )?;
        // The experts: expert `e` multiplies its rows by `e + 1` (a packed row's expert from
        // the counts).
        let (local, h) = (g.local_experts(), cfg.hidden);
        let expert_of_row: Vec<usize> = (want.1[..local].iter().enumerate())
            .flat_map(|(l, &n)| std::iter::repeat_n(r * local + l, n as usize))
            .collect();
        let mut scaled = out.copy_to_host(st)?;
        for (i, x) in scaled.iter_mut().enumerate().take(want.0.len()) {
            *x *= (expert_of_row[i / h] + 1) as f32;
        }
        let expert_out = c.upload(&scaled, st)?;
        let weights = c.upload(&mine.weights, st)?;
        let mut back = c.alloc::<f32>(mine.n * h)?;
        g.combine(&expert_out, &ids, &weights, &mut back, st)?;
        if back.copy_to_host(st)? != combined(&cfg, RankMask::none(w), mine, |e| (e + 1) as f32) {
            return Err(wrong(r, format!("round {k}: the packed combine differs")));
        }
        exact += 1;
    }
    if exact * 2 < rounds {
        return Err(wrong(
            r,
            format!("only {exact} of {rounds} rounds fit max_recv"),
        ));
    }
    Ok(())
}

/// A graph of dispatch and combine (the dispatch's output as the experts' output),
/// replayed with a new routing of the same counts before each (rounds past `max_recv`
/// are left out: a graph's refusal would end the replay loop).
fn replayed<C: Collective>(
    g: &ExpertGroup<'_, f32, C>,
    max_recv: usize,
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
        let Some(want) = packed(&cfg, &all, r, max_recv) else {
            continue;
        };
        let mine = &all[r];
        b.write(mine, &mine.tokens, st)?;
        graph.launch(st)?;
        check(c, b.received(), &want, &format!("replay {k}"), st)?;
        if b.back.copy_to_host(st)? != combined(&cfg, RankMask::none(w), mine, |_| 1.0) {
            return Err(wrong(r, format!("replay {k}: the packed combine differs")));
        }
    }
    Ok(())
}
