//! Expert parallelism's FP8 dispatch, the same on every backend that runs it: each token's
//! e4m3 bytes and its f32 scales arrive together, expert-major, in source-rank order, every
//! byte and scale bit-exact, at routings drawn per rank and round (`-1` entries included);
//! eagerly, then over a graph's replays with new tokens, scales and routing before each.
//! Where the backend lacks it: `Unsupported`.

use unicomm_core::graph::Graph;
use unicomm_core::{each_rank, Buffer, Collective, Comm, Error, ExpertConfig, ExpertGroup};
use unicomm_core::{ExpertMode, ExpertOptions, ExpertTokens, Result, F8E4M3};

/// One rank's routing, its tokens' bytes and their scales.
type Routing = (Vec<i32>, Vec<u8>, Vec<f32>);

/// Rank `p`'s routing in round `k`, of `n` tokens (or a count of its own drawn).
fn routing(cfg: &ExpertConfig, per: usize, k: usize, p: usize, n: Option<usize>) -> Routing {
    let n = n.unwrap_or((p * 5 + k * 3) % (cfg.max_tokens / cfg.top_k.max(1) + 1));
    let ids = (0..n * cfg.top_k)
        .map(|i| match (i * 7 + p * 3 + k) % 9 {
            0 => -1,
            r => ((r + i / cfg.top_k * 5 + p) % cfg.experts) as i32,
        })
        .collect();
    let bytes = (0..n * cfg.hidden)
        .map(|i| (i * 37 + p * 11 + k * 5) as u8)
        .collect();
    let scales = (0..n * per)
        .map(|i| (i + 1) as f32 * 0.5 + p as f32 * 100.0 + k as f32)
        .collect();
    (ids, bytes, scales)
}

/// The dispatch's buffers on one rank.
struct Out<C: Collective> {
    tokens: Buffer<F8E4M3, C>,
    scales: Buffer<f32, C>,
    counts: Buffer<i32, C>,
}

/// What rank `r` received (bytes, scales, counts) checked against every rank's routing.
fn check<C: Collective>(
    g: &ExpertGroup<'_, f32, C>,
    out: &Out<C>,
    all: &[Routing],
    per: usize,
    k: usize,
    st: &C::Stream,
) -> Result<()> {
    let (c, cfg) = (g.comm(), g.config());
    let (r, w) = (c.rank(), c.world_size());
    let got = out.tokens.copy_to_host(st)?;
    let (got_s, n) = (out.scales.copy_to_host(st)?, out.counts.copy_to_host(st)?);
    let local = g.local_experts();
    for (l, &got_n) in n.iter().enumerate().take(local) {
        let e = (r * g.local_experts() + l) as i32;
        let (mut want, mut want_s) = (Vec::new(), Vec::new());
        for (p_ids, p_bytes, p_scales) in all {
            for (i, _) in p_ids.iter().enumerate().filter(|(_, &x)| x == e) {
                let t = i / cfg.top_k;
                want.extend_from_slice(&p_bytes[t * cfg.hidden..(t + 1) * cfg.hidden]);
                want_s.extend_from_slice(&p_scales[t * per..(t + 1) * per]);
            }
        }
        // Expert l's first row: its share of the slots, or where the packed counts put it.
        let slots = match g.mode() {
            ExpertMode::LowLatency => l * w * cfg.max_tokens,
            _ => n[local + l] as usize,
        };
        let (at, at_s) = (slots * cfg.hidden, slots * per);
        let bytes: Vec<u8> = got[at..at + want.len()]
            .iter()
            .map(|x| x.to_bits())
            .collect();
        if got_n as usize * cfg.hidden != want.len()
            || bytes != want
            || got_s[at_s..at_s + want_s.len()] != want_s[..]
        {
            return Err(Error::invalid(
                "expert fp8",
                format!(
                    "rank {r}, round {k}, local expert {l}: {got_n} tokens received, {} due, or their bytes or scales differ",
                    want.len() / cfg.hidden
                ),
            ));
        }
    }
    Ok(())
}

