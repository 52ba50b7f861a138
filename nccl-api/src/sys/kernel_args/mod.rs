//! unicomm's symmetric kernels as every runtime loads them, and what they take
//! (`nccl-api/kernels/symmetric.cu`'s `Params` and `Control`, field for field): the fat
//! binary built from the source beside it (`cargo xtask kernels`), the launch's argument,
//! passed by value, and the communicator's control block in host memory the device maps
//! (the host's abort word and the first fault a kernel reports). One source for every
//! runtime: CUDA loads the image, and so does HIP on an NVIDIA GPU (HIP-on-CUDA).

use unicomm_core::symmetric::{MAX_SYMMETRIC_WORLD, SIGNATURE_WORDS};

/// The symmetric kernels as a CUDA fat binary, built from `kernels/symmetric.cu` by `cargo
/// xtask kernels`: SASS for each of [`SYMMETRIC_SASS`] (assembled by CUDA 12.8's `ptxas`)
/// and the PTX, declared at ISA [`SYMMETRIC_PTX_ISA`], for newer GPUs; so it loads on the
/// drivers of [`SYMMETRIC_DRIVER_FLOOR`] and newer (nvcc 13's own PTX, ISA 9.0, needed a
/// CUDA 13 driver, r580). Its table: [`fatbin::images`](super::fatbin::images).
pub const SYMMETRIC_IMAGE: &[u8] = include_bytes!("../../../kernels/symmetric.fatbin");

/// The GPU architectures [`SYMMETRIC_IMAGE`] holds SASS for (H100/H200, B200).
pub const SYMMETRIC_SASS: [u32; 2] = [90, 100];

/// The PTX ISA of [`SYMMETRIC_IMAGE`]'s PTX: the lowest that CUDA 12.8's `ptxas` accepts for
/// what nvcc 13 emits (`used_bytes_mask` is 8.3's).
pub const SYMMETRIC_PTX_ISA: (u32, u32) = (8, 3);

/// The oldest CUDA driver that takes every image of [`SYMMETRIC_IMAGE`], as
/// `cuDriverGetVersion` says it (12.3, driver r545: PTX ISA 8.3 is CUDA 12.3's). On sm_90
/// and sm_100 the driver takes the SASS, which does not need its PTX compiler.
pub const SYMMETRIC_DRIVER_FLOOR: i32 = 12030;

/// The symmetric kernels' functions for f32, f16 and bf16.
pub const SYMMETRIC_FUNCTIONS: [&str; 3] = [
    "unicomm_symmetric_f32",
    "unicomm_symmetric_f16",
    "unicomm_symmetric_bf16",
];

/// The empty kernel of the same module: the floor of a launch (unicomm-bench's `--floor`).
pub const SYMMETRIC_EMPTY: &str = "unicomm_symmetric_empty";

/// The place of `dtype`'s function in a kernel module's table (f32, f16, bf16: the order of
/// [`SYMMETRIC_FUNCTIONS`] and of the device-API kernel's); another type is refused naming
/// `what` (the kernels).
pub fn function_index(dtype: unicomm_core::DataType, what: &str) -> unicomm_core::Result<usize> {
    use unicomm_core::DataType;
    match dtype {
        DataType::F32 => Ok(0),
        DataType::F16 => Ok(1),
        DataType::Bf16 => Ok(2),
        other => Err(unicomm_core::Error::invalid(
            "dtype",
            format!("{other}: {what} reduce f32, f16, bf16"),
        )),
    }
}

/// A reduction's code in a kernel's argument (`OP_*` in the kernel sources): 0 sum, 1 max,
/// 2 min (the kernels take no other; the callers check it first).
pub fn op_code(op: unicomm_core::ReduceOp) -> u32 {
    match op {
        unicomm_core::ReduceOp::Max => 1,
        unicomm_core::ReduceOp::Min => 2,
        _ => 0,
    }
}

/// Threads of a symmetric kernel's one block (`BLOCK` in the source's launch bounds).
pub const SYMMETRIC_BLOCK: u32 = 512;

