//! Making an expert group: its memory sized by its capacities and mode on unicomm's
//! kernels, or an expert library's group opened by the backend.

use super::{ExpertGroup, GroupMemory, LibraryGroup};
use crate::backend::Collective;
use crate::comm::Comm;
use crate::element::Element;
use crate::registry::RawHandle;
use crate::symmetric::{
    ExpertConfig, ExpertEngine, ExpertGroupParts, ExpertMode, ExpertOptions, RankMask,
};
use crate::{Error, Result};

/// The elements of a group's memory: slots (or packed rows) to receive, their metadata
/// (`L * W` counts, then an origin a slot), the combine's landing rows.
struct Sizes {
    slots: usize,
    received: usize,
    meta: usize,
    back: usize,
}

/// The memory of `config` in `mode` on `local` experts of a world of `w`.
fn group_sizes(config: &ExpertConfig, mode: ExpertMode, local: usize, w: usize) -> Result<Sizes> {
    let too_big = || Error::invalid("expert config", format!("{config:?} overflows"));
    let (m, h, k) = (config.max_tokens, config.hidden, config.top_k);
    let slots = match mode {
        ExpertMode::HighThroughput { max_recv: 0 } => {
            return Err(Error::invalid("max_recv", "at least 1 token"))
        }
        ExpertMode::HighThroughput { max_recv } => Some(max_recv),
        _ => local.checked_mul(w).and_then(|x| x.checked_mul(m)),
    }
    .ok_or_else(too_big)?;
    let counts = local.checked_mul(w).ok_or_else(too_big)?;
    Ok(Sizes {
        slots,
        received: slots.checked_mul(h).ok_or_else(too_big)?,
        meta: counts.checked_add(slots).ok_or_else(too_big)?,
        back: m
            .checked_mul(k)
            .and_then(|x| x.checked_mul(h))
            .ok_or_else(too_big)?,
    })
}

impl<C: Collective> Comm<C> {
    /// An expert-parallel group (collective and host-blocking: every rank calls it with the
    /// same configuration, in the same order; capacities whose memory differs are
    /// `Mismatch` on every rank). Tokens of f32, f16 or bf16. Its memory: `experts x
    /// max_tokens` tokens to receive, `max_tokens x top_k` to combine, their counts and
    /// origins. The mock runs it, and NCCL on an sm90 GPU or newer (unicomm's kernels);
    /// elsewhere it is `Unsupported`.
    pub fn expert_group<T: Element>(&self, config: ExpertConfig) -> Result<ExpertGroup<'_, T, C>> {
        self.expert_group_with(config, ExpertOptions::default())
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
        let options = ExpertOptions {
            mask: Some(mask),
            fp8_scales,
            ..ExpertOptions::default()
        };
        self.expert_group_with(config, options)
    }

    /// [`Comm::expert_group`] that also dispatches FP8 tokens
    /// ([`ExpertGroup::dispatch_fp8`]) with `per_token` f32 scales each (DeepEP's one per
    /// 128 channels: `hidden / 128`), its scale slots allocated with it. Collective.
    pub fn expert_group_fp8<T: Element>(
        &self,
        config: ExpertConfig,
        per_token: usize,
    ) -> Result<ExpertGroup<'_, T, C>> {
        let options = ExpertOptions {
            fp8_scales: Some(per_token),
            ..ExpertOptions::default()
        };
        self.expert_group_with(config, options)
    }

    /// [`Comm::expert_group`] made as `options` say (collective: every rank with the same
    /// configuration and options): its engine ([`ExpertEngine::Library`]: the backend's
    /// expert library, NCCL EP on NCCL, bf16 tokens, low latency, no mask and no FP8), its
    /// mode ([`ExpertMode::HighThroughput`]: `max_recv` packed rows a rank, for prefill),
    /// the survivors' mask ([`Comm::expert_group_masked`]), the FP8 scales
    /// ([`Comm::expert_group_fp8`]).
    pub fn expert_group_with<T: Element>(
        &self,
        config: ExpertConfig,
        options: ExpertOptions,
    ) -> Result<ExpertGroup<'_, T, C>> {
        let w = self.world_size();
        let mask = options.mask.unwrap_or(RankMask::none(w));
        mask.fits(w)?;
        let local = config.local_experts(mask.world())?;
        let sizes = group_sizes(&config, options.mode, local, w)?;
        let memory = match options.engine {
            ExpertEngine::Kernels => {
                self.kernels_memory::<T>(&sizes, options.mode, options.fp8_scales)?
            }
            engine => {
                let parts = ExpertGroupParts {
                    recv: RawHandle(0),
                    meta: RawHandle(0),
                    back: RawHandle(0),
                    config,
                    mask,
                    dtype: T::DTYPE,
                    engine,
                    mode: options.mode,
                };
                if options.fp8_scales.is_some() {
                    return Err(Error::unsupported(
                        "an FP8 dispatch",
                        "unicomm's kernels",
                        engine.name(),
                    ));
                }
                let handle = self.sole()?.open_expert_engine(&parts)?;
                GroupMemory::Library(LibraryGroup {
                    comm: self,
                    handle,
                    engine,
                })
            }
        };
        Ok(ExpertGroup {
            comm: self,
            config,
            mask,
            mode: options.mode,
            local,
            received: sizes.received,
            memory,
        })
    }

    /// unicomm's kernels' memory for a group of `sizes`: refused before any is made where
    /// the kernels are not there.
    fn kernels_memory<T: Element>(
        &self,
        sizes: &Sizes,
        mode: ExpertMode,
        fp8_scales: Option<usize>,
    ) -> Result<GroupMemory<'_, T, C>> {
        // Combine sums in f32 and rounds to the tokens' type.
        crate::symmetric::check_symmetric_type(T::DTYPE)?;
        let caps = self.capabilities();
        if !caps.device_counts {
            return Err(Error::unsupported(
                "expert parallelism's dispatch and combine",
                "unicomm's expert kernels (the mock's, or an NVIDIA GPU of sm90 or newer where unicomm's symmetric kernels load)",
                format!("{} {}", caps.backend, caps.version),
            ));
        }
        if mode != ExpertMode::LowLatency && !caps.packed_dispatch {
            return Err(Error::unsupported(
                "expert parallelism's high-throughput dispatch",
                "unicomm's packed dispatch (the mock's, or NCCL's where unicomm's kernels load)",
                format!("{} {}", caps.backend, caps.version),
            ));
        }
        let scales = match fp8_scales.map(|p| p.max(1)) {
            None => None,
            Some(per) => {
                let len = (sizes.slots.checked_mul(per))
                    .ok_or_else(|| Error::invalid("per_token", format!("{per} scales overflow")))?;
                Some((self.alloc_symmetric::<f32>(len)?, per))
            }
        };
        Ok(GroupMemory::Kernels {
            recv: self.alloc_symmetric::<T>(sizes.received)?,
            meta: self.alloc_symmetric::<i64>(sizes.meta)?,
            back: self.alloc_symmetric::<T>(sizes.back)?,
            scales,
        })
    }
}
