//! nccl_ep.h's structures and codes (API version 2), each structure as the header lays it
//! out; the tests hold them to the header's frozen sizes.

use std::ffi::{c_int, c_uint, c_void};

use unicomm_core::Version;

/// `NCCL_EP_MAGIC`: every configuration and argument structure's second word.
pub const MAGIC: c_uint = 0xC00F_FFEE;
/// `NCCL_EP_TENSOR_MAGIC`: a caller-made tensor descriptor's.
pub const TENSOR_MAGIC: c_uint = 0xCAFE_CAFE;
/// `NCCL_EP_API_VERSION` of the header these structures follow.
pub const API_VERSION: c_uint = 2;
/// `NCCL_EP_ALGO_LOW_LATENCY`.
pub const ALGO_LOW_LATENCY: c_int = 0;
/// `NCCL_EP_LAYOUT_EXPERT_MAJOR`: `[local experts][ranks * max tokens][hidden]`, the
/// layout unicomm's dispatch writes.
pub const LAYOUT_EXPERT_MAJOR: c_int = 1;
/// The first NCCL EP release bound here (`ncclEpGetVersion`'s `MAJOR*10000+MINOR*100+
/// PATCH`: 0.1.0, the first wheel); a major other than 0 is refused (its ABI is not this).
pub const EP_SINCE: Version = Version::new(0, 1, 0);
/// The NCCL the wheel's library was built against (nccl-extensions 0.1.0: NCCL 2.30.7; its
/// kernels use that release's device API): an older NCCL loaded is refused.
pub const EP_NCCL_SINCE: Version = Version::new(2, 30, 7);
/// The variable naming the library explicitly.
pub const EP_LIBRARY_VAR: &str = "UNICOMM_NCCL_EP_LIBRARY";

/// `ncclEpTensor_t` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Tensor {
    pub(crate) size: c_uint,
    pub(crate) magic: c_uint,
    pub(crate) ndim: c_uint,
    pub(crate) datatype: c_int,
    pub(crate) data: *mut c_void,
    pub(crate) win_hdl: *mut c_void,
    pub(crate) win_offset: u64,
    pub(crate) sizes: *mut usize,
}

/// `ncclEpAllocConfig_t`: all null, the library's `cudaMalloc`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AllocConfig {
    pub(crate) alloc_fn: *mut c_void,
    pub(crate) free_fn: *mut c_void,
    pub(crate) context: *mut c_void,
}

/// `ncclEpGroupConfig_t` (112 bytes at API version 2; 96 at its V1 boundary).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GroupConfig {
    pub(crate) size: c_uint,
    pub(crate) magic: c_uint,
    pub(crate) version: c_uint,
    pub(crate) algorithm: c_int,
    pub(crate) num_experts: c_uint,
    pub(crate) max_dispatch_tokens_per_rank: c_uint,
    pub(crate) max_recv_tokens_per_rank: c_uint,
    pub(crate) max_token_bytes: c_uint,
    pub(crate) rdma_buffer_size: u64,
    pub(crate) num_qp_per_rank: c_uint,
    pub(crate) num_channels: c_uint,
    pub(crate) max_num_sms: c_uint,
    pub(crate) alloc: AllocConfig,
    pub(crate) enable_mask: c_uint,
    pub(crate) timeout_ns: u64,
    pub(crate) zero_copy: c_int,
    pub(crate) overflow_policy: c_int,
    pub(crate) num_topk: c_uint,
    pub(crate) padding_v2: [u8; 4],
}

/// `ncclEpLayoutInfo_t` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct LayoutInfo {
    pub(crate) size: c_uint,
    pub(crate) magic: c_uint,
    pub(crate) expert_counters: *mut Tensor,
    pub(crate) src_rank_counters: *mut Tensor,
    pub(crate) expert_offsets: *mut Tensor,
    pub(crate) recv_total_counter: *mut Tensor,
    pub(crate) recv_topk_idx_kind: c_int,
    pub(crate) padding_v2: [u8; 4],
}

/// `ncclEpDispatchInputs_t` and `ncclEpCombineInputs_t` (32 bytes each: tokens, weights,
/// scales).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Inputs {
    pub(crate) size: c_uint,
    pub(crate) magic: c_uint,
    pub(crate) tokens: *mut Tensor,
    pub(crate) topk_weights: *mut Tensor,
    pub(crate) scales: *mut Tensor,
}

/// `ncclEpDispatchOutputs_t` (40 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DispatchOutputs {
    pub(crate) size: c_uint,
    pub(crate) magic: c_uint,
    pub(crate) tokens: *mut Tensor,
    pub(crate) topk_weights: *mut Tensor,
    pub(crate) scales: *mut Tensor,
    pub(crate) topk_idx: *mut Tensor,
}

/// `ncclEpCombineOutputs_t` (24 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CombineOutputs {
    pub(crate) size: c_uint,
    pub(crate) magic: c_uint,
    pub(crate) tokens: *mut Tensor,
    pub(crate) topk_weights: *mut Tensor,
}

/// `ncclEpHandleConfig_t` (16 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HandleConfig {
    pub(crate) size: c_uint,
    pub(crate) magic: c_uint,
    pub(crate) dispatch_output_per_expert_alignment: usize,
}

/// A structure's first two words, as the header's `NCCL_EP_STRUCT_INIT` fills them.
pub(crate) const fn head<T>() -> (c_uint, c_uint) {
    (std::mem::size_of::<T>() as c_uint, MAGIC)
}
