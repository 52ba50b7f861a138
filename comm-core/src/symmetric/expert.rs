//! Expert parallelism's dispatch and combine as a backend receives them: the group's three
//! symmetric allocations (the receive slots, their metadata and counts, the combine's
//! landing rows), its fixed capacities, and the operands of one call.
//!
//! The layout every backend keeps, per rank, `L = experts / world` local experts, `W` ranks,
//! `M = max_tokens`, `K = top_k`, `H = hidden`:
//! - `recv`: `[L][W][M][H]` elements, slot `(l, s)` the tokens source `s` sent local expert
//!   `l`, in the source's `(token, k)` order;
//! - `meta`: `L * W` counts (slot `(l, s)`'s, written by `s`), then `[L][W][M]` origins
//!   (`token * K + k` at the source) of the slots' tokens;
//! - `back`: `[M][K][H]` elements, row `t * K + k` the output of token `t`'s `k`-th expert,
//!   written by the expert's rank at combine.

use crate::op::Slice;
use crate::registry::RawHandle;
use crate::{DataType, Error, Result};

use super::signature::{Signature, SignedOp};

/// Which code runs an expert group's dispatch and combine (the same on every rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ExpertEngine {
    /// unicomm's own kernels over its symmetric memory (the mock's; NCCL's on sm90 or
    /// newer), with the layout above.
    #[default]
    Kernels,
    /// The backend's expert-parallel library (on NCCL: NVIDIA's NCCL EP, its low-latency
    /// algorithm and expert-major layout, loaded at run time beside the NCCL the
    /// communicator runs on; bf16 tokens, no rank mask, no FP8 dispatch). Its dispatch
    /// orders each expert's tokens as its kernels receive them (not in source-rank order);
    /// the counts, each expert's tokens as a set and the combine are unicomm's kernels'.
    Library,
}

impl ExpertEngine {
    /// The engine's name, as errors and the flight recorder give it.
    pub fn name(self) -> &'static str {
        match self {
            ExpertEngine::Kernels => "unicomm's kernels",
            ExpertEngine::Library => "the backend's expert library",
        }
    }
}

/// How a group lays out what a dispatch receives (the same on every rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ExpertMode {
    /// Decode's: a slot range of `max_tokens` per local expert and source rank
    /// (`[L][W * M][H]` out, each expert's rows from 0), written as they are routed.
    #[default]
    LowLatency,
    /// Prefill's: at most `max_recv` token copies a rank, packed expert-major
    /// (`[max_recv][H]` out; the counts buffer holds each local expert's count, then its
    /// first row), the ranks' counts exchanged before the rows move.
    HighThroughput {
        /// The most token copies one rank receives in one dispatch.
        max_recv: usize,
    },
}

/// How an expert group is made, beside its capacities: who runs it, its layout, the
/// survivors' mask, the FP8 dispatch's scales. `Default`: unicomm's kernels, low latency,
/// no mask, no FP8.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExpertOptions {
    /// Who runs the dispatch and combine.
    pub engine: ExpertEngine,
    /// The received tokens' layout.
    pub mode: ExpertMode,
    /// The layout's masked ranks (the group over a shrink's survivors), or none.
    pub mask: Option<RankMask>,
    /// The f32 scales a token of an FP8 dispatch, where the group dispatches FP8.
    pub fp8_scales: Option<usize>,
}

/// An expert-parallel group's fixed capacities, the same on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertConfig {
    /// Experts in all (a multiple of the world size: each rank holds `experts / world`).
    pub experts: usize,
    /// The most tokens a rank dispatches in one call, and the most one local expert
    /// receives from one rank.
    pub max_tokens: usize,
    /// Elements of a token.
    pub hidden: usize,
    /// Experts per token.
    pub top_k: usize,
}

impl ExpertConfig {
    /// The local experts of each rank in a world of `w`, or why the configuration cannot
    /// serve it.
    pub fn local_experts(&self, w: usize) -> Result<usize> {
        let bad = |why: String| Err(Error::invalid("expert config", why));
        if w == 0 || self.experts == 0 || !self.experts.is_multiple_of(w) {
            return bad(format!("{} experts over {w} ranks", self.experts));
        }
        if self.max_tokens == 0 || self.hidden == 0 || self.top_k == 0 {
            return bad(format!("{self:?}: every capacity must be at least 1"));
        }
        Ok(self.experts / w)
    }
}

/// The ranks of an expert layout whose experts are gone (a rank that died, NCCL EP's and
/// DeepEP's rank mask): a group over the survivors keeps the layout's `world`, and a token
/// routed to a masked rank's expert is not sent and contributes nothing at combine. The
/// group's rank `i` is the layout's `i`-th unmasked rank. Every surviving rank passes the
/// same mask (a call where they differ is `Mismatch` on every rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankMask {
    world: usize,
    masked: u64,
}

impl RankMask {
    /// The most ranks a layout with a mask has.
    pub const MAX_WORLD: usize = 62;

