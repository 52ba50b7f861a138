//! `ncclCollConfig_t`, the per-collective configuration of the `nccl*Config` entry points
//! (NCCL 2.32's nccl.h, `ncclCollConfig_v23200`). Like `ncclConfig_t` it is versioned and
//! append-only: `size`, `magic` and `version` say which layout the caller filled, and a
//! field left at `NCCL_CONFIG_UNDEF_INT` (a null pointer) is NCCL's own choice.

use std::ffi::{c_char, c_int, c_void, CString};

use crate::sys::config::UNDEF;

/// `NCCL_API_MAGIC`.
const API_MAGIC: u32 = 0xcafe_beef;
/// The `NCCL_VERSION_CODE` whose layout [`RawCollConfig`] is.
const LAYOUT_VERSION: u32 = 23200;

/// `ncclCollConfig_t` of NCCL 2.32.
#[repr(C)]
#[derive(Debug)]
#[expect(
    missing_docs,
    reason = "each field is the ncclCollConfig_t field of the same name"
)]
pub struct RawCollConfig {
    size: usize,
    magic: u32,
    version: u32,
    /// Vendor extensions (`ncclConfigExt_t`): none.
    ext: *mut c_void,
    pub min_ctas: c_int,
    pub max_ctas: c_int,
    pub nvls_ctas: c_int,
    pub cga_cluster_size: c_int,
    alg_selection: *const c_char,
    pub force_alg_selection: c_int,
    pub cta_policy: c_int,
    pub user_profiler_tag: u64,
    /// A caller's CUDA event recorded at the kernel's launch: none.
    launch_completion_event: *mut c_void,
}

/// A [`RawCollConfig`] with the selection string it points to.
#[derive(Debug)]
pub struct CollConfig {
    raw: RawCollConfig,
    /// Owns what `raw.alg_selection` points to (a `CString`'s bytes do not move with it).
    _alg: Option<CString>,
}

impl CollConfig {
    /// `NCCL_COLLCONFIG_INITIALIZER` (every field NCCL's choice) with `alg` as the
    /// algorithm selection; the caller sets the other fields.
    pub fn new(alg: Option<CString>) -> Self {
        let raw = RawCollConfig {
            size: std::mem::size_of::<RawCollConfig>(),
            magic: API_MAGIC,
            version: LAYOUT_VERSION,
            ext: std::ptr::null_mut(),
            min_ctas: UNDEF,
            max_ctas: UNDEF,
            nvls_ctas: UNDEF,
            cga_cluster_size: UNDEF,
            alg_selection: alg.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            force_alg_selection: 1,
            cta_policy: UNDEF,
            user_profiler_tag: 0,
            launch_completion_event: std::ptr::null_mut(),
        };
        CollConfig { raw, _alg: alg }
    }

    /// `launchCompletionEvent`: the handle of an event (a `cudaEvent_t` created without
    /// timing) that must live until the call has launched.
    pub fn set_launch_event(&mut self, handle: usize) {
        self.raw.launch_completion_event = handle as *mut c_void;
    }

    /// The fields.
    pub fn raw_mut(&mut self) -> &mut RawCollConfig {
        &mut self.raw
    }

    /// The pointer the `nccl*Config` calls take, valid while `self` lives.
    pub fn as_ptr(&self) -> *const c_void {
        (&self.raw as *const RawCollConfig).cast()
    }
}

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use super::*;

    /// The offsets of NCCL 2.32.3's nccl.h on x86_64 (LP64): ext at 16, the four CTA ints
    /// from 24, algSelection at 40, forceAlgSelection and CTAPolicy at 48 and 52,
    /// userProfilerTag at 56, launchCompletionEvent at 64, 72 bytes in all.
    #[test]
    fn the_layout_is_ncclcollconfig_v23200() {
        assert_eq!(offset_of!(RawCollConfig, ext), 16);
        assert_eq!(offset_of!(RawCollConfig, min_ctas), 24);
        assert_eq!(offset_of!(RawCollConfig, cga_cluster_size), 36);
        assert_eq!(offset_of!(RawCollConfig, alg_selection), 40);
        assert_eq!(offset_of!(RawCollConfig, force_alg_selection), 48);
        assert_eq!(offset_of!(RawCollConfig, cta_policy), 52);
        assert_eq!(offset_of!(RawCollConfig, user_profiler_tag), 56);
        assert_eq!(offset_of!(RawCollConfig, launch_completion_event), 64);
        assert_eq!(std::mem::size_of::<RawCollConfig>(), 72);
    }

    #[test]
    fn the_selection_pointer_outlives_a_move() {
        let c = CollConfig::new(Some(CString::new("Ring").unwrap()));
        let moved = Box::new(c);
        let owned = moved._alg.as_ref().map(|s| s.as_ptr());
        assert_eq!(Some(moved.raw.alg_selection), owned);
    }
}