/// The algorithm code of a launch (`ALG_*` in the kernel source).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum KernelAlgorithm {
    /// Every rank's data read and reduced between two barriers.
    OneShot = 0,
    /// Reduce-scatter and all-gather by peer loads.
    TwoShot = 1,
    /// Lamport's poison, no barrier.
    Lamport = 2,
    /// A barrier on the signal pads alone.
    Barrier = 3,
    /// Expert parallelism's dispatch ([`ExpertArgs`]).
    Dispatch = 4,
    /// Expert parallelism's combine ([`ExpertArgs`]).
    Combine = 5,
    /// The all-to-all with counts on the device (its splits in [`ExpertArgs::meta`]).
    AllToAllV = 6,
}

/// One launch's argument (`Params`): every rank's data and pad, the operands, the control
/// block, the deadline, the sizes, the codes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelParams {
    /// Each rank's data at its address in this process (0 past the world).
    pub peers: [u64; MAX_SYMMETRIC_WORLD],
    /// Each rank's signal pad.
    pub pads: [u64; MAX_SYMMETRIC_WORLD],
    /// This rank's result.
    pub out: u64,
    /// The fused norm's residual (0 without it).
    pub residual: u64,
    /// The fused norm's weight (0 without it).
    pub weight: u64,
    /// The fused norm's FP8 (e4m3) output (0 without it).
    pub out8: u64,
    /// The FP8 output's scale, one f32 on the device (0 without it).
    pub scale: u64,
    /// The communicator's [`Control`], at its device address.
    pub control: u64,
    /// How long a wait on a peer lasts, from the kernel's start, in nanoseconds.
    pub timeout_ns: u64,
    /// Elements.
    pub count: u64,
    /// Elements per row of the fused norm (0 without it).
    pub hidden: u64,
    /// Byte offset of the Lamport workspace from a rank's data.
    pub lamport: u64,
    /// Bytes of one Lamport slot.
    pub slot: u64,
    /// This rank.
    pub rank: u32,
    /// Ranks.
    pub world: u32,
    /// [`KernelAlgorithm`] as its code.
    pub algorithm: u32,
    /// 0 sum, 1 max, 2 min.
    pub op: u32,
    /// 1 with the fused norm.
    pub norm: u32,
    /// The norm's epsilon.
    pub eps: f32,
    /// The call's signature ([`unicomm_core::symmetric::Signature`]), the round word 0.
    pub sig: [u32; SIGNATURE_WORDS],
    /// Lamport: 1 where the call's type is the workspace's (else only its headers move).
    pub typed: u32,
    /// 1 where the allocation has Lamport workspaces (a barrier kernel then also looks
    /// for a peer's Lamport header).
    pub workspace: u32,
    /// 1 where every rank is on this GPU: the kernels fence at GPU scope, not system scope.
    pub local: u32,
    /// The grid asked for ([`symmetric_blocks`]; a launcher clamps it to what its GPU holds
    /// at once).
    pub blocks: u32,
    /// An expert dispatch's or combine's operands (zero for the other kernels).
    pub x: ExpertArgs,
}

/// An expert dispatch's or combine's operands (the source's `Expert`), over the group's
/// layout (`unicomm_core::symmetric::ExpertGroupParts`): the launch's `peers` and `pads`
/// are the receive slots', its `out` the dispatch's expert-major rows or the combine's
/// tokens, its `hidden` the elements of a row.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ExpertArgs {
    /// Each rank's counts (`L * W` i64), then its slots' origins; an all-to-all's: its
    /// splits (`3 x W` i64).
    pub meta: [u64; MAX_SYMMETRIC_WORLD],
    /// Each rank's landing rows (`[M][K]` rows of the group's type).
    pub back: [u64; MAX_SYMMETRIC_WORLD],
    /// Each rank's FP8 scale slots, or 0 (a dispatch of the group's type).
    pub scales: [u64; MAX_SYMMETRIC_WORLD],
    /// The dispatch's tokens (`[n]` rows), the combine's experts' rows (`[L][W * M]`).
    pub tokens: u64,
    /// `[n][K]` i32.
    pub ids: u64,
    /// `[n][K]` f32 (the combine's).
    pub weights: u64,
    /// The dispatch's `[L]` i32.
    pub counts: u64,
    /// An FP8 dispatch's `[n][per_token]` f32.
    pub in_scales: u64,
    /// An FP8 dispatch's `[L][W * M][per_token]` f32.
    pub out_scales: u64,
    /// The layout's masked ranks, rank `r` at bit `r`.
    pub masked: u64,
    /// Experts in all.
    pub experts: u32,
    /// A slot's capacity.
    pub max_tokens: u32,
    /// Experts per token.
    pub top_k: u32,
    /// This rank's tokens.
    pub n: u32,
    /// An FP8 dispatch's scales a token.
    pub per_token: u32,
    /// Ranks of the layout (the group's and its masked ones).
    pub layout_world: u32,
    /// Bytes of a row moved (a token of the group's type, or an FP8 token).
    pub row_bytes: u32,
    /// The high-throughput layout's packed rows a rank (0: the low-latency layout).
    pub max_recv: u32,
}

