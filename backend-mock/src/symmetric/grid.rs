//! The GPU kernels' grid on the mock: the blocks past the first (`symmetric_blocks`, the
//! CUDA launcher's grid before its clamp to what a device holds) run one after another on
//! the rank's thread, in the order every rank runs them, each meeting the same block of
//! every peer on its own arrival words in the pad (`pad_block_arrival`) with values from the
//! allocation's launch count (`PAD_CALL`), which every launch advances, its call agreed or
//! not: so the words and the count a GPU kernel's blocks use move here as there. Where block
//! 0 finds the ranks disagreeing no later block meets (on the GPU they end at its verdict).

use std::sync::atomic::Ordering;

use unicomm_core::symmetric::{pad_block_arrival, PAD_CALL};
use unicomm_core::Result;

use super::kernels::Run;

/// A launch's grid: its blocks and the launch's number.
pub(crate) struct Grid {
    blocks: usize,
    call: u32,
}

impl Grid {
    /// A grid of `blocks` at the allocation's launch count.
    pub(crate) fn at(run: &Run, blocks: usize) -> Grid {
        let call = run.word(run.ctx.rank, PAD_CALL).load(Ordering::Relaxed);
        Grid { blocks, call }
    }

    /// Barrier `i` (1 to 3) of every block past the first: its arrival in every rank's pad,
    /// then every rank's awaited.
    pub(crate) fn meet(&self, run: &Run, i: u32) -> Result<()> {
        let me = run.ctx.rank;
        let v = self.call.wrapping_mul(4).wrapping_add(i);
        for b in 1..self.blocks {
            for p in run.peers() {
                run.word(p, pad_block_arrival(b, me))
                    .store(v, Ordering::Release);
            }
            for p in run.peers() {
                let word = run.word(me, pad_block_arrival(b, p));
                run.wait(
                    p,
                    || {
                        format!(
                            "block {b}'s barrier {i} of launch {}: rank {p} never came",
                            self.call
                        )
                    },
                    || word.load(Ordering::Acquire).wrapping_sub(v) as i32 >= 0,
                    || None,
                )?;
            }
        }
        Ok(())
    }

    /// The launch counted (whatever it found).
    pub(crate) fn end(&self, run: &Run) {
        run.word(run.ctx.rank, PAD_CALL)
            .store(self.call.wrapping_add(1), Ordering::Relaxed);
    }
}