    /// No rank masked in a layout of `world` ranks.
    pub fn none(world: usize) -> Self {
        RankMask { world, masked: 0 }
    }

    /// `masked` ranks of a layout of `world` (at most [`MAX_WORLD`](Self::MAX_WORLD)), at
    /// least one rank left.
    pub fn new(world: usize, masked: &[usize]) -> Result<Self> {
        let bad = |why: String| Err(Error::invalid("mask", why));
        if world == 0 || world > Self::MAX_WORLD {
            return bad(format!(
                "a layout of {world} ranks (1 to {})",
                Self::MAX_WORLD
            ));
        }
        let mut bits = 0u64;
        for &r in masked {
            if r >= world {
                return bad(format!("rank {r} masked in a layout of {world} ranks"));
            }
            bits |= 1 << r;
        }
        if bits.count_ones() as usize == world {
            return bad(format!("every rank of {world} masked"));
        }
        Ok(RankMask {
            world,
            masked: bits,
        })
    }

    /// Ranks of the layout.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The masked ranks, in order.
    pub fn masked(&self) -> Vec<usize> {
        (0..self.world).filter(|&r| self.is_masked(r)).collect()
    }

    /// Whether the layout's rank `r` is masked.
    pub fn is_masked(&self, r: usize) -> bool {
        r < 64 && self.masked >> r & 1 == 1
    }

    /// Ranks left: the group's world.
    pub fn survivors(&self) -> usize {
        self.world - self.masked.count_ones() as usize
    }

    /// The group's rank of the layout's rank `r` (`None` where masked or outside the
    /// layout).
    pub fn group_rank(&self, r: usize) -> Option<usize> {
        if r >= self.world || self.is_masked(r) {
            return None;
        }
        // Every mask bit is below rank 64 ([`MAX_WORLD`](Self::MAX_WORLD)); a layout
        // without one may be larger.
        let below = self.masked & 1u64.checked_shl(r as u32).map_or(u64::MAX, |b| b - 1);
        Some(r - below.count_ones() as usize)
    }

    /// The layout's rank of the group's rank `i`.
    pub fn layout_rank(&self, i: usize) -> usize {
        (0..self.world)
            .filter(|&r| !self.is_masked(r))
            .nth(i)
            .unwrap_or(self.world)
    }

    /// The mask as bits (rank `r` at bit `r`).
    pub fn bits(&self) -> u64 {
        self.masked
    }

    /// `InvalidArgument` unless its survivors are a communicator of `world` ranks (the one
    /// a group over them is made on).
    pub fn fits(&self, world: usize) -> Result<()> {
        if self.survivors() == world {
            return Ok(());
        }
        Err(Error::invalid(
            "mask",
            format!(
                "{} ranks left of a layout of {} ({:?} masked), on a communicator of {world}",
                self.survivors(),
                self.world,
                self.masked()
            ),
        ))
    }
}

/// The group as one call's operands name it.
#[derive(Debug, Clone, Copy)]
pub struct ExpertGroupParts {
    /// The receive slots (`[L][W][M][H]`).
    pub recv: RawHandle,
    /// The counts and origins (`L * W + L * W * M` i64).
    pub meta: RawHandle,
    /// The combine's landing rows (`[M][K][H]`).
    pub back: RawHandle,
    /// The capacities.
    pub config: ExpertConfig,
    /// The layout's masked ranks.
    pub mask: RankMask,
    /// The tokens' element type.
    pub dtype: DataType,
    /// Which code runs it; for [`ExpertEngine::Library`], `recv` is the backend's handle
    /// of the library's group and `meta` and `back` are unused.
    pub engine: ExpertEngine,
    /// The received tokens' layout: for [`ExpertMode::HighThroughput`], `recv` is
    /// `[max_recv][H]` and `meta` the `L * W` counts then `max_recv` origins.
    pub mode: ExpertMode,
}

/// A dispatch: each of this rank's `tokens` (`[n][H]`) sent once per entry of its row of
/// `ids` (`[n][K]` i32, `-1` for none) to the rank holding that expert; each local
/// expert's tokens received, expert-major, into `out` (`[L][W * M][H]`), their number
/// into `counts` (`[L]` i32).
#[derive(Debug)]
pub struct Dispatch<'a, M> {
    /// The group.
    pub group: ExpertGroupParts,
    /// Tokens of this rank (`n`).
    pub n: usize,
    /// `[n][H]`.
    pub tokens: Slice<'a, M>,
    /// `[n][K]` i32.
    pub ids: Slice<'a, M>,
    /// `[L][W * M][H]`.
    pub out: Slice<'a, M>,
    /// `[L]` i32.
    pub counts: Slice<'a, M>,
    /// Tokens of FP8 (e4m3) with their scales forwarded, or `None` (tokens of the group's
    /// type).
    pub fp8: Option<Fp8Tokens<'a, M>>,
}