/// One launch of one of unicomm's kernels, as a runtime's one launch call
/// (`Runtime::launch`) takes it.
#[derive(Debug, Clone, Copy)]
pub enum Launch<'a> {
    /// The symmetric kernels: one `Params` by value, the grid its `blocks` asks for.
    Symmetric(&'a KernelParams),
    /// The device-API kernel: a device communicator's struct and one `Args` by value.
    DeviceApi {
        /// The device communicator's bytes.
        dev_comm: &'a [u8],
        /// The kernel's arguments.
        args: &'a DeviceKernelArgs,
        /// Blocks (one LSA barrier each).
        blocks: u32,
    },
}

impl From<unicomm_core::symmetric::SymmetricAlgorithm> for KernelAlgorithm {
    fn from(a: unicomm_core::symmetric::SymmetricAlgorithm) -> Self {
        use unicomm_core::symmetric::SymmetricAlgorithm as A;
        match a {
            A::OneShot => KernelAlgorithm::OneShot,
            A::TwoShot => KernelAlgorithm::TwoShot,
            A::Lamport => KernelAlgorithm::Lamport,
        }
    }
}

/// The grid a launch of unicomm's symmetric all-reduce asks for (`count` elements of `dtype`,
/// the fused norm's rows of `hidden` where it has one): one block per 1,024 16-byte vectors
/// of data (two per thread), one per row of the fused norm (whose rows a block normalizes
/// after reducing them; the two-shot's fused norm one block, its rows gathered from every
/// block), at most [`MAX_SYMMETRIC_BLOCKS`](unicomm_core::symmetric::MAX_SYMMETRIC_BLOCKS).
/// A barrier is one block.
pub fn symmetric_blocks(
    algorithm: unicomm_core::symmetric::SymmetricAlgorithm,
    count: usize,
    dtype: unicomm_core::DataType,
    hidden: Option<usize>,
) -> u32 {
    use unicomm_core::symmetric::SymmetricAlgorithm as A;
    let max = unicomm_core::symmetric::MAX_SYMMETRIC_BLOCKS;
    match (algorithm, hidden) {
        (A::TwoShot, Some(_)) => 1,
        (_, Some(hidden)) => (count / hidden.max(1)).clamp(1, max) as u32,
        (_, None) => vector_blocks(count * dtype.size()),
    }
}

/// The grid for `bytes` moved in 16-byte vectors, two a thread, at most
/// [`MAX_SYMMETRIC_BLOCKS`](unicomm_core::symmetric::MAX_SYMMETRIC_BLOCKS).
pub fn vector_blocks(bytes: usize) -> u32 {
    let g = bytes.div_ceil(16 * 2 * SYMMETRIC_BLOCK as usize);
    g.clamp(1, unicomm_core::symmetric::MAX_SYMMETRIC_BLOCKS) as u32
}

/// The release whose device-API headers unicomm's device-API kernel was built against
/// (`backend-nccl/kernels/device_api.cu`): it takes a device communicator of that layout,
/// which NCCL fills from that release on.
pub const DEVICE_KERNEL_HEADERS: unicomm_core::Version = unicomm_core::Version::new(2, 32, 3);
/// `sizeof(ncclDevComm)` in those headers (the source asserts the same number).
pub const DEVICE_KERNEL_DEV_COMM_BYTES: usize = 248;
/// The most blocks a device-API kernel's launch takes (one LSA barrier each).
pub const DEVICE_KERNEL_MAX_BLOCKS: u32 = 32;

