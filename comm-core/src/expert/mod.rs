//! Expert parallelism: an [`ExpertGroup`] made collectively from a communicator with fixed
//! capacities ([`ExpertConfig`]), and its dispatch (each token to the ranks holding its
//! top-k experts, received expert-major with per-expert counts on the device) and combine
//! (the experts' outputs back to their tokens, summed by the routing's weights). The counts
//! are the device's: nothing waits for the host, and a graph's replays follow a new routing.
//! Checked here (the capacities, every buffer's size, this rank's memory) before anything
//! is enqueued; a capacity a routing exceeds on the device is `InvalidArgument` on every
//! rank alike, never a token dropped.

use crate::backend::Collective;
use crate::buffer::{DeviceSlice, DeviceSliceMut, View};
use crate::comm::Comm;
use crate::element::Element;
use crate::fp8::F8E4M3;
use crate::registry::RawHandle;
use crate::symmetric::{
    Combine, Dispatch, ExpertConfig, ExpertEngine, ExpertGroupParts, ExpertMode, Fp8Tokens,
    RankMask, SymmetricOp,
};

mod make;
use crate::{Error, Result, Symmetric};

/// Where a dispatch writes: each local expert's tokens (`[local][world * max_tokens]
/// [hidden]`, expert-major, in source-rank order) and how many each received (`[local]`
/// i32). An eager call takes them as `&mut`, a graph's step as `&`.
#[derive(Debug)]
pub struct ExpertTokens<O, N> {
    /// The received tokens.
    pub tokens: O,
    /// Per local expert, how many.
    pub counts: N,
}

impl<'s, O, N> ExpertTokens<&'s mut O, &'s mut N> {
    /// An eager dispatch's outputs as views, borrowed mutably for the call.
    fn into_views<U: Element, C: Collective>(self) -> ExpertTokens<View<'s, U, C>, View<'s, i32, C>>
    where
        O: DeviceSliceMut<U, C>,
        N: DeviceSliceMut<i32, C>,
    {
        ExpertTokens {
            tokens: self.tokens.view_mut().into_view(),
            counts: self.counts.view_mut().into_view(),
        }
    }
}

impl<'s, O, N> ExpertTokens<&'s O, &'s N> {
    /// A step's dispatch outputs as views (held for the graph's life).
    pub(crate) fn views<U: Element, C: Collective>(
        self,
    ) -> ExpertTokens<View<'s, U, C>, View<'s, i32, C>>
    where
        O: DeviceSliceMut<U, C>,
        N: DeviceSliceMut<i32, C>,
    {
        ExpertTokens {
            tokens: self.tokens.view(),
            counts: self.counts.view(),
        }
    }
}

/// An expert-parallel group on a communicator: `experts / world` experts on each rank, the
/// capacities fixed at creation, its memory symmetric (every rank writes its peers' slots)
/// or an expert library's. It borrows its communicator; dropping it releases its memory.
pub struct ExpertGroup<'c, T: Element, C: Collective> {
    comm: &'c Comm<C>,
    config: ExpertConfig,
    mask: RankMask,
    mode: ExpertMode,
    local: usize,
    /// Elements a dispatch writes: `local x world x max_tokens x hidden` (low latency),
    /// `max_recv x hidden` (high throughput).
    received: usize,
    memory: GroupMemory<'c, T, C>,
}

/// What a group's engine keeps.
#[expect(
    clippy::large_enum_variant,
    reason = "one per group, made once and never moved in a hot path"
)]
enum GroupMemory<'c, T: Element, C: Collective> {
    /// unicomm's kernels: the receive slots, their counts and origins, the combine's
    /// landing rows, and the FP8 dispatch's scale slots with the scales a token.
    Kernels {
        recv: Symmetric<'c, T, C>,
        meta: Symmetric<'c, i64, C>,
        back: Symmetric<'c, T, C>,
        scales: Option<(Symmetric<'c, f32, C>, usize)>,
    },
    /// An expert library's group, closed when the group is dropped.
    Library(LibraryGroup<'c, C>),
}

/// The backend's handle of an expert library's group.
struct LibraryGroup<'c, C: Collective> {
    comm: &'c Comm<C>,
    handle: RawHandle,
    engine: ExpertEngine,
}

impl<C: Collective> Drop for LibraryGroup<'_, C> {
    fn drop(&mut self) {
        let closed = self
            .comm
            .sole()
            .and_then(|c| c.close_expert_engine(self.handle));
        if let Err(e) = closed {
            tracing::warn!("{}'s expert group not released: {e}", self.engine.name());
        }
    }
}

