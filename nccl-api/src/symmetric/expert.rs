//! Expert parallelism's dispatch and combine as launches of unicomm's symmetric kernels
//! (`ALG_DISPATCH`, `ALG_COMBINE` in kernels/symmetric.cu): the group's three allocations
//! (and an FP8 dispatch's scale slots) checked against its capacities, the operands against
//! the sizes the kernel moves, everything the kernel reads or writes named in one
//! [`ExpertArgs`](crate::sys::kernel_args::ExpertArgs). The protocol is the mock's (backend-mock/src/symmetric/expert.rs).

use unicomm_core::symmetric::{
    Combine, Dispatch, ExpertGroupParts, ExpertMode, MAX_SYMMETRIC_BLOCKS,
};
use unicomm_core::{DataType, Error, Result, Slice};

use super::{Record, SymmetricMemory};
use crate::base::Base;
use crate::memory::ApiMemory;
use crate::sys::kernel_args::{vector_blocks, KernelAlgorithm, KernelParams, SYMMETRIC_BLOCK};
use crate::sys::runtime::Runtime;

/// The group's sizes, each checked to fit the kernel's 32-bit words.
struct Shape {
    local: usize,
    world: usize,
    m: usize,
    h: usize,
    k: usize,
    /// Rows of the receive slots and of a dispatch's output: `L * W * M`, or the
    /// high-throughput layout's `max_recv`.
    rows: usize,
    /// The high-throughput layout's `max_recv` (0: low latency).
    packed: u32,
}

impl Shape {
    fn of(g: &ExpertGroupParts, world: usize) -> Result<Shape> {
        let c = g.config;
        let local = c.local_experts(g.mask.world())?;
        g.mask.fits(world)?;
        let word = |what: &'static str, v: usize| {
            u32::try_from(v)
                .map(drop)
                .map_err(|_| Error::invalid(what, format!("{v}: past the kernels' 32-bit words")))
        };
        word("experts", c.experts)?;
        word("max_tokens", c.max_tokens)?;
        word("top_k", c.top_k)?;
        // A row's bytes: the type is at most 4 bytes wide.
        word("hidden", c.hidden.saturating_mul(4))?;
        let (rows, packed) = match g.mode {
            ExpertMode::HighThroughput { max_recv } => {
                word("max_recv", max_recv)?;
                (max_recv, max_recv as u32)
            }
            _ => {
                let rows = local
                    .checked_mul(world)
                    .and_then(|x| x.checked_mul(c.max_tokens));
                (rows.ok_or_else(overflow)?, 0)
            }
        };
        Ok(Shape {
            local,
            world,
            m: c.max_tokens,
            h: c.hidden,
            k: c.top_k,
            rows,
            packed,
        })
    }
}

fn overflow() -> Error {
    Error::invalid("expert config", "its sizes overflow")
}

/// Whether the allocation `rec` (one of the group's) holds `elems` of `size` bytes on every
/// rank, and is laid out over this communicator's world.
fn check_part(
    rec: &Record,
    world: usize,
    elems: Option<usize>,
    size: usize,
    what: &str,
) -> Result<()> {
    let need = elems
        .and_then(|e| e.checked_mul(size))
        .ok_or_else(overflow)?;
    if rec.bytes < need || rec.peers.len() != world {
        return Err(Error::invalid(
            "group",
            format!(
                "its {what}: {} bytes over {} ranks, where {need} over {world} are due",
                rec.bytes,
                rec.peers.len()
            ),
        ));
    }
    Ok(())
}

/// Checks `s` (this rank's memory) holds `elems` of `dtype`; its address.
pub(super) fn operand<R: Runtime>(
    base: &Base<R>,
    s: &Slice<'_, ApiMemory<R>>,
    elems: Option<usize>,
    dtype: DataType,
    arg: &'static str,
) -> Result<u64> {
    base.check_memory(s.mem)?;
    s.holds(elems.ok_or_else(overflow)?, dtype, arg)?;
    Ok(s.address() as u64)
}

