//! Symmetric memory, typed: [`Symmetric`] (one allocation per rank, every rank's mapped on
//! every rank, a signal pad per rank) and unicomm's own kernels on it, an all-reduce of
//! three algorithms and the fused all-reduce + residual add + RMSNorm. Checked here (types,
//! reductions, counts, this rank's memory) before anything is enqueued.

use std::marker::PhantomData;
use std::ops::RangeBounds;

use super::Comm;
use crate::backend::Collective;
use crate::buffer::{owned_buffer_methods, range_of, DeviceSliceMut, View, ViewMut};
use crate::element::Element;
use crate::fp8::F8E4M3;
use crate::registry::RawHandle;
use crate::symmetric::{
    check_symmetric_op, check_symmetric_type, AllToAllV, Fp8Out, RmsNorm, SymmetricAlgorithm,
    SymmetricArgs, SymmetricOp, SymmetricOptions, SymmetricParts, MAX_SYMMETRIC_WORLD,
};
use crate::{Error, Result};

/// A symmetric allocation: `len` elements on every rank of the communicator, each rank's
/// mapped on every rank, with a signal pad per rank. It borrows its communicator (which
/// cannot end while it lives) and is this rank's buffer for every other call (a
/// [`DeviceSlice`](crate::DeviceSlice)). Dropping it releases this rank's view; work still pending on it keeps
/// what it uses, and peers' views stay valid (memory is freed when its last mapping goes).
pub struct Symmetric<'c, T: Element, C: Collective> {
    comm: &'c Comm<C>,
    mem: C::Memory,
    handle: RawHandle,
    /// Whether this rank's view is still to be released (by the drop, unless
    /// [`Comm::free_symmetric`] did).
    held: bool,
    len: usize,
    peers: Vec<usize>,
    pads: Vec<usize>,
    lamport: bool,
    _t: PhantomData<T>,
}

owned_buffer_methods!(['c, T: Element, C: Collective] Symmetric<'c, T, C>, self => &self.mem, self.len);

impl<T: Element, C: Collective> Symmetric<'_, T, C> {
    /// Where rank `rank`'s data lies in this process (`InvalidArgument` for a rank outside
    /// the world): a number, to hand to an engine's kernel ([`Symmetric::kernel_args`]).
    pub fn peer_address(&self, rank: usize) -> Result<usize> {
        self.peers.get(rank).copied().ok_or_else(|| {
            Error::invalid(
                "rank",
                format!("rank {rank} is not in a world of {}", self.peers.len()),
            )
        })
    }

    /// What an engine's own kernel takes to reach every rank's data and signal pad (the
    /// rules it keeps: [`SymmetricArgs`]).
    pub fn kernel_args(&self) -> SymmetricArgs {
        let table = |v: &[usize]| {
            let mut t = [0u64; MAX_SYMMETRIC_WORLD];
            for (slot, &a) in t.iter_mut().zip(v) {
                *slot = a as u64;
            }
            t
        };
        SymmetricArgs {
            rank: self.comm.rank() as u32,
            world: self.peers.len() as u32,
            bytes: (self.len * std::mem::size_of::<T>()) as u64,
            peers: table(&self.peers),
            pads: table(&self.pads),
        }
    }

    /// Whether it carries the Lamport all-reduce's workspace.
    pub fn has_lamport(&self) -> bool {
        self.lamport
    }

    /// The handle of the allocation on its communicator.
    pub fn handle(&self) -> RawHandle {
        self.handle
    }
}

impl<T: Element, C: Collective> Drop for Symmetric<'_, T, C> {
    fn drop(&mut self) {
        // Local and bounded: the backend keeps what pending work uses; errors cannot be
        // reported from drop (`Comm::free_symmetric` reports them).
        if self.held {
            let _ = self.comm.backend().free_symmetric(self.handle);
        }
    }
}

