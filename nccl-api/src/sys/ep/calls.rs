//! One NCCL EP group of the low-latency algorithm with its handle (expert-major layout),
//! and its dispatch and combine, each one call of the library with the structures filled
//! on the stack for the call's length.

#![allow(
    unsafe_code,
    reason = "calls the NCCL EP library (the architecture test's UNSAFE_FILES lists it)"
)]

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;
use std::sync::Arc;
use std::time::Duration;

use unicomm_core::{DataType, Error, Result};

use super::abi::{
    head, AllocConfig, CombineOutputs, DispatchOutputs, GroupConfig, HandleConfig, Inputs,
    LayoutInfo, Tensor, ALGO_LOW_LATENCY, API_VERSION, LAYOUT_EXPERT_MAJOR, TENSOR_MAGIC,
};
use super::library::EpLibrary;
use crate::sys::api::{Api, NcclComm, RawStream};
use crate::sys::codes::NcclCode;

/// A group's capacities, as unicomm's expert group has them.
#[derive(Debug, Clone, Copy)]
pub struct EpSpec {
    /// Experts in all.
    pub experts: usize,
    /// Ranks of the communicator.
    pub world: usize,
    /// The most tokens a rank dispatches in one call.
    pub max_tokens: usize,
    /// Elements of a token.
    pub hidden: usize,
    /// Experts per token.
    pub top_k: usize,
    /// The tokens' element type.
    pub dtype: DataType,
    /// The library's own wait bound on the device (its `timeout_ns`).
    pub timeout: Duration,
}

impl EpSpec {
    /// Experts on each rank.
    pub fn local(&self) -> usize {
        self.experts / self.world.max(1)
    }

    /// The group's configuration: every capacity as the library's 32-bit word, or
    /// `InvalidArgument` naming the one that does not fit.
    pub(crate) fn config(&self) -> Result<GroupConfig> {
        let word = |v: usize, what: &'static str| {
            c_uint::try_from(v).map_err(|_| Error::invalid(what, format!("{v} past 32 bits")))
        };
        let token_bytes = self.hidden.saturating_mul(self.dtype.size());
        let (size, magic) = head::<GroupConfig>();
        Ok(GroupConfig {
            size,
            magic,
            version: API_VERSION,
            algorithm: ALGO_LOW_LATENCY,
            num_experts: word(self.experts, "experts")?,
            max_dispatch_tokens_per_rank: word(self.max_tokens, "max_tokens")?,
            max_recv_tokens_per_rank: 0,
            max_token_bytes: word(token_bytes, "hidden")?,
            rdma_buffer_size: 0,
            num_qp_per_rank: 0,
            num_channels: 0,
            max_num_sms: 0,
            alloc: AllocConfig {
                alloc_fn: null_mut(),
                free_fn: null_mut(),
                context: null_mut(),
            },
            enable_mask: 0,
            timeout_ns: u64::try_from(self.timeout.as_nanos()).unwrap_or(u64::MAX),
            zero_copy: 0,
            overflow_policy: 0,
            num_topk: word(self.top_k, "top_k")?,
            padding_v2: [0; 4],
        })
    }
}

/// The descriptor of `sizes.len()` dimensions of `dtype` at device address `data` (`sizes`
/// must outlive its use).
fn tensor(dtype: DataType, data: usize, sizes: &mut [usize]) -> Tensor {
    Tensor {
        size: std::mem::size_of::<Tensor>() as c_uint,
        magic: TENSOR_MAGIC,
        ndim: sizes.len() as c_uint,
        datatype: dtype.nccl(),
        data: data as *mut c_void,
        win_hdl: null_mut(),
        win_offset: 0,
        sizes: sizes.as_mut_ptr(),
    }
}

/// One group and its handle (the library's objects, held as addresses: opaque tokens
/// unicomm never dereferences), destroyed once, in `Drop`. Its calls are made by one thread
/// at a time (the caller's communicator serialises them).
pub struct EpGroup {
    lib: Arc<EpLibrary>,
    group: usize,
    handle: usize,
    spec: EpSpec,
}

impl std::fmt::Debug for EpGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NCCL EP group ({:?}) of {:?}", self.spec, self.lib)
    }
}

impl EpGroup {
    /// `ncclEpCreateGroup` on `comm` (collective: every rank with the same spec), then
    /// `ncclEpInitHandle` (expert-major, the spec's top-k) so that no later call allocates
    /// (a graph captured after creation never sees an allocation).
    ///
    /// # Safety
    /// `comm` is a live communicator of `nccl`, the one the library was loaded beside.
    pub unsafe fn create(
        lib: Arc<EpLibrary>,
        nccl: &Api,
        comm: NcclComm,
        spec: EpSpec,
    ) -> Result<Self> {
        let config = spec.config()?;
        let mut group = null_mut();
        // SAFETY: the configuration is a complete V2 structure; `comm` is live (caller).
        let r = unsafe { (lib.fns.create_group)(&mut group, comm, &config) };
        nccl.check("ncclEpCreateGroup", r, Some(comm))?;
        let mut g = EpGroup {
            lib,
            group: group as usize,
            handle: 0,
            spec,
        };
        let (size, magic) = head::<HandleConfig>();
        let hc = HandleConfig {
            size,
            magic,
            dispatch_output_per_expert_alignment: 0,
        };
        let k = c_int::try_from(spec.top_k).unwrap_or(c_int::MAX);
        let mut handle = null_mut();
        // SAFETY: the group was just created; a null handle memory lets the library own it.
        let r = unsafe {
            (g.lib.fns.init_handle)(
                &mut handle,
                g.group as *mut c_void,
                LAYOUT_EXPERT_MAJOR,
                &hc,
                k,
                std::ptr::null(),
            )
        };
        nccl.check("ncclEpInitHandle", r, Some(comm))?;
        g.handle = handle as usize;
        Ok(g)
    }

