//! Symmetric memory as a backend receives it: one allocation per rank of a communicator,
//! every rank's mapped on every rank ([`SymmetricParts`]), a signal pad per rank (its
//! layout: [`PAD_EPOCH`], [`pad_arrival`]), and the operations unicomm's own kernels run on
//! it ([`SymmetricOp`]). The typed allocation is [`Symmetric`](crate::Symmetric); an
//! engine's own kernels take [`SymmetricArgs`].

use crate::element::ReduceOp;
use crate::op::Slice;
use crate::registry::RawHandle;
use crate::{DataType, Error, Result};

mod algorithm;
mod expert;
mod signature;
pub use algorithm::{RmsNormOptions, SymmetricAlgorithm, SymmetricOptions};
pub use expert::{
    Combine, Dispatch, ExpertConfig, ExpertEngine, ExpertGroupParts, ExpertMode, ExpertOptions,
    Fp8Tokens, RankMask,
};
pub use signature::{
    compare, mismatch, with_word, Signature, SignedOp, LAMPORT_HEADER, SIGNATURE_ROUND,
    SIGNATURE_WORDS,
};

/// The most ranks a symmetric allocation spans (one NVLink domain's GPUs; the size of the
/// kernel argument's peer table).
pub const MAX_SYMMETRIC_WORLD: usize = 16;

/// The most thread blocks one launch of unicomm's symmetric kernels runs on the GPUs (each
/// block past the first meets the same block of every peer on its own arrival words,
/// [`pad_block_arrival`]).
pub const MAX_SYMMETRIC_BLOCKS: usize = 128;

/// Bytes of one rank's signal pad: a `u32` epoch ([`PAD_EPOCH`]) and one `u32` arrival
/// word per peer ([`pad_arrival`]), the `u32` Lamport round ([`PAD_ROUND`]), the poison
/// word ([`PAD_POISON`]), two signatures ([`PAD_SIGNATURE`]), the departure words
/// ([`PAD_GONE`]), the launch's words of the GPU kernels' grid ([`PAD_CALL`] to
/// [`pad_used`]), then from [`PAD_BLOCKS`] the arrival words of every block past the first.
pub const PAD_BYTES: usize = pad_block_arrival(MAX_SYMMETRIC_BLOCKS, 0);
/// Byte offset, in a rank's pad, of its barrier epoch: the number of barriers it entered
/// (wrapping `u32`), kept in the pad so that a graph's replays count on from the last.
pub const PAD_EPOCH: usize = 0;
/// Byte offset, in a rank's pad, of its Lamport round: the number of Lamport all-reduces
/// it ran on the allocation (wrapping `u32`; the round picks one of three workspaces).
pub const PAD_ROUND: usize = 8 + 4 * MAX_SYMMETRIC_WORLD;

/// Byte offset, in a rank's pad, of its poison word on the GPUs: 0, or 1 + the rank whose
/// kernel gave up at its deadline and so ended every peer's waits (the mock poisons its
/// world instead and leaves the word 0).
pub const PAD_POISON: usize = PAD_ROUND + 4;

/// Byte offset, in a rank's pad, of the signatures of its calls ([`Signature`]): two of
/// [`SIGNATURE_WORDS`] `u32` words, the one of the call whose first barrier has epoch `e`
/// at `pad_signature(e)`. A call writes its own before that barrier and every rank reads
/// every rank's after it; two places, so that a rank that passed the barrier and went on
/// to its next call never overwrites the one a slower peer still reads.
pub const PAD_SIGNATURE: usize = PAD_POISON + 4;

/// Byte offset, in a rank's pad, of the departure words: one `u32` per rank
/// ([`pad_gone`]), 0 while that rank holds its part, 1 once its view of the allocation
/// ended after its last kernel on it (freed, or its communicator ended): it writes its word
/// into every rank's pad then. A rank waiting on a peer whose word is 1 in its own pad (and
/// whose awaited word never came) ends at once: that peer will never make the call.
pub const PAD_GONE: usize = PAD_SIGNATURE + 2 * LAMPORT_HEADER;

