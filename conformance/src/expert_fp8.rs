//! Expert parallelism's FP8 dispatch, the same on every backend that runs it: each token's
//! e4m3 bytes and its f32 scales arrive together, expert-major, in source-rank order, every
//! byte and scale bit-exact, at random routings (the plain dispatch's). Where the backend
//! lacks it: `Unsupported`.

use unicomm_core::{each_rank, Collective, Comm, Error, ExpertConfig, ExpertTokens};
use unicomm_core::{Result, F8E4M3};

/// Rank `p`'s routing in round `k` (as the plain dispatch's case draws them, `-1` entries
/// included), its tokens' bytes and their scales.
fn routing(cfg: &ExpertConfig, per: usize, k: usize, p: usize) -> (Vec<i32>, Vec<u8>, Vec<f32>) {
    let n = (p * 5 + k * 3) % (cfg.max_tokens / cfg.top_k.max(1) + 1);
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

/// `rounds` FP8 dispatches on a group of `per` scales a token, each rank's received bytes,
/// scales and counts checked. What each rank saw: `true`, `false` without the kernels.
pub fn expert_dispatch_fp8<C: Collective>(
    comms: &[Comm<C>],
    cfg: ExpertConfig,
    per: usize,
    rounds: usize,
) -> Result<Vec<bool>> {
    each_rank(comms, |c| -> Result<bool> {
        let (r, w, st) = (c.rank(), c.world_size(), c.create_stream()?);
        let g = match c.expert_group_fp8::<f32>(cfg, per) {
            Err(Error::Unsupported { .. }) => return Ok(false),
            other => other?,
        };
        let local = g.local_experts();
        let mut out = c.alloc::<F8E4M3>(g.received_len())?;
        let mut out_scales = c.alloc::<f32>(g.received_scales_len())?;
        let mut counts = c.alloc::<i32>(local)?;
        for k in 0..rounds {
            let all: Vec<_> = (0..w).map(|p| routing(&cfg, per, k, p)).collect();
            let (ids, bytes, scales) = &all[r];
            let tokens: Vec<F8E4M3> = bytes.iter().map(|&b| F8E4M3::from_bits(b)).collect();
            let (tokens, scales_d, ids_d) = (
                c.upload(&tokens, &st)?,
                c.upload(scales, &st)?,
                c.upload(ids, &st)?,
            );
            let o = ExpertTokens {
                tokens: &mut out,
                counts: &mut counts,
            };
            match g.dispatch_fp8(&tokens, &scales_d, &ids_d, o, &mut out_scales, &st) {
                Err(Error::Unsupported { .. }) => return Ok(false),
                other => other?,
            }
            let (got, got_s, n) = (
                out.copy_to_host(&st)?,
                out_scales.copy_to_host(&st)?,
                counts.copy_to_host(&st)?,
            );
            for (l, &got_n) in n.iter().enumerate().take(local) {
                let e = (r * local + l) as i32;
                let (mut want, mut want_s) = (Vec::new(), Vec::new());
                for (p_ids, p_bytes, p_scales) in &all {
                    for (i, _) in p_ids.iter().enumerate().filter(|(_, &x)| x == e) {
                        let t = i / cfg.top_k;
                        want.extend_from_slice(&p_bytes[t * cfg.hidden..(t + 1) * cfg.hidden]);
                        want_s.extend_from_slice(&p_scales[t * per..(t + 1) * per]);
                    }
                }
                let (at, at_s) = (
                    l * w * cfg.max_tokens * cfg.hidden,
                    l * w * cfg.max_tokens * per,
                );
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
                        format!("rank {r}, round {k}, local expert {l}: {got_n} tokens received, {} due, or their bytes or scales differ", want.len() / cfg.hidden),
                    ));
                }
            }
        }
        Ok(true)
    })
}
