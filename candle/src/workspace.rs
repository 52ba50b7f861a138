//! The fused op's symmetric workspace and what its CPU and CUDA paths share (below both:
//! the CUDA path lives with candle's other CUDA code in `ops`).

use candle_core::{Layout, Result};

/// What refusals and errors name.
pub(crate) const NAME: &str = "all_reduce_rms_norm";

/// The symmetric memory of a workspace, of its element type.
pub(crate) enum Workspace<'c> {
    F32(unicomm::Symmetric<'c, f32>),
    Bf16(unicomm::Symmetric<'c, unicomm::bf16>),
    F16(unicomm::Symmetric<'c, unicomm::f16>),
}

/// `(start, end)` of a contiguous input in its storage.
pub(crate) fn offsets(l: &Layout) -> Result<(usize, usize)> {
    l.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg(format!("unicomm-candle {NAME}: an input is not contiguous"))
    })
}
