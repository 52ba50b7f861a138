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
    /// The tokens' element type.
    pub dtype: DataType,
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

/// What every rank's dispatch or combine must agree on: the operation and the tokens'
/// type (the capacities were compared when the group was made).
pub(crate) fn signature(op: SignedOp, g: &ExpertGroupParts, fp8: bool) -> Signature {
    Signature {
        op,
        dtype: Some(if fp8 { DataType::F8E4M3 } else { g.dtype }),
        reduce: None,
        count: g.config.hidden,
        norm: None,
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