/// Byte offset, in a rank's pad, of rank `q`'s departure word.
pub const fn pad_gone(q: usize) -> usize {
    PAD_GONE + 4 * q
}

/// Byte offset, in a rank's pad, of the number of kernel launches on the allocation
/// (wrapping `u32`; the GPU kernels' blocks past the first meet with values from it; the
/// last block of a launch advances it).
pub const PAD_CALL: usize = PAD_GONE + 4 * MAX_SYMMETRIC_WORLD;
/// Byte offset, in a rank's pad, of the count of a launch's blocks that finished.
pub const PAD_DONE: usize = PAD_CALL + 4;
/// Byte offset, in a rank's pad, of block 0's verdict: the launch's number + 1 where block
/// 0 found the ranks disagreeing or gave up (the other blocks' waits end there).
pub const PAD_VERDICT: usize = PAD_DONE + 4;
/// Byte offset, in a rank's pad, of the launch's number + 1 where a Lamport header or
/// element never came (the round is not advanced).
pub const PAD_HOLD: usize = PAD_VERDICT + 4;

/// Byte offset, in a rank's pad, of the bytes of each slot that Lamport workspace `b` (of
/// three) holds since its round: what the round two on clears back to the poison.
pub const fn pad_used(b: usize) -> usize {
    PAD_HOLD + 4 + 4 * b
}

/// Byte offset, in a rank's pad, of the count of this rank's blocks that arrived at the
/// launch's grid-wide barriers (a kernel whose blocks read what the others wrote: expert
/// dispatch and combine); back to 0 at the launch's end.
pub const PAD_GRID: usize = pad_used(3);

/// Byte offset, in a rank's pad, of the blocks' arrival words.
pub const PAD_BLOCKS: usize = 256;

/// Byte offset, in a rank's pad, of the arrival word block `b` (> 0) of peer `p` writes:
/// `4 * launch + i` of that block's `i`-th barrier of the launch.
pub const fn pad_block_arrival(b: usize, p: usize) -> usize {
    PAD_BLOCKS + 4 * (b * MAX_SYMMETRIC_WORLD + p)
}

/// Byte offset, in a rank's pad, of the signature of the call whose first barrier has
/// epoch `e`.
pub const fn pad_signature(e: u32) -> usize {
    PAD_SIGNATURE + (e as usize % 2) * LAMPORT_HEADER
}

/// Byte offset, in a rank's pad, of the arrival word peer `p` writes: the epoch of the last
/// barrier `p` entered with this rank's world (wrapping `u32`; a barrier of epoch `e` is
/// passed once every peer's word, read as `(word - e) as i32`, is at least 0).
pub const fn pad_arrival(p: usize) -> usize {
    8 + 4 * p
}

/// One rank's view of a symmetric allocation, as a backend made it.
#[derive(Debug)]
pub struct SymmetricParts<M> {
    /// This rank's own allocation (its data from byte 0).
    pub mem: M,
    /// The allocation's handle on its communicator.
    pub handle: RawHandle,
    /// Each rank's data, at its address in this process (this rank's own included).
    pub peers: Vec<usize>,
    /// Each rank's signal pad ([`PAD_BYTES`]), at its address in this process.
    pub pads: Vec<usize>,
    /// Bytes of data per rank.
    pub bytes: usize,
}

impl<M> SymmetricParts<M> {
    /// One rank's view where every rank's part holds its data from byte 0 and its signal
    /// pad from byte `pad_at` (the data rounded up), as both backends lay a part out.
    pub fn laid_out(
        mem: M,
        handle: RawHandle,
        peers: Vec<usize>,
        pad_at: usize,
        bytes: usize,
    ) -> Self {
        let pads = peers.iter().map(|&p| p + pad_at).collect();
        SymmetricParts {
            mem,
            handle,
            peers,
            pads,
            bytes,
        }
    }
}

/// Why a symmetric kernel is refused inside a group, on every backend.
pub fn refused_in_group() -> Error {
    Error::invalid(
        "group",
        "unicomm's symmetric kernels are not the library's calls: they run where they are enqueued, not at a group's end (call them outside the group)",
    )
}