fn tokens_of(bytes: &[u8]) -> Vec<F8E4M3> {
    bytes.iter().map(|&b| F8E4M3::from_bits(b)).collect()
}

/// `rounds` FP8 dispatches on a group of `per` scales a token, then `replays` replays of
/// one captured dispatch with new data before each; each rank's received bytes, scales and
/// counts checked. What each rank saw: `true`, `false` without the kernels.
pub fn expert_dispatch_fp8<C: Collective>(
    comms: &[Comm<C>],
    cfg: ExpertConfig,
    per: usize,
    rounds: usize,
    replays: usize,
) -> Result<Vec<bool>> {
    expert_dispatch_fp8_in(comms, cfg, per, ExpertMode::LowLatency, rounds, replays)
}

/// [`expert_dispatch_fp8`] on a group of `mode` (the high-throughput one's `max_recv` must
/// hold every routing here: `(max_tokens + top_k) x world` does).
pub fn expert_dispatch_fp8_in<C: Collective>(
    comms: &[Comm<C>],
    cfg: ExpertConfig,
    per: usize,
    mode: ExpertMode,
    rounds: usize,
    replays: usize,
) -> Result<Vec<bool>> {
    each_rank(comms, |c| -> Result<bool> {
        let (r, w, st) = (c.rank(), c.world_size(), c.create_stream()?);
        let options = ExpertOptions {
            mode,
            fp8_scales: Some(per),
            ..ExpertOptions::default()
        };
        let g = match c.expert_group_with::<f32>(cfg, options) {
            Err(Error::Unsupported { .. }) => return Ok(false),
            other => other?,
        };
        let mut out = Out {
            tokens: c.alloc::<F8E4M3>(g.received_len())?,
            scales: c.alloc::<f32>(g.received_scales_len())?,
            counts: c.alloc::<i32>(g.counts_len())?,
        };
        for k in 0..rounds {
            let all: Vec<Routing> = (0..w).map(|p| routing(&cfg, per, k, p, None)).collect();
            let (ids, bytes, scales) = &all[r];
            let tokens = c.upload(&tokens_of(bytes), &st)?;
            let (scales_d, ids_d) = (c.upload(scales, &st)?, c.upload(ids, &st)?);
            let o = ExpertTokens {
                tokens: &mut out.tokens,
                counts: &mut out.counts,
            };
            match g.dispatch_fp8(&tokens, &scales_d, &ids_d, o, &mut out.scales, &st) {
                Err(Error::Unsupported { .. }) => return Ok(false),
                other => other?,
            }
            check(&g, &out, &all, per, k, &st)?;
        }
        // A graph of one dispatch, replayed with new tokens, scales and routing of the same
        // count before each.
        let n = |p: usize| 1 + p % 3;
        let first = routing(&cfg, per, rounds, r, Some(n(r)));
        let tokens = c.upload(&tokens_of(&first.1), &st)?;
        let (scales_d, ids_d) = (c.upload(&first.2, &st)?, c.upload(&first.0, &st)?);
        let graph = Graph::capture(&st, |s| {
            let o = ExpertTokens {
                tokens: &out.tokens,
                counts: &out.counts,
            };
            s.expert_dispatch_fp8(&g, &tokens, &scales_d, &ids_d, o, &out.scales)
        })?;
        for k in rounds..rounds + replays {
            let all: Vec<Routing> = (0..w)
                .map(|p| routing(&cfg, per, k, p, Some(n(p))))
                .collect();
            let (ids, bytes, scales) = &all[r];
            tokens.write_from_host(&tokens_of(bytes), &st)?;
            scales_d.write_from_host(scales, &st)?;
            ids_d.write_from_host(ids, &st)?;
            graph.launch(&st)?;
            check(&g, &out, &all, per, k, &st)?;
        }
        Ok(true)
    })
}