/// The requirements of a device communicator that unicomm's device-API kernel takes
/// (`Comm::all_reduce_device`): the layout of the headers it was built against,
/// `lsa_barriers` barriers (a block each, at most [`DEVICE_KERNEL_MAX_BLOCKS`] used).
pub fn device_kernel_requirements(
    lsa_barriers: u32,
) -> unicomm_core::device_api::DeviceCommRequirements {
    unicomm_core::device_api::DeviceCommRequirements {
        layout: unicomm_core::device_api::DeviceCommLayout::Built {
            version: DEVICE_KERNEL_HEADERS,
            size: DEVICE_KERNEL_DEV_COMM_BYTES,
        },
        lsa_barriers,
        lsa_multimem: false,
    }
}

/// The operands of unicomm's device-API kernel after its device communicator (the
/// source's `Args`), passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceKernelArgs {
    /// The `send` window (`ncclWindow_t`).
    pub send: u64,
    /// Its byte offset.
    pub send_off: u64,
    /// The `recv` window.
    pub recv: u64,
    /// Its byte offset.
    pub recv_off: u64,
    /// Elements.
    pub count: u64,
    /// The communicator's [`Control`], at its device address (the abort word the kernel
    /// watches between NCCL's timed barrier waits, and where it reports a fault).
    pub control: u64,
    /// How long a wait on a peer lasts, from the kernel's start, in nanoseconds.
    pub timeout_ns: u64,
    /// 0 sum, 1 max, 2 min.
    pub op: u32,
    /// This rank (named by a fault).
    pub rank: u32,
}

/// The fault codes a kernel reports in [`Control::fault`].
pub mod fault {
    /// A peer never arrived by the deadline (the world's pads poisoned).
    pub const TIMEOUT: u32 = 1;
    /// The host aborted the communicator.
    pub const ABORTED: u32 = 2;
    /// A peer's call differs: `rank` names it, `epoch` holds this rank's differing
    /// signature word, `detail` the word's index `<< 32 |` the peer's word.
    pub const MISMATCH: u32 = 3;
    /// A peer gave up at its deadline (this rank's pad poisoned).
    pub const POISONED: u32 = 4;
    /// An LSA peer never arrived at NCCL's barrier of the device-API kernel by the deadline.
    pub const BARRIER: u32 = 5;
    /// Every rank called a Lamport all-reduce of another type than the workspace's.
    pub const TYPE: u32 = 6;
    /// The rank `rank` names released its part without making the call.
    pub const GONE: u32 = 7;
}

/// The refusals a kernel reports in [`Control::refused`]: a call every rank refuses alike,
/// the communicator going on.
pub mod refused {
    /// A dispatch's slot would hold more tokens than the group's capacity.
    pub const CAPACITY: u32 = 1;
    /// A routing named an expert outside the group's.
    pub const EXPERT: u32 = 2;
    /// An all-to-all's split was negative.
    pub const SPLIT: u32 = 3;
    /// A rank would send more than its input holds.
    pub const SENT: u32 = 4;
    /// A rank would receive more than the bound (the input's size).
    pub const RECEIVED: u32 = 5;
    /// A rank would receive more token copies than the high-throughput group's `max_recv`.
    pub const PACKED: u32 = 6;
}

/// The communicator's control block (`Control`), in host memory the device maps.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Control {
    /// Set to 1 by the host at abort; every wait of a kernel watches it.
    pub abort: u32,
    /// The fault's code ([`fault`]), 0 while none; written last, after its fields and a
    /// system fence.
    pub fault: u32,
    /// The rank it names (the one that never arrived, or whose count differs).
    pub rank: u32,
    /// The barrier epoch or Lamport round it happened in.
    pub epoch: u32,
    /// A mismatch: the differing signature word's index `<< 32 |` that rank's word.
    pub detail: u64,
    /// The first refusal's code ([`refused`]), 0 while none; cleared by the host once read.
    pub refused: u32,
    /// The source rank it names.
    pub refused_rank: u32,
    /// The expert `<< 32 |` the (group) rank holding it; an all-to-all's: the peer of a
    /// negative split, else the bound.
    pub refused_at: u64,
    /// A capacity refusal: the tokens `<< 32 |` the capacity; an expert's: the experts; an
    /// all-to-all's: the split, or the elements sent or received.
    pub refused_count: u64,
}

#[cfg(test)]
mod tests;
