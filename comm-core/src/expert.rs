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
    Combine, Dispatch, ExpertConfig, ExpertEngine, ExpertGroupParts, Fp8Tokens, RankMask,
    SymmetricOp,
};
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
    local: usize,
    /// Elements a dispatch writes: `local x world x max_tokens x hidden`.
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

/// The receive slots' and the landing rows' elements of `config` on `local` experts of a
/// world of `w`.
fn group_sizes(config: &ExpertConfig, local: usize, w: usize) -> Result<(usize, usize, usize)> {
    let too_big = || Error::invalid("expert config", format!("{config:?} overflows"));
    let (m, h, k) = (config.max_tokens, config.hidden, config.top_k);
    let slots = local
        .checked_mul(w)
        .and_then(|x| x.checked_mul(m))
        .ok_or_else(too_big)?;
    let recv = slots.checked_mul(h).ok_or_else(too_big)?;
    let back = m
        .checked_mul(k)
        .and_then(|x| x.checked_mul(h))
        .ok_or_else(too_big)?;
    Ok((slots, recv, back))
}

impl<C: Collective> Comm<C> {
    /// An expert-parallel group (collective and host-blocking: every rank calls it with the
    /// same configuration, in the same order; capacities whose memory differs are
    /// `Mismatch` on every rank). Tokens of f32, f16 or bf16. Its memory: `experts x
    /// max_tokens` tokens to receive, `max_tokens x top_k` to combine, their counts and
    /// origins. The mock runs it, and NCCL on an sm90 GPU or newer (unicomm's kernels);
    /// elsewhere it is `Unsupported`.
    pub fn expert_group<T: Element>(&self, config: ExpertConfig) -> Result<ExpertGroup<'_, T, C>> {
        self.expert_group_masked(config, RankMask::none(self.world_size()), None)
    }

    /// [`Comm::expert_group`] over the survivors of an expert layout whose masked ranks are
    /// gone (`mask`: this communicator is the layout's unmasked ranks, in order, as
    /// [`Comm::shrink`] leaves them): experts keep the layout's places (`experts /
    /// mask.world()` on each layout rank), and an entry of a routing that names a masked
    /// rank's expert is not sent and contributes nothing at combine, as a `-1` entry.
    /// `fp8_scales`: the scales a token of an FP8 dispatch ([`Comm::expert_group_fp8`]).
    /// Collective over the survivors, with the same mask on each.
    pub fn expert_group_masked<T: Element>(
        &self,
        config: ExpertConfig,
        mask: RankMask,
        fp8_scales: Option<usize>,
    ) -> Result<ExpertGroup<'_, T, C>> {
        let w = self.world_size();
        mask.fits(w)?;
        let local = config.local_experts(mask.world())?;
        // Combine sums in f32 and rounds to the tokens' type.
        crate::symmetric::check_symmetric_type(T::DTYPE)?;
        // Refused before any memory is made where the kernels are not there.
        let caps = self.capabilities();
        if !caps.device_counts {
            return Err(Error::unsupported(
                "expert parallelism's dispatch and combine",
                "unicomm's expert kernels (the mock's, or an NVIDIA GPU of sm90 or newer where unicomm's symmetric kernels load)",
                format!("{} {}", caps.backend, caps.version),
            ));
        }
        let (slots, received, back) = group_sizes(&config, local, w)?;
        let scales = match fp8_scales.map(|p| p.max(1)) {
            None => None,
            Some(per_token) => {
                let len = slots.checked_mul(per_token).ok_or_else(|| {
                    Error::invalid("per_token", format!("{per_token} scales overflow"))
                })?;
                Some((per_token, len))
            }
        };
        let memory = GroupMemory::Kernels {
            recv: self.alloc_symmetric::<T>(received)?,
            meta: self.alloc_symmetric::<i64>(local * w + slots)?,
            back: self.alloc_symmetric::<T>(back)?,
            scales: match scales {
                Some((per, len)) => Some((self.alloc_symmetric::<f32>(len)?, per)),
                None => None,
            },
        };
        Ok(ExpertGroup {
            comm: self,
            config,
            mask,
            local,
            received,
            memory,
        })
    }

    /// [`Comm::expert_group`] run by `engine` (collective: every rank with the same
    /// configuration and engine). [`ExpertEngine::Kernels`] is `expert_group`;
    /// [`ExpertEngine::Library`] opens NCCL EP's group on this communicator (an NCCL backend
    /// with the library found, bf16 tokens), `Unsupported` naming what is missing
    /// elsewhere.
    pub fn expert_group_on<T: Element>(
        &self,
        config: ExpertConfig,
        engine: ExpertEngine,
    ) -> Result<ExpertGroup<'_, T, C>> {
        if engine == ExpertEngine::Kernels {
            return self.expert_group(config);
        }
        let w = self.world_size();
        let local = config.local_experts(w)?;
        let (_, received, _) = group_sizes(&config, local, w)?;
        let parts = ExpertGroupParts {
            recv: RawHandle(0),
            meta: RawHandle(0),
            back: RawHandle(0),
            config,
            mask: RankMask::none(w),
            dtype: T::DTYPE,
            engine,
        };
        let handle = self.sole()?.open_expert_engine(&parts)?;
        Ok(ExpertGroup {
            comm: self,
            config,
            mask: parts.mask,
            local,
            received,
            memory: GroupMemory::Library(LibraryGroup {
                comm: self,
                handle,
                engine,
            }),
        })
    }

    /// [`Comm::expert_group`] that also dispatches FP8 tokens
    /// ([`ExpertGroup::dispatch_fp8`]) with `per_token` f32 scales each (DeepEP's one per
    /// 128 channels: `hidden / 128`), its scale slots allocated with it. Collective.
    pub fn expert_group_fp8<T: Element>(
        &self,
        config: ExpertConfig,
        per_token: usize,
    ) -> Result<ExpertGroup<'_, T, C>> {
        self.expert_group_masked(config, RankMask::none(self.world_size()), Some(per_token))
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
            counts: self.fit(out.counts, self.local, "counts")?.raw(),
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
