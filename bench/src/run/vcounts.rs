//! The per-peer counts of the all_to_all_v workloads: a skewed pattern for the size sweep,
//! and for the `moe` preset the counts of a top-k routing of each rank's tokens.

use crate::{MoeShape, Work};

/// Every rank's counts to every peer, in elements, and each rank's layouts.
#[derive(Debug)]
pub(crate) struct A2av {
    w: usize,
    /// `m[r * w + p]`: elements rank `r` sends peer `p`.
    m: Vec<usize>,
}

/// splitmix64: a deterministic draw, the same on every rank.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Tokens rank `r` sends each rank under `moe`'s routing: each token draws `top_k` distinct
/// experts, expert `floor(E * u^2)` for a uniform `u` (low experts popular, as real
/// routers' loads are skewed), and goes once to each rank holding one of them.
fn routed(moe: &MoeShape, r: usize, w: usize) -> Vec<usize> {
    let per_rank = (moe.experts / w).max(1);
    let mut to = vec![0usize; w];
    for t in 0..moe.tokens {
        let mut chosen: Vec<usize> = Vec::with_capacity(moe.top_k);
        let mut k = 0u64;
        while chosen.len() < moe.top_k.min(moe.experts) {
            let h = mix(((r as u64) << 40) ^ ((t as u64) << 8) ^ k);
            k += 1;
            let u = (h >> 11) as f64 / (1u64 << 53) as f64;
            let e = ((moe.experts as f64) * u * u) as usize;
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        let mut dest: Vec<usize> = chosen.iter().map(|e| (e / per_rank).min(w - 1)).collect();
        dest.sort_unstable();
        dest.dedup();
        for p in dest {
            to[p] += 1;
        }
    }
    to
}

impl A2av {
    /// The counts of `work` for `w` ranks with `n` elements per peer on average.
    pub(crate) fn new(work: &Work, n: usize, w: usize) -> Self {
        let mut m = vec![0usize; w * w];
        for r in 0..w {
            match &work.moe {
                Some(moe) => {
                    for (p, tok) in routed(moe, r, w).into_iter().enumerate() {
                        m[r * w + p] = tok * moe.hidden;
                    }
                }
                // Between n/4 and 7n/4 per pair, no pair empty, every rank's total about n*w.
                None => {
                    for p in 0..w {
                        m[r * w + p] = n * (1 + (3 * r + 5 * p) % 7) / 4;
                    }
                }
            }
        }
        A2av { w, m }
    }

    /// What rank `r` sends each peer.
    pub(crate) fn send(&self, r: usize) -> Vec<usize> {
        self.m[r * self.w..(r + 1) * self.w].to_vec()
    }

    /// What rank `r` receives from each peer.
    pub(crate) fn recv(&self, r: usize) -> Vec<usize> {
        (0..self.w).map(|p| self.m[p * self.w + r]).collect()
    }

    /// The most elements a rank sends or receives.
    pub(crate) fn cap(&self) -> usize {
        (0..self.w)
            .map(|r| {
                self.send(r)
                    .iter()
                    .sum::<usize>()
                    .max(self.recv(r).iter().sum())
            })
            .max()
            .unwrap_or(0)
    }
}

/// The mean elements a rank sends each peer under `moe` (nccl-tests' size is per rank).
pub(crate) fn moe_mean_elems(moe: &MoeShape, w: usize) -> usize {
    let total: usize = (0..w)
        .map(|r| routed(moe, r, w).iter().sum::<usize>())
        .sum();
    (total * moe.hidden / (w * w)).max(1)
}