impl<R: Runtime> SymmetricMemory<R> {
    /// The launch of a dispatch: its parameters and the group's type (the function).
    pub(super) fn dispatch_params(
        &self,
        base: &Base<R>,
        control: usize,
        d: &Dispatch<'_, ApiMemory<R>>,
    ) -> Result<(DataType, KernelParams)> {
        let (g, n) = (&d.group, d.n);
        let (mut p, sh) = self.group_params(base, control, g, KernelAlgorithm::Dispatch, n)?;
        let rows = sh.rows;
        let byte = d.fp8.is_some();

        let el = if byte { DataType::U8 } else { g.dtype };
        p.x.tokens = operand(base, &d.tokens, n.checked_mul(sh.h), el, "tokens")?;
        p.x.ids = operand(base, &d.ids, n.checked_mul(sh.k), DataType::I32, "ids")?;
        p.out = operand(base, &d.out, rows.checked_mul(sh.h), el, "out")?;
        // The high-throughput layout's counts, then each expert's first row.
        let words = if sh.packed > 0 {
            2 * sh.local
        } else {
            sh.local
        };
        p.x.counts = operand(base, &d.counts, Some(words), DataType::I32, "counts")?;
        p.x.row_bytes = (sh.h * el.size()) as u32;
        if let Some(q) = &d.fp8 {
            let per = q.per_token;
            let slots = self.get(q.slots)?;
            check_part(&slots, sh.world, rows.checked_mul(per), 4, "scale slots")?;
            for (r, &at) in slots.peers.iter().enumerate() {
                p.x.scales[r] = at as u64;
            }
            p.x.in_scales = operand(base, &q.scales, n.checked_mul(per), DataType::F32, "scales")?;
            p.x.out_scales = operand(
                base,
                &q.out_scales,
                rows.checked_mul(per),
                DataType::F32,
                "out_scales",
            )?;
            p.x.per_token = u32::try_from(per)
                .map_err(|_| Error::invalid("per_token", format!("{per}: past 32 bits")))?;
        }
        Ok((g.dtype, p))
    }

    /// The launch of a combine: its parameters and the group's type (the function).
    pub(super) fn combine_params(
        &self,
        base: &Base<R>,
        control: usize,
        c: &Combine<'_, ApiMemory<R>>,
    ) -> Result<(DataType, KernelParams)> {
        let (g, n) = (&c.group, c.n);
        let (mut p, sh) = self.group_params(base, control, g, KernelAlgorithm::Combine, n)?;
        let t = g.dtype;
        p.x.tokens = operand(
            base,
            &c.expert_out,
            sh.rows.checked_mul(sh.h),
            t,
            "expert_out",
        )?;
        p.x.ids = operand(base, &c.ids, n.checked_mul(sh.k), DataType::I32, "ids")?;
        p.x.weights = operand(
            base,
            &c.weights,
            n.checked_mul(sh.k),
            DataType::F32,
            "weights",
        )?;
        p.out = operand(base, &c.out, n.checked_mul(sh.h), t, "out")?;
        p.x.row_bytes = (sh.h * t.size()) as u32;
        Ok((t, p))
    }

    /// What a dispatch and a combine share: the group's allocations checked against its
    /// capacities and named, the layout, the grid; and the group's sizes.
    fn group_params(
        &self,
        base: &Base<R>,
        control: usize,
        g: &ExpertGroupParts,
        algorithm: KernelAlgorithm,
        n: usize,
    ) -> Result<(KernelParams, Shape)> {
        crate::sys::kernel_args::function_index(g.dtype, "expert kernels")?;
        let sh = Shape::of(g, base.lc.world)?;
        if n > sh.m {
            return Err(Error::invalid(
                "tokens",
                format!("{n} tokens, past max_tokens {}", sh.m),
            ));
        }
        let (rows, size) = (sh.rows, g.dtype.size());
        let recv = self.get(g.recv)?;
        check_part(
            &recv,
            sh.world,
            rows.checked_mul(sh.h),
            size,
            "receive slots",
        )?;
        let meta = self.get(g.meta)?;
        let words = (sh.local * sh.world).checked_add(rows);
        check_part(&meta, sh.world, words, 8, "counts and origins")?;
        let back = self.get(g.back)?;
        let landing = sh.m.checked_mul(sh.k).and_then(|x| x.checked_mul(sh.h));
        check_part(&back, sh.world, landing, size, "landing rows")?;
        let mut p = super::params_of(base, &recv, control, algorithm);
        for r in 0..sh.world {
            p.x.meta[r] = meta.peers[r] as u64;
            p.x.back[r] = back.peers[r] as u64;
        }
        p.hidden = sh.h as u64;
        p.x.masked = g.mask.bits();
        p.x.experts = g.config.experts as u32;
        p.x.max_tokens = sh.m as u32;
        p.x.top_k = sh.k as u32;
        p.x.n = n as u32;
        p.x.layout_world = g.mask.world() as u32;
        p.x.max_recv = sh.packed;
        p.blocks = expert_blocks(g.config.experts, sh.local * sh.world, sh.m * sh.h * size);
        Ok((p, sh))
    }
}