impl<'c, T: Element, C: Collective> ExpertGroup<'c, T, C> {
    /// The capacities.
    pub fn config(&self) -> ExpertConfig {
        self.config
    }

    /// Experts on each rank (the layout's rank `r` holds experts `r * local .. (r + 1) *
    /// local`).
    pub fn local_experts(&self) -> usize {
        self.local
    }

    /// The layout's masked ranks ([`Comm::expert_group_masked`]; none for a group made by
    /// [`Comm::expert_group`]).
    pub fn mask(&self) -> RankMask {
        self.mask
    }

    /// Elements a dispatch's output holds: `local x world x max_tokens x hidden`.
    pub fn received_len(&self) -> usize {
        self.received
    }

    /// The received tokens' layout.
    pub fn mode(&self) -> ExpertMode {
        self.mode
    }

    /// i32 words of a dispatch's `counts`: each local expert's count, then (high
    /// throughput) each one's first row in the packed output.
    pub fn counts_len(&self) -> usize {
        match self.mode {
            ExpertMode::LowLatency => self.local,
            _ => 2 * self.local,
        }
    }

    /// Which code runs the group's dispatch and combine.
    pub fn engine(&self) -> ExpertEngine {
        match &self.memory {
            GroupMemory::Kernels { .. } => ExpertEngine::Kernels,
            GroupMemory::Library(l) => l.engine,
        }
    }

    /// The FP8 dispatch's scale slots and the scales a token, where the group has them.
    fn scale_slots(&self) -> Option<&(Symmetric<'c, f32, C>, usize)> {
        match &self.memory {
            GroupMemory::Kernels { scales, .. } => scales.as_ref(),
            GroupMemory::Library(_) => None,
        }
    }

    /// Sends each of this rank's `tokens` (`[n][hidden]`) once per entry of its row of
    /// `ids` (`[n][top_k]` i32, the global expert, `-1` for none; `n` at most `max_tokens`)
    /// to the rank holding that expert; receives each local expert's tokens expert-major
    /// into `out.tokens` ([`received_len`](Self::received_len) elements; expert `l`'s from
    /// `l * world * max_tokens` rows, in source-rank order, each source's in its
    /// `(token, k)` order) and their number into `out.counts` (`[local]` i32). Collective.
    pub fn dispatch(
        &self,
        tokens: &impl DeviceSlice<T, C>,
        ids: &impl DeviceSlice<i32, C>,
        out: ExpertTokens<&mut impl DeviceSliceMut<T, C>, &mut impl DeviceSliceMut<i32, C>>,
        stream: &C::Stream,
    ) -> Result<()> {
        let op = self.dispatch_op(tokens.view(), ids.view(), out.into_views(), None)?;
        self.comm.sole()?.work((&op).into(), stream)
    }

    /// [`dispatch`](Self::dispatch) of FP8 (e4m3) tokens, each with its scales
    /// (`scales`: `[n][per_token]` f32) forwarded with it: `out_scales`
    /// ([`received_scales_len`](Self::received_scales_len) f32) holds the received tokens'
    /// scales in the received tokens' order. A group made by [`Comm::expert_group_fp8`].
    /// Collective.
    pub fn dispatch_fp8(
        &self,
        tokens: &impl DeviceSlice<F8E4M3, C>,
        scales: &impl DeviceSlice<f32, C>,
        ids: &impl DeviceSlice<i32, C>,
        out: ExpertTokens<&mut impl DeviceSliceMut<F8E4M3, C>, &mut impl DeviceSliceMut<i32, C>>,
        out_scales: &mut impl DeviceSliceMut<f32, C>,
        stream: &C::Stream,
    ) -> Result<()> {
        let q = (scales.view(), out_scales.view_mut().into_view());
        let op = self.dispatch_op(tokens.view(), ids.view(), out.into_views(), Some(q))?;
        self.comm.sole()?.work((&op).into(), stream)
    }

    /// Elements of an FP8 dispatch's `out_scales`: `local x world x max_tokens x per_token`
    /// (0 for a group without scale slots).
    pub fn received_scales_len(&self) -> usize {
        self.scale_slots().map_or(0, |(s, _)| s.len())
    }