/// The residual add and RMSNorm fused after a symmetric all-reduce: for each row of
/// `hidden` elements, `residual = allreduce(input) + residual`, then
/// `out = residual / sqrt(mean(residual^2) + eps) * weight` (computed in f32).
#[derive(Debug)]
pub struct RmsNorm<'a, M> {
    /// Read and overwritten with the sum (the next layer's residual).
    pub residual: Slice<'a, M>,
    /// `hidden` elements.
    pub weight: Slice<'a, M>,
    /// Elements per row.
    pub hidden: usize,
    /// Added to the mean of squares.
    pub eps: f32,
    /// The normalized result also as FP8, if asked for.
    pub fp8: Option<Fp8Out<'a, M>>,
}

/// The fused step's result also quantized to FP8 (OCP e4m3), as TensorRT-LLM's and
/// FlashInfer's fusions give it to the next layer's FP8 GEMM: element `i` is
/// `out[i] * scale`, saturated to e4m3's finite range (±448) and rounded to nearest even,
/// `out[i]` the normalized result in the input's type.
#[derive(Debug)]
pub struct Fp8Out<'a, M> {
    /// `count` bytes of e4m3.
    pub out: Slice<'a, M>,
    /// One f32 on the device, read at the kernel's run (a graph's replays read it anew).
    pub scale: Slice<'a, M>,
}

impl<M> Clone for Fp8Out<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for Fp8Out<'_, M> {}

impl<M> Clone for RmsNorm<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for RmsNorm<'_, M> {}