/// The grid of a dispatch or combine: a warp for each expert and for each slot pair, and a
/// thread for each pair of 16-byte vectors of one source's tokens (the combine's sums), at
/// most [`MAX_SYMMETRIC_BLOCKS`].
fn expert_blocks(experts: usize, pairs: usize, bytes: usize) -> u32 {
    let warps = experts.max(pairs).div_ceil((SYMMETRIC_BLOCK / 32) as usize);
    (warps.clamp(1, MAX_SYMMETRIC_BLOCKS) as u32).max(vector_blocks(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use unicomm_core::registry::RawHandle;
    use unicomm_core::symmetric::{ExpertConfig, RankMask};

    fn group(config: ExpertConfig, mask: RankMask) -> ExpertGroupParts {
        ExpertGroupParts {
            recv: RawHandle(1),
            meta: RawHandle(2),
            back: RawHandle(3),
            config,
            mask,
            dtype: DataType::Bf16,
            engine: Default::default(),
            mode: Default::default(),
        }
    }

    const DECODE: ExpertConfig = ExpertConfig {
        experts: 256,
        max_tokens: 128,
        hidden: 7168,
        top_k: 8,
    };

    fn part(bytes: usize, world: usize) -> Record {
        Record {
            peers: vec![0x1000; world],
            bytes,
            data: bytes.next_multiple_of(256),
            lamport: None,
            maps: Vec::new(),
        }
    }

    /// The kernel writes a peer's slots at offsets the group's capacities give: an
    /// allocation smaller than they need (a group's parts made by hand through the
    /// backend's door), or laid out over another world, is refused before any launch.
    #[test]
    fn a_part_smaller_than_the_capacities_need_is_refused() {
        let sh = Shape::of(&group(DECODE, RankMask::none(8)), 8).unwrap();
        let rows = sh.rows;
        assert_eq!(rows, 32 * 8 * 128);
        let need = rows * sh.h * 2;
        assert!(check_part(&part(need, 8), 8, Some(rows * sh.h), 2, "slots").is_ok());
        assert!(check_part(&part(need - 2, 8), 8, Some(rows * sh.h), 2, "slots").is_err());
        assert!(check_part(&part(need, 4), 8, Some(rows * sh.h), 2, "slots").is_err());
        // A size that overflows is refused, not wrapped.
        assert!(check_part(&part(need, 8), 8, Some(usize::MAX / 2), 4, "slots").is_err());
        assert!(check_part(&part(need, 8), 8, None, 4, "slots").is_err());
    }

    /// The kernel reads capacities as 32-bit words and the mask over the communicator's
    /// world: a capacity past 32 bits, or a mask whose survivors are not the world, is
    /// refused.
    #[test]
    fn capacities_past_the_kernels_words_or_a_mask_off_the_world_are_refused() {
        let big = ExpertConfig {
            max_tokens: 1 << 32,
            ..DECODE
        };
        assert!(Shape::of(&group(big, RankMask::none(8)), 8).is_err());
        let masked = RankMask::new(9, &[4]).unwrap();
        let cfg = ExpertConfig {
            experts: 9 * 4,
            ..DECODE
        };
        assert!(Shape::of(&group(cfg, masked), 8).is_ok());
        assert!(Shape::of(&group(cfg, masked), 9).is_err());
        // Experts that do not divide over the layout.
        assert!(Shape::of(&group(DECODE, masked), 8).is_err());
    }

    /// The high-throughput layout: its rows are `max_recv` (the receive slots, the output,
    /// the experts' output the combine reads), the launch's `max_recv` word says so (0 at
    /// low latency), and a `max_recv` past the kernels' 32-bit words is refused.
    #[test]
    fn a_high_throughput_group_is_sized_by_max_recv() {
        let mut g = group(DECODE, RankMask::none(8));
        let low = Shape::of(&g, 8).unwrap();
        assert_eq!((low.rows, low.packed), (32 * 8 * 128, 0));
        g.mode = ExpertMode::HighThroughput { max_recv: 5000 };
        let high = Shape::of(&g, 8).unwrap();
        assert_eq!((high.rows, high.packed), (5000, 5000));
        g.mode = ExpertMode::HighThroughput { max_recv: 1 << 32 };
        let e = Shape::of(&g, 8).err().expect("past 32 bits").to_string();
        assert!(e.contains("max_recv"), "{e}");
    }

    /// A warp for each expert and each slot pair, a thread per two vectors of a source's
    /// tokens, within the grid the pads have arrival words for.
    #[test]
    fn the_grid_covers_every_expert_and_stays_within_the_pads() {
        // DeepSeek-V3's decode at world 1: 256 experts (16 blocks of 16 warps), 1.8 MB of
        // one source's tokens (112 blocks).
        assert_eq!(expert_blocks(256, 256, 128 * 7168 * 2), 112);
        assert_eq!(expert_blocks(4, 4, 16), 1);
        assert_eq!(expert_blocks(1000, 8, 16), 63);
        assert_eq!(
            expert_blocks(1 << 20, 1, 1 << 40),
            MAX_SYMMETRIC_BLOCKS as u32
        );
    }
}