impl<C: Collective> Comm<C> {
    /// Allocates `len` elements of symmetric memory on every rank (collective and
    /// host-blocking: every rank calls it with the same `len`, in the same order; sizes that
    /// differ are `Mismatch` on every rank), each rank's mapped on every rank, with a
    /// signal pad per rank, zeroed. At most [`MAX_SYMMETRIC_WORLD`] ranks. Not inside a
    /// graph's capture.
    pub fn alloc_symmetric<T: Element>(&self, len: usize) -> Result<Symmetric<'_, T, C>> {
        self.symmetric_with::<T>(len, false)
    }

    /// [`Comm::alloc_symmetric`] with the workspace of the Lamport all-reduce (three rounds
    /// of `world` slots of `len` elements per rank, filled with negative zeros): for
    /// [`SymmetricAlgorithm::Lamport`], of this element type only (f32, f16, bf16).
    pub fn alloc_symmetric_lamport<T: Element>(&self, len: usize) -> Result<Symmetric<'_, T, C>> {
        check_symmetric_type(T::DTYPE)?;
        self.symmetric_with::<T>(len, true)
    }

    fn symmetric_with<T: Element>(&self, len: usize, lamport: bool) -> Result<Symmetric<'_, T, C>> {
        crate::capturing::refuse_in_capture("alloc_symmetric")?;
        let w = self.world_size();
        if w > MAX_SYMMETRIC_WORLD {
            return Err(Error::unsupported(
                "symmetric memory",
                format!("at most {MAX_SYMMETRIC_WORLD} ranks (one NVLink domain)"),
                format!("a world of {w}"),
            ));
        }
        let bytes = crate::buffer::elem_bytes::<T>(len, "len")?;
        let SymmetricParts {
            mem,
            handle,
            peers,
            pads,
            ..
        } = self
            .backend()
            .alloc_symmetric(bytes, lamport.then_some(T::DTYPE))?;
        Ok(Symmetric {
            comm: self,
            mem,
            handle,
            held: true,
            len,
            peers,
            pads,
            lamport,
            _t: PhantomData,
        })
    }

    /// Releases a symmetric allocation, reporting what its drop cannot.
    pub fn free_symmetric<T: Element>(&self, mut sym: Symmetric<'_, T, C>) -> Result<()> {
        self.own(&sym)?;
        sym.held = false;
        self.backend().free_symmetric(sym.handle)
    }

    /// All-reduces the first `count` elements of every rank's part of `input` into `out`
    /// with unicomm's own kernel of `algorithm` (every rank calls it with the same count,
    /// algorithm and reduction: a count that differs is `Mismatch` on every rank). f32,
    /// f16, bf16; sum, max, min; the sum in rank order, so every rank holds the same bits.
    /// [`SymmetricAlgorithm::TwoShot`] overwrites `input`'s chunks with their sums.
    pub fn all_reduce_symmetric<T: Element>(
        &self,
        input: &Symmetric<'_, T, C>,
        count: usize,
        out: &mut impl DeviceSliceMut<T, C>,
        how: SymmetricOptions,
        stream: &C::Stream,
    ) -> Result<()> {
        let out = out.view_mut().into_view();
        let sym = self.symmetric_all_reduce_op(input, count, &out, None, how)?;
        self.sole()?.work((&sym).into(), stream)
    }

    /// A barrier over `sym`'s signal pads in stream order on `stream`: the work after it
    /// on every rank runs after the work before it on every rank.
    pub fn symmetric_barrier<T: Element>(
        &self,
        sym: &Symmetric<'_, T, C>,
        stream: &C::Stream,
    ) -> Result<()> {
        self.own(sym)?;
        super::direct_call()?;
        self.sole()?.work(
            (&SymmetricOp::Barrier { handle: sym.handle }).into(),
            stream,
        )
    }

    /// Every rank's part of `input` sent to every rank by counts that are on the device,
    /// read when the work runs (PyTorch's `all_to_all_vdev`), so that a graph's replays
    /// follow counts a kernel before them wrote. `splits` holds `3 x world` i64 on every
    /// rank: row 0 is what this rank sends each rank (its input packed in rank order);
    /// the call writes row 1 (what it received from each rank) and row 2 (where that
    /// starts in `out`, packed in rank order). `out` holds at least `input.len()` elements,
    /// the most a rank receives. Collective: every rank calls it with allocations of the
    /// same type and size. A negative count, a rank sending more than its input holds or
    /// receiving more than `input.len()` is `InvalidArgument` on every rank, nothing moved.
    /// The mock runs it; on the GPUs it is `Unsupported` until its kernel is built.
    pub fn all_to_all_vdev<T: Element>(
        &self,
        input: &Symmetric<'_, T, C>,
        splits: &Symmetric<'_, i64, C>,
        out: &mut impl DeviceSliceMut<T, C>,
        stream: &C::Stream,
    ) -> Result<()> {
        let out = out.view_mut().into_view();
        let op = self.all_to_all_vdev_op(input, splits, &out)?;
        self.sole()?.work((&op).into(), stream)
    }

    /// The backend's all-to-all, checked: both allocations this communicator's, the splits
    /// `3 x world`, the output this rank's and large enough.
    pub(crate) fn all_to_all_vdev_op<'v, T: Element>(
        &self,
        input: &Symmetric<'_, T, C>,
        splits: &Symmetric<'_, i64, C>,
        out: &View<'v, T, C>,
    ) -> Result<SymmetricOp<'v, C::Memory>> {
        self.own(input)?;
        self.own(splits)?;
        let w = self.world_size();
        if splits.len < 3 * w {
            return Err(short("splits", splits.len, 3 * w));
        }
        self.check(out)?;
        let out = out
            .slice(..input.len)
            .map_err(|_| short("out", out.len(), input.len))?;
        Ok(SymmetricOp::AllToAllV(AllToAllV {
            handle: input.handle,
            splits: splits.handle,
            dtype: T::DTYPE,
            capacity: input.len,
            out: out.raw(),
        }))
    }

    fn own<T: Element>(&self, sym: &Symmetric<'_, T, C>) -> Result<()> {
        if !std::ptr::eq(sym.comm, self) {
            return Err(Error::invalid(
                "input",
                "a symmetric allocation of another communicator",
            ));
        }
        Ok(())
    }

    /// The backend's operation, checked: this communicator's allocation, a type and a
    /// reduction the kernels have, the counts inside every buffer, this rank's memory.
    pub(crate) fn symmetric_all_reduce_op<'v, T: Element>(
        &self,
        input: &Symmetric<'_, T, C>,
        count: usize,
        out: &View<'v, T, C>,
        norm: Option<&FusedViews<'v, T, C>>,
        how: SymmetricOptions,
    ) -> Result<SymmetricOp<'v, C::Memory>> {
        let SymmetricOptions { op, algorithm } = how;
        self.own(input)?;
        check_symmetric_type(T::DTYPE)?;
        check_symmetric_op(op)?;
        if count > input.len {
            return Err(Error::invalid(
                "count",
                format!(
                    "{count} elements of a {}-element symmetric allocation",
                    input.len
                ),
            ));
        }
        if algorithm == SymmetricAlgorithm::Lamport && !input.lamport {
            return Err(Error::invalid(
                "algorithm",
                "the Lamport all-reduce needs its workspace: allocate with alloc_symmetric_lamport",
            ));
        }
        self.check(out)?;
        let out = out
            .slice(..count)
            .map_err(|_| short("out", out.len(), count))?;
        let norm = match norm {
            None => None,
            Some(n) => Some(self.norm_of(count, n)?),
        };
        Ok(SymmetricOp::AllReduce {
            handle: input.handle,
            count,
            dtype: T::DTYPE,
            op,
            algorithm,
            out: out.raw(),
            norm,
        })
    }

    /// The norm's operands checked: this rank's memory, rows that tile the count, an
    /// epsilon that is a number, the FP8 output's count and its scale.
    fn norm_of<'v, T: Element>(
        &self,
        count: usize,
        views: &FusedViews<'v, T, C>,
    ) -> Result<RmsNorm<'v, C::Memory>> {
        let FusedViews {
            residual: res,
            weight,
            eps,
            fp8,
        } = views;
        self.check(res)?;
        self.check(weight)?;
        let hidden = weight.len();
        if hidden == 0 || !count.is_multiple_of(hidden) {
            return Err(Error::invalid(
                "weight",
                format!("rows of {hidden} elements do not tile {count} elements"),
            ));
        }
        if !(eps.is_finite() && *eps >= 0.0) {
            return Err(Error::invalid(
                "eps",
                format!("{eps}: a finite, non-negative epsilon"),
            ));
        }
        let res = res
            .slice(..count)
            .map_err(|_| short("residual", res.len(), count))?;
        let fp8 = match fp8 {
            None => None,
            Some((q, scale)) => {
                self.check(q)?;
                self.check(scale)?;
                let q = q
                    .slice(..count)
                    .map_err(|_| short("fp8 out", q.len(), count))?;
                Some(Fp8Out {
                    out: q.raw(),
                    scale: scale.raw(),
                })
            }
        };
        Ok(RmsNorm {
            residual: res.raw(),
            weight: weight.raw(),
            hidden,
            eps: *eps,
            fp8,
        })
    }
}

/// A fused step's operands past the all-reduce's, as views.
pub(crate) struct FusedViews<'v, T: Element, C: Collective> {
    pub(crate) residual: View<'v, T, C>,
    pub(crate) weight: View<'v, T, C>,
    pub(crate) eps: f32,
    pub(crate) fp8: Option<(View<'v, F8E4M3, C>, View<'v, f32, C>)>,
}

impl<'v, T: Element, C: Collective> FusedViews<'v, T, C> {
    pub(crate) fn new(
        residual: View<'v, T, C>,
        weight: View<'v, T, C>,
        eps: f32,
        fp8: Option<(View<'v, F8E4M3, C>, View<'v, f32, C>)>,
    ) -> Self {
        FusedViews {
            residual,
            weight,
            eps,
            fp8,
        }
    }
}

fn short(arg: &'static str, len: usize, count: usize) -> Error {
    Error::invalid(
        arg,
        format!("holds {len} elements, the operation needs {count}"),
    )
}