/// A dispatch's tokens as FP8 (OCP e4m3, a byte an element) with `per_token` f32 scales a
/// token (DeepEP's per-128-channel scales, or one), forwarded with their token into the
/// group's scale slots (`[L][W][M][per_token]`) and compacted into `out_scales`
/// (`[L][W * M][per_token]`) as the tokens are.
#[derive(Debug)]
pub struct Fp8Tokens<'a, M> {
    /// The group's scale slots.
    pub slots: RawHandle,
    /// Scales a token.
    pub per_token: usize,
    /// `[n][per_token]` f32.
    pub scales: Slice<'a, M>,
    /// `[L][W * M][per_token]` f32.
    pub out_scales: Slice<'a, M>,
}

/// A combine: the experts' outputs in the last dispatch's layout (`[L][W * M][H]`) sent
/// back to their tokens' ranks, and each token's outputs summed by its `weights` (`[n][K]`
/// f32, in `k` order, in f32, rounded once) into `out` (`[n][H]`); an entry of `ids` that
/// is `-1` contributes nothing.
#[derive(Debug)]
pub struct Combine<'a, M> {
    /// The group.
    pub group: ExpertGroupParts,
    /// Tokens of this rank (`n`).
    pub n: usize,
    /// `[L][W * M][H]`.
    pub expert_out: Slice<'a, M>,
    /// `[n][K]` i32: the dispatch's.
    pub ids: Slice<'a, M>,
    /// `[n][K]` f32.
    pub weights: Slice<'a, M>,
    /// `[n][H]`.
    pub out: Slice<'a, M>,
}

macro_rules! copy_op {
    ($($t:ident),*) => {$(
        impl<M> Clone for $t<'_, M> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<M> Copy for $t<'_, M> {}
    )*};
}
copy_op!(Dispatch, Combine, Fp8Tokens);

/// What every rank's dispatch or combine must agree on: the operation, the tokens' type
/// and the layout's masked ranks (the capacities were compared when the group was made).
pub(crate) fn signature(op: SignedOp, g: &ExpertGroupParts, fp8: bool) -> Signature {
    Signature {
        op,
        dtype: Some(if fp8 { DataType::F8E4M3 } else { g.dtype }),
        reduce: None,
        count: g.config.hidden,
        norm: None,
        masked: g.mask.bits(),
    }
}

impl<'a, M> Dispatch<'a, M> {
    /// The same operands over another memory type.
    pub fn map_mem<N>(self, f: impl Fn(&'a M) -> Option<&'a N>) -> Result<Dispatch<'a, N>> {
        Ok(Dispatch {
            group: self.group,
            n: self.n,
            tokens: self.tokens.map_mem(&f, "tokens")?,
            ids: self.ids.map_mem(&f, "ids")?,
            out: self.out.map_mem(&f, "out")?,
            counts: self.counts.map_mem(&f, "counts")?,
            fp8: match self.fp8 {
                None => None,
                Some(q) => Some(Fp8Tokens {
                    slots: q.slots,
                    per_token: q.per_token,
                    scales: q.scales.map_mem(&f, "scales")?,
                    out_scales: q.out_scales.map_mem(&f, "out_scales")?,
                }),
            },
        })
    }
}

impl<'a, M> Combine<'a, M> {
    /// The same operands over another memory type.
    pub fn map_mem<N>(self, f: impl Fn(&'a M) -> Option<&'a N>) -> Result<Combine<'a, N>> {
        Ok(Combine {
            group: self.group,
            n: self.n,
            expert_out: self.expert_out.map_mem(&f, "expert_out")?,
            ids: self.ids.map_mem(&f, "ids")?,
            weights: self.weights.map_mem(&f, "weights")?,
            out: self.out.map_mem(&f, "out")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::RankMask;

    /// The group's ranks are the layout's unmasked ones in order, both ways.
    #[test]
    fn a_masks_group_ranks_are_the_layouts_unmasked_ones_in_order() {
        let m = RankMask::new(6, &[1, 4]).unwrap();
        assert_eq!((m.world(), m.survivors(), m.masked()), (6, 4, vec![1, 4]));
        let layout: Vec<usize> = (0..4).map(|i| m.layout_rank(i)).collect();
        assert_eq!(layout, [0, 2, 3, 5]);
        let group: Vec<Option<usize>> = (0..7).map(|r| m.group_rank(r)).collect();
        assert_eq!(
            group,
            [Some(0), None, Some(1), Some(2), None, Some(3), None]
        );
        // A layout past 64 ranks without a mask (no shift past the word).
        let big = RankMask::none(100);
        assert_eq!((big.group_rank(99), big.layout_rank(99)), (Some(99), 99));
    }

    /// A rank outside the layout, a layout past the bits, or every rank masked: refused.
    #[test]
    fn masks_that_leave_no_layout_are_refused() {
        assert!(RankMask::new(3, &[3]).is_err());
        assert!(RankMask::new(RankMask::MAX_WORLD + 1, &[]).is_err());
        assert!(RankMask::new(2, &[0, 1]).is_err());
        assert!(RankMask::new(0, &[]).is_err());
    }
}