/// One operation on symmetric memory, as a backend receives it.
#[derive(Debug)]
pub enum SymmetricOp<'a, M> {
    /// An all-reduce of the first `count` elements of every rank's data into `out` (and,
    /// with `norm`, the fused residual add and RMSNorm).
    AllReduce {
        /// The symmetric allocation.
        handle: RawHandle,
        /// Elements.
        count: usize,
        /// Element type: f32, f16 or bf16.
        dtype: DataType,
        /// Sum, max or min.
        op: ReduceOp,
        /// How the data moves.
        algorithm: SymmetricAlgorithm,
        /// This rank's result (`count` elements).
        out: Slice<'a, M>,
        /// The fused norm, if any.
        norm: Option<RmsNorm<'a, M>>,
    },
    /// A barrier over the allocation's signal pads, in stream order.
    Barrier {
        /// The symmetric allocation.
        handle: RawHandle,
    },
    /// An all-to-all whose counts are on the device ([`AllToAllV`]).
    AllToAllV(AllToAllV<'a, M>),
    /// Expert parallelism's dispatch ([`Dispatch`]).
    Dispatch(Dispatch<'a, M>),
    /// Expert parallelism's combine ([`Combine`]).
    Combine(Combine<'a, M>),
}

/// An all-to-all with its counts on the device, read when the work runs (PyTorch's
/// `all_to_all_vdev`): rank `r`'s input holds, packed in rank order, `splits[q]` elements
/// for each rank `q` (row 0 of its `splits` allocation, `3 x world` i64); each rank receives
/// its part from every rank, packed in rank order into `out`, and the work writes row 1
/// (what it received from each rank) and row 2 (where that lies in `out`) of its `splits`.
/// Every rank reads every rank's row 0, so every rank finds the same fault: a negative
/// count, a rank sending more than its input holds or receiving more than the input's size
/// (`capacity`, the bound on `out` too) is `InvalidArgument` on every rank, nothing moved.
#[derive(Debug)]
pub struct AllToAllV<'a, M> {
    /// The input's symmetric allocation.
    pub handle: RawHandle,
    /// The splits' symmetric allocation (`3 x world` i64).
    pub splits: RawHandle,
    /// Element type.
    pub dtype: DataType,
    /// Elements of the input per rank: the most a rank sends, and the most it receives.
    pub capacity: usize,
    /// This rank's output (`capacity` elements).
    pub out: Slice<'a, M>,
}

impl<M> Clone for AllToAllV<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for AllToAllV<'_, M> {}

impl<M> Clone for SymmetricOp<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for SymmetricOp<'_, M> {}

impl<'a, M> SymmetricOp<'a, M> {
    /// What every rank's call must agree on.
    pub fn signature(&self) -> Signature {
        match self {
            SymmetricOp::Barrier { .. } => Signature::barrier(),
            SymmetricOp::Dispatch(d) => {
                expert::signature(SignedOp::Dispatch, &d.group, d.fp8.is_some())
            }
            SymmetricOp::Combine(c) => expert::signature(SignedOp::Combine, &c.group, false),
            SymmetricOp::AllToAllV(a) => Signature {
                op: SignedOp::AllToAllV,
                dtype: Some(a.dtype),
                reduce: None,
                count: a.capacity,
                norm: None,
                masked: 0,
            },
            SymmetricOp::AllReduce {
                count,
                dtype,
                op,
                algorithm,
                norm,
                ..
            } => Signature {
                op: SignedOp::AllReduce(*algorithm),
                dtype: Some(*dtype),
                reduce: Some(*op),
                count: *count,
                norm: norm.map(|n| (n.hidden, n.eps)),
                masked: 0,
            },
        }
    }

    /// The same operation over another memory type (`None`: memory of another backend, an
    /// `InvalidArgument` error).
    pub fn map_mem<N>(self, f: impl Fn(&'a M) -> Option<&'a N>) -> Result<SymmetricOp<'a, N>> {
        let slice = |s: Slice<'a, M>, arg: &'static str| s.map_mem(&f, arg);
        Ok(match self {
            SymmetricOp::Barrier { handle } => SymmetricOp::Barrier { handle },
            SymmetricOp::Dispatch(d) => SymmetricOp::Dispatch(d.map_mem(f)?),
            SymmetricOp::Combine(c) => SymmetricOp::Combine(c.map_mem(f)?),
            SymmetricOp::AllToAllV(a) => SymmetricOp::AllToAllV(AllToAllV {
                out: slice(a.out, "out")?,
                handle: a.handle,
                splits: a.splits,
                dtype: a.dtype,
                capacity: a.capacity,
            }),
            SymmetricOp::AllReduce {
                handle,
                count,
                dtype,
                op,
                algorithm,
                out,
                norm,
            } => SymmetricOp::AllReduce {
                handle,
                count,
                dtype,
                op,
                algorithm,
                out: slice(out, "out")?,
                norm: match norm {
                    None => None,
                    Some(n) => Some(RmsNorm {
                        residual: slice(n.residual, "residual")?,
                        weight: slice(n.weight, "weight")?,
                        hidden: n.hidden,
                        eps: n.eps,
                        fp8: match n.fp8 {
                            None => None,
                            Some(q) => Some(Fp8Out {
                                out: slice(q.out, "fp8 out")?,
                                scale: slice(q.scale, "fp8 scale")?,
                            }),
                        },
                    }),
                },
            },
        })
    }
}

/// What every backend checks of an all-reduce before its kernel runs, on an allocation of
/// `bytes` per rank with the Lamport workspace of `lamport`: the count inside the
/// allocation, the workspace of this type for [`SymmetricAlgorithm::Lamport`], the output
/// (and the fused norm's residual and weight) large enough. That the memory is this
/// rank's is the backend's check.
pub fn check_all_reduce<M: crate::DeviceMemory>(
    bytes: usize,
    lamport: Option<DataType>,
    count: usize,
    dtype: DataType,
    algorithm: SymmetricAlgorithm,
    out: &Slice<'_, M>,
    norm: Option<&RmsNorm<'_, M>>,
) -> Result<()> {
    if count.checked_mul(dtype.size()).is_none_or(|b| b > bytes) {
        return Err(Error::invalid(
            "count",
            format!("{count} x {dtype} past the {bytes}-byte allocation"),
        ));
    }
    // A Lamport call of another type than the workspace's still runs its header exchange
    // (every rank then reports it alike): only a workspace that is not there is this
    // rank's own refusal, and it is the same on every rank (the allocation is collective).
    if algorithm == SymmetricAlgorithm::Lamport && lamport.is_none() {
        return Err(Error::invalid(
            "algorithm",
            "the allocation has no Lamport workspace (alloc_symmetric_lamport makes one)",
        ));
    }
    out.holds(count, dtype, "out")?;
    if let Some(n) = norm {
        n.residual.holds(count, dtype, "residual")?;
        n.weight.holds(n.hidden, dtype, "weight")?;
        if let Some(q) = &n.fp8 {
            q.out.holds(count, DataType::F8E4M3, "fp8 out")?;
            q.scale.holds(1, DataType::F32, "fp8 scale")?;
        }
    }
    Ok(())
}

/// The element types unicomm's symmetric kernels reduce.
pub fn check_symmetric_type(dtype: DataType) -> Result<()> {
    match dtype {
        DataType::F32 | DataType::F16 | DataType::Bf16 => Ok(()),
        other => Err(Error::unsupported(
            format!("a symmetric all-reduce of {other}"),
            "f32, f16 or bf16 (unicomm's symmetric kernels)",
            other.name(),
        )),
    }
}

/// The reductions unicomm's symmetric kernels run.
pub fn check_symmetric_op(op: ReduceOp) -> Result<()> {
    match op {
        ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min => Ok(()),
        other => Err(Error::invalid(
            "op",
            format!("{other:?}: unicomm's symmetric kernels reduce by sum, max or min"),
        )),
    }
}

/// What an engine's own kernel takes to reach a symmetric allocation: this rank, the world,
/// the bytes of data per rank, and every rank's data and signal pad at their addresses in
/// this process (entries past `world` are 0). `#[repr(C)]`, passed by value as a kernel
/// argument (`MAX_SYMMETRIC_WORLD` x 16 + 16 bytes).
///
/// The rules a kernel keeps (the one `unsafe` step is the engine's launch):
/// - the addresses are valid while the [`Symmetric`](crate::Symmetric) lives and
///   only inside `bytes` of data (and [`PAD_BYTES`] of pad) from each;
/// - a kernel reads a peer's data only after a barrier that follows the peer's writes (on
///   the pads: [`PAD_EPOCH`], [`pad_arrival`]), and writes a peer's data only where the
///   peer reads it after a later barrier;
/// - a kernel that waits on a peer's word also gives up at a deadline or an abort flag, as
///   unicomm's do: a dead peer must not hang the GPU.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymmetricArgs {
    /// This rank.
    pub rank: u32,
    /// Ranks.
    pub world: u32,
    /// Bytes of data per rank.
    pub bytes: u64,
    /// Each rank's data.
    pub peers: [u64; MAX_SYMMETRIC_WORLD],
    /// Each rank's signal pad.
    pub pads: [u64; MAX_SYMMETRIC_WORLD],
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pad's words fit its bytes for the largest world, and the layout a kernel reads
    /// is the documented one.
    #[test]
    fn the_pad_layout_fits_and_the_kernel_argument_is_c_sized() {
        const { assert!(pad_arrival(MAX_SYMMETRIC_WORLD - 1) + 4 <= PAD_ROUND) };
        const { assert!(pad_signature(1) + LAMPORT_HEADER <= PAD_GONE) };
        const { assert!(PAD_GRID + 4 <= PAD_BLOCKS) };
        assert_eq!(
            std::mem::size_of::<SymmetricArgs>(),
            16 + 16 * MAX_SYMMETRIC_WORLD
        );
        assert_eq!(
            std::mem::offset_of!(SymmetricArgs, pads),
            16 + 8 * MAX_SYMMETRIC_WORLD
        );
    }

    #[test]
    fn only_float_sums_maxima_and_minima() {
        assert!(check_symmetric_type(DataType::Bf16).is_ok());
        assert!(check_symmetric_type(DataType::I32).is_err());
        assert!(check_symmetric_op(ReduceOp::Min).is_ok());
        assert!(check_symmetric_op(ReduceOp::Avg).is_err());
    }
}