    /// The capacities.
    pub fn spec(&self) -> EpSpec {
        self.spec
    }

    /// Dispatch of `n` tokens (`tokens`: `[n][hidden]`) by the routing `ids` (`[n][top_k]`
    /// i32, `-1` for none): `ncclEpUpdateHandle` with the routing, then `ncclEpDispatch`
    /// into `out` (`[local][world * max_tokens][hidden]`) with each local expert's count in
    /// `counts` (`[local]` i32).
    ///
    /// # Safety
    /// Every address is device memory of the group's device holding the sizes above, live
    /// until the stream's work ends; `stream` is a stream of that device.
    pub unsafe fn dispatch(
        &self,
        nccl: &Api,
        a: [usize; 4],
        n: usize,
        stream: RawStream,
    ) -> Result<()> {
        let [tokens, ids, out, counts] = a;
        let s = self.spec;
        let (mut ts, mut is) = ([n, s.hidden], [n, s.top_k]);
        let mut os = [s.local(), s.world * s.max_tokens, s.hidden];
        let mut cs = [s.local()];
        let mut t = tensor(s.dtype, tokens, &mut ts);
        let i = tensor(DataType::I32, ids, &mut is);
        let mut o = tensor(s.dtype, out, &mut os);
        let mut c = tensor(DataType::I32, counts, &mut cs);
        // SAFETY: the handle is live; the routing's tensor and its sizes outlive the call.
        let r = unsafe {
            (self.lib.fns.update_handle)(self.handle as *mut c_void, &i, std::ptr::null(), stream)
        };
        nccl.check("ncclEpUpdateHandle", r, None)?;
        let (size, magic) = head::<Inputs>();
        let inputs = Inputs {
            size,
            magic,
            tokens: &mut t,
            topk_weights: null_mut(),
            scales: null_mut(),
        };
        let (size, magic) = head::<DispatchOutputs>();
        let outputs = DispatchOutputs {
            size,
            magic,
            tokens: &mut o,
            topk_weights: null_mut(),
            scales: null_mut(),
            topk_idx: null_mut(),
        };
        let (size, magic) = head::<LayoutInfo>();
        let layout = LayoutInfo {
            size,
            magic,
            expert_counters: &mut c,
            src_rank_counters: null_mut(),
            expert_offsets: null_mut(),
            recv_total_counter: null_mut(),
            recv_topk_idx_kind: 0,
            padding_v2: [0; 4],
        };
        // SAFETY: every descriptor and its sizes live on this frame for the call; the
        // addresses hold the sizes described (the caller's contract).
        let r = unsafe {
            (self.lib.fns.dispatch)(
                self.handle as *mut c_void,
                &inputs,
                &outputs,
                &layout,
                std::ptr::null(),
                stream,
            )
        };
        nccl.check("ncclEpDispatch", r, None)
    }

    /// Combine of the experts' outputs (`expert_out`, the dispatch's layout) into `out`
    /// (`[n][hidden]`), each token's rows weighted by `weights` (`[n][top_k]` f32) by the
    /// library's combine, in the last dispatch's routing.
    ///
    /// # Safety
    /// As [`EpGroup::dispatch`].
    pub unsafe fn combine(
        &self,
        nccl: &Api,
        a: [usize; 3],
        n: usize,
        stream: RawStream,
    ) -> Result<()> {
        let [expert_out, weights, out] = a;
        let s = self.spec;
        let mut es = [s.local(), s.world * s.max_tokens, s.hidden];
        let (mut ws, mut os) = ([n, s.top_k], [n, s.hidden]);
        let mut e = tensor(s.dtype, expert_out, &mut es);
        let mut w = tensor(DataType::F32, weights, &mut ws);
        let mut o = tensor(s.dtype, out, &mut os);
        let (size, magic) = head::<Inputs>();
        let inputs = Inputs {
            size,
            magic,
            tokens: &mut e,
            topk_weights: null_mut(),
            scales: null_mut(),
        };
        let (size, magic) = head::<CombineOutputs>();
        let outputs = CombineOutputs {
            size,
            magic,
            tokens: &mut o,
            topk_weights: &mut w,
        };
        // SAFETY: as in `dispatch`.
        let r = unsafe {
            (self.lib.fns.combine)(
                self.handle as *mut c_void,
                &inputs,
                &outputs,
                std::ptr::null(),
                stream,
            )
        };
        nccl.check("ncclEpCombine", r, None)
    }
}

impl Drop for EpGroup {
    /// The handle, then the group. The owner drops a group on a helper thread within its
    /// communicator's deadline (the library may wait for the device).
    fn drop(&mut self) {
        if self.handle != 0 {
            // SAFETY: the handle was made by `ncclEpInitHandle` and is destroyed once.
            let r = unsafe { (self.lib.fns.handle_destroy)(self.handle as *mut c_void) };
            if r != 0 {
                tracing::warn!("ncclEpHandleDestroy answered {r}");
            }
        }
        // SAFETY: the group was made by `ncclEpCreateGroup` and is destroyed once.
        let r = unsafe { (self.lib.fns.group_destroy)(self.group as *mut c_void) };
        if r != 0 {
            tracing::warn!("ncclEpGroupDestroy answered {r}");
        }
    }
}