    /// Sends the experts' outputs (`expert_out`, in the last dispatch's layout) back to
    /// their tokens' ranks and writes each token's sum, weighted by `weights` (`[n][top_k]`
    /// f32) in `k` order, in f32 and rounded once, into `out` (`[n][hidden]`). `ids` is the
    /// last dispatch's routing; its `-1` entries contribute nothing. Collective.
    pub fn combine(
        &self,
        expert_out: &impl DeviceSlice<T, C>,
        ids: &impl DeviceSlice<i32, C>,
        weights: &impl DeviceSlice<f32, C>,
        out: &mut impl DeviceSliceMut<T, C>,
        stream: &C::Stream,
    ) -> Result<()> {
        let out = out.view_mut().into_view();
        let op = self.combine_op(expert_out.view(), ids.view(), weights.view(), out)?;
        self.comm.sole()?.work((&op).into(), stream)
    }

    fn parts(&self) -> ExpertGroupParts {
        let (recv, meta, back) = match &self.memory {
            GroupMemory::Kernels {
                recv, meta, back, ..
            } => (recv.handle(), meta.handle(), back.handle()),
            GroupMemory::Library(l) => (l.handle, RawHandle(0), RawHandle(0)),
        };
        ExpertGroupParts {
            recv,
            meta,
            back,
            config: self.config,
            mask: self.mask,
            dtype: T::DTYPE,
            engine: self.engine(),
            mode: self.mode,
        }
    }

    /// The tokens of a routing of `ids` (`n` rows of `top_k`, at most `max_tokens`).
    fn tokens_of(&self, ids: &View<'_, i32, C>) -> Result<usize> {
        let (k, m) = (self.config.top_k, self.config.max_tokens);
        let n = ids.len() / k;
        if !ids.len().is_multiple_of(k) || n > m {
            return Err(Error::invalid(
                "ids",
                format!(
                    "{} entries: rows of top_k {k}, at most max_tokens {m} rows",
                    ids.len()
                ),
            ));
        }
        Ok(n)
    }

    /// `v`, this rank's, cut to `len` elements (`InvalidArgument` naming `arg` if shorter).
    fn fit<'v, U: Element>(
        &self,
        v: View<'v, U, C>,
        len: usize,
        arg: &'static str,
    ) -> Result<View<'v, U, C>> {
        self.comm.check(&v)?;
        let have = v.len();
        v.slice(..len).map_err(|_| {
            Error::invalid(
                arg,
                format!("holds {have} elements, the operation needs {len}"),
            )
        })
    }

    pub(crate) fn dispatch_op<'v, U: Element>(
        &self,
        tokens: View<'v, U, C>,
        ids: View<'v, i32, C>,
        out: ExpertTokens<View<'v, U, C>, View<'v, i32, C>>,
        scales: Option<(View<'v, f32, C>, View<'v, f32, C>)>,
    ) -> Result<SymmetricOp<'v, C::Memory>> {
        let n = self.tokens_of(&ids)?;
        let h = self.config.hidden;
        let fp8 = match (scales, self.scale_slots()) {
            (None, _) => None,
            (Some((s, o)), Some((slots, per))) => Some(Fp8Tokens {
                slots: slots.handle(),
                per_token: *per,
                scales: self.fit(s, n * per, "scales")?.raw(),
                out_scales: self.fit(o, slots.len(), "out_scales")?.raw(),
            }),
            (Some(_), None) => {
                return Err(Error::invalid(
                    "scales",
                    "an FP8 dispatch on a group made without scale slots (Comm::expert_group_fp8 makes them)",
                ))
            }
        };
        Ok(SymmetricOp::Dispatch(Dispatch {
            group: self.parts(),
            n,
            tokens: self.fit(tokens, n * h, "tokens")?.raw(),
            ids: self.fit(ids, n * self.config.top_k, "ids")?.raw(),
            out: self.fit(out.tokens, self.received, "out")?.raw(),
            counts: self.fit(out.counts, self.counts_len(), "counts")?.raw(),
            fp8,
        }))
    }

    pub(crate) fn combine_op<'v>(
        &self,
        expert_out: View<'v, T, C>,
        ids: View<'v, i32, C>,
        weights: View<'v, f32, C>,
        out: View<'v, T, C>,
    ) -> Result<SymmetricOp<'v, C::Memory>> {
        let n = self.tokens_of(&ids)?;
        let (h, k) = (self.config.hidden, self.config.top_k);
        Ok(SymmetricOp::Combine(Combine {
            group: self.parts(),
            n,
            expert_out: self.fit(expert_out, self.received, "expert_out")?.raw(),
            ids: self.fit(ids, n * k, "ids")?.raw(),
            weights: self.fit(weights, n * k, "weights")?.raw(),
            out: self.fit(out, n * h, "out")?.raw(),
        }))
    }

    /// The communicator.
    pub fn comm(&self) -> &'c Comm<C> {
        self.comm
    }
}
