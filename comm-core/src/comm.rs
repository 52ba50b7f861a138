//! The typed, safe API: [`Comm`], [`Buffer`], [`Registered`], [`Window`] and views.

use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::{Capabilities, Collective, DeviceMemory, Op, RawHandle, Slice};
use crate::element::{as_bytes, as_bytes_mut, Element};
use crate::{Error, ReduceOp, Result};

static NEXT_COMM_ID: AtomicU64 = AtomicU64::new(1);

/// One rank's communicator over a backend `C`, with typed collectives and ownership rules
/// for registered memory.
pub struct Comm<C: Collective> {
    raw: C,
    id: u64,
}

/// Device memory of `len` elements of `T`, owned; freed on drop.
pub struct Buffer<T: Element, C: Collective> {
    mem: C::Memory,
    len: usize,
    _t: PhantomData<T>,
}

/// A buffer registered with a communicator (`ncclCommRegister`).
///
/// It owns the buffer, so the memory cannot be freed while registered, and borrows the
/// communicator, so the communicator cannot be destroyed while registered; it can still be
/// the output (`&mut`) of a collective. [`Comm::deregister`] gives the buffer back; dropping
/// it deregisters and frees.
pub struct Registered<'c, T: Element, C: Collective> {
    buf: ManuallyDrop<Buffer<T, C>>,
    comm: &'c Comm<C>,
    handle: RawHandle,
}

/// A buffer in a symmetric window (`ncclCommWindowRegister`, NCCL >= 2.27). Same ownership
/// rules as [`Registered`]; a different type because windows are registered collectively and
/// deregistered with a different call.
pub struct Window<'c, T: Element, C: Collective> {
    buf: ManuallyDrop<Buffer<T, C>>,
    comm: &'c Comm<C>,
    handle: RawHandle,
}

/// The error of [`Comm::register`] and [`Comm::register_window`]: the cause and the buffer,
/// handed back unregistered. Converts into [`Error`] with `?` (the buffer is then freed).
pub struct RegisterError<T: Element, C: Collective> {
    /// Why registration failed.
    pub error: Error,
    /// The buffer, unchanged.
    pub buffer: Buffer<T, C>,
}

impl<T: Element, C: Collective> std::fmt::Debug for RegisterError<T, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisterError")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<T: Element, C: Collective> std::fmt::Display for RegisterError<T, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl<T: Element, C: Collective> std::error::Error for RegisterError<T, C> {}

impl<T: Element, C: Collective> From<RegisterError<T, C>> for Error {
    fn from(e: RegisterError<T, C>) -> Self {
        e.error
    }
}

/// A shared view of `len` elements of some device memory.
pub struct View<'a, T: Element, C: Collective> {
    mem: &'a C::Memory,
    offset: usize,
    len: usize,
    _t: PhantomData<T>,
}

/// An exclusive view of `len` elements of some device memory.
pub struct ViewMut<'a, T: Element, C: Collective> {
    mem: &'a C::Memory,
    offset: usize,
    len: usize,
    _t: PhantomData<&'a mut T>,
}

/// Anything that names device elements a collective may read.
pub trait DeviceSlice<T: Element, C: Collective> {
    /// The elements as a view.
    fn view(&self) -> View<'_, T, C>;
}

/// Anything that names device elements a collective may write.
pub trait DeviceSliceMut<T: Element, C: Collective>: DeviceSlice<T, C> {
    /// The elements as an exclusive view.
    fn view_mut(&mut self) -> ViewMut<'_, T, C>;
}

fn elem_bytes<T: Element>(count: usize, argument: &'static str) -> Result<usize> {
    count.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
        Error::invalid(
            argument,
            format!(
                "{count} elements of {} overflow the address space",
                T::DTYPE
            ),
        )
    })
}

fn range_of(r: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize)> {
    let start = match r.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match r.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start > end || end > len {
        return Err(Error::invalid(
            "range",
            format!("{start}..{end} is outside 0..{len}"),
        ));
    }
    Ok((start, end - start))
}

impl<'a, T: Element, C: Collective> View<'a, T, C> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// A sub-range of the view.
    pub fn slice(&self, r: impl RangeBounds<usize>) -> Result<View<'a, T, C>> {
        let (start, len) = range_of(r, self.len)?;
        Ok(View {
            mem: self.mem,
            offset: self.offset + start,
            len,
            _t: PhantomData,
        })
    }
    fn raw(&self) -> Slice<'a, C::Memory> {
        Slice {
            mem: self.mem,
            offset: self.offset * std::mem::size_of::<T>(),
            bytes: self.len * std::mem::size_of::<T>(),
        }
    }
    /// Copies the elements to a new host vector, after the work enqueued on `stream`.
    pub fn copy_to_host(&self, stream: &C::Stream) -> Result<Vec<T>> {
        let mut out = vec![T::ZERO; self.len];
        self.copy_to_host_into(&mut out, stream)?;
        Ok(out)
    }
    /// Copies the elements into `dst` (same length), after the work enqueued on `stream`.
    pub fn copy_to_host_into(&self, dst: &mut [T], stream: &C::Stream) -> Result<()> {
        if dst.len() != self.len {
            return Err(Error::invalid(
                "dst",
                format!(
                    "holds {} elements, the device range {}",
                    dst.len(),
                    self.len
                ),
            ));
        }
        let off = self.offset * std::mem::size_of::<T>();
        self.mem.read(off, as_bytes_mut(dst), stream)
    }
}

impl<'a, T: Element, C: Collective> ViewMut<'a, T, C> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// A shared view of the same elements.
    pub fn as_view(&self) -> View<'_, T, C> {
        View {
            mem: self.mem,
            offset: self.offset,
            len: self.len,
            _t: PhantomData,
        }
    }
    /// A sub-range of the view.
    pub fn slice_mut(&mut self, r: impl RangeBounds<usize>) -> Result<ViewMut<'_, T, C>> {
        let (start, len) = range_of(r, self.len)?;
        Ok(ViewMut {
            mem: self.mem,
            offset: self.offset + start,
            len,
            _t: PhantomData,
        })
    }
    /// Splits into two disjoint exclusive views at `mid`.
    pub fn split_at_mut(&mut self, mid: usize) -> Result<(ViewMut<'_, T, C>, ViewMut<'_, T, C>)> {
        if mid > self.len {
            return Err(Error::invalid(
                "mid",
                format!("{mid} is past the end ({})", self.len),
            ));
        }
        let a = ViewMut {
            mem: self.mem,
            offset: self.offset,
            len: mid,
            _t: PhantomData,
        };
        let b = ViewMut {
            mem: self.mem,
            offset: self.offset + mid,
            len: self.len - mid,
            _t: PhantomData,
        };
        Ok((a, b))
    }
    /// Enqueues a copy of `src` (at most `len` elements) to the start of the view.
    pub fn copy_from_host(&mut self, src: &[T], stream: &C::Stream) -> Result<()> {
        if src.len() > self.len {
            return Err(Error::invalid(
                "src",
                format!(
                    "holds {} elements, the device range only {}",
                    src.len(),
                    self.len
                ),
            ));
        }
        let off = self.offset * std::mem::size_of::<T>();
        self.mem.write(off, as_bytes(src), stream)
    }
}

impl<T: Element, C: Collective> DeviceSlice<T, C> for View<'_, T, C> {
    fn view(&self) -> View<'_, T, C> {
        View {
            mem: self.mem,
            offset: self.offset,
            len: self.len,
            _t: PhantomData,
        }
    }
}
impl<T: Element, C: Collective> DeviceSlice<T, C> for ViewMut<'_, T, C> {
    fn view(&self) -> View<'_, T, C> {
        self.as_view()
    }
}
impl<T: Element, C: Collective> DeviceSliceMut<T, C> for ViewMut<'_, T, C> {
    fn view_mut(&mut self) -> ViewMut<'_, T, C> {
        ViewMut {
            mem: self.mem,
            offset: self.offset,
            len: self.len,
            _t: PhantomData,
        }
    }
}

impl<T: Element, C: Collective> Buffer<T, C> {
    /// Wraps backend memory as `len` elements.
    pub fn from_memory(mem: C::Memory, len: usize) -> Result<Self> {
        let bytes = elem_bytes::<T>(len, "len")?;
        if bytes > mem.byte_len() {
            return Err(Error::invalid(
                "len",
                format!(
                    "{len} elements of {} need {bytes} bytes, the memory holds {}",
                    T::DTYPE,
                    mem.byte_len()
                ),
            ));
        }
        Ok(Buffer {
            mem,
            len,
            _t: PhantomData,
        })
    }
    /// The backend memory.
    pub fn memory(&self) -> &C::Memory {
        &self.mem
    }
    /// Gives up the typed view and returns the backend memory.
    pub fn into_memory(self) -> C::Memory {
        self.mem
    }
    /// The device address of the first element.
    pub fn device_ptr(&self) -> usize {
        self.mem.address()
    }
}

// The methods every owned device buffer has, written once for the three owners.
macro_rules! owned_buffer_methods {
    ($ty:ident $(<$lt:lifetime>)?, $self_:ident => $mem:expr, $len:expr) => {
        impl<$($lt,)? T: Element, C: Collective> $ty<$($lt,)? T, C> {
            /// Number of elements.
            pub fn len(&$self_) -> usize {
                $len
            }
            /// Whether the buffer is empty.
            pub fn is_empty(&$self_) -> bool {
                $len == 0
            }
            /// A shared view of a sub-range.
            pub fn slice(&$self_, r: impl RangeBounds<usize>) -> Result<View<'_, T, C>> {
                let (start, len) = range_of(r, $len)?;
                Ok(View { mem: $mem, offset: start, len, _t: PhantomData })
            }
            /// An exclusive view of a sub-range.
            pub fn slice_mut(&mut $self_, r: impl RangeBounds<usize>) -> Result<ViewMut<'_, T, C>> {
                let (start, len) = range_of(r, $len)?;
                Ok(ViewMut { mem: $mem, offset: start, len, _t: PhantomData })
            }
            /// Enqueues a copy of `src` (at most `len` elements) to the start of the buffer.
            pub fn copy_from_host(&mut $self_, src: &[T], stream: &C::Stream) -> Result<()> {
                DeviceSliceMut::view_mut($self_).copy_from_host(src, stream)
            }
            /// Copies the whole buffer to a new host vector after the work enqueued on
            /// `stream` (waits for it).
            pub fn copy_to_host(&$self_, stream: &C::Stream) -> Result<Vec<T>> {
                DeviceSlice::view($self_).copy_to_host(stream)
            }
        }
        impl<$($lt,)? T: Element, C: Collective> DeviceSlice<T, C> for $ty<$($lt,)? T, C> {
            fn view(&$self_) -> View<'_, T, C> {
                View { mem: $mem, offset: 0, len: $len, _t: PhantomData }
            }
        }
        impl<$($lt,)? T: Element, C: Collective> DeviceSliceMut<T, C> for $ty<$($lt,)? T, C> {
            fn view_mut(&mut $self_) -> ViewMut<'_, T, C> {
                ViewMut { mem: $mem, offset: 0, len: $len, _t: PhantomData }
            }
        }
    };
}

owned_buffer_methods!(Buffer, self => &self.mem, self.len);
owned_buffer_methods!(Registered<'c>, self => &self.buf.mem, self.buf.len);
owned_buffer_methods!(Window<'c>, self => &self.buf.mem, self.buf.len);

impl<T: Element, C: Collective> std::ops::Deref for Registered<'_, T, C> {
    type Target = Buffer<T, C>;
    fn deref(&self) -> &Buffer<T, C> {
        &self.buf
    }
}
impl<T: Element, C: Collective> std::ops::Deref for Window<'_, T, C> {
    type Target = Buffer<T, C>;
    fn deref(&self) -> &Buffer<T, C> {
        &self.buf
    }
}

impl<T: Element, C: Collective> Registered<'_, T, C> {
    /// The backend's registration handle.
    pub fn handle(&self) -> RawHandle {
        self.handle
    }
}
impl<T: Element, C: Collective> Window<'_, T, C> {
    /// The backend's window handle (`ncclWindow_t`).
    pub fn handle(&self) -> RawHandle {
        self.handle
    }
}

impl<T: Element, C: Collective> Drop for Registered<'_, T, C> {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; `Comm::deregister` reports them.
        if self.comm.raw.deregister(self.handle).is_ok() {
            // SAFETY: `buf` is never used again; dropping it frees the memory, which is no
            // longer registered.
            unsafe { ManuallyDrop::drop(&mut self.buf) }
        }
        // On failure the memory is leaked: freeing memory the library may still consider
        // registered is what NCCL's docs warn against.
    }
}
impl<T: Element, C: Collective> Drop for Window<'_, T, C> {
    fn drop(&mut self) {
        if self.comm.raw.deregister_window(self.handle).is_ok() {
            // SAFETY: as for `Registered`: `buf` is not used again.
            unsafe { ManuallyDrop::drop(&mut self.buf) }
        }
    }
}

impl<C: Collective> Comm<C> {
    /// Wraps a backend communicator.
    pub fn from_backend(raw: C) -> Self {
        Comm {
            raw,
            id: NEXT_COMM_ID.fetch_add(1, Ordering::Relaxed),
        }
    }
    /// The backend communicator.
    pub fn backend(&self) -> &C {
        &self.raw
    }
    /// This rank, `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.raw.rank()
    }
    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.raw.world_size()
    }
    /// What the loaded library can do, and its version.
    pub fn capabilities(&self) -> Capabilities {
        self.raw.capabilities()
    }
    /// A new stream on this rank's device.
    pub fn create_stream(&self) -> Result<C::Stream> {
        self.raw.create_stream()
    }

    /// Allocates `len` elements on this rank's device (`ncclMemAlloc` where the library has
    /// it, which NCCL recommends for registered buffers). The contents are unspecified.
    pub fn alloc<T: Element>(&self, len: usize) -> Result<Buffer<T, C>> {
        let bytes = elem_bytes::<T>(len, "len")?;
        let mem = self.raw.alloc(bytes)?;
        Buffer::from_memory(mem, len)
    }

    /// Registers `buf` with this communicator. Lazy in NCCL: the work happens at the first
    /// collective that uses it. If any rank passes registered buffers to a collective, all
    /// ranks must.
    pub fn register<T: Element>(
        &self,
        buf: Buffer<T, C>,
    ) -> Result<Registered<'_, T, C>, RegisterError<T, C>> {
        let bytes = buf.len * std::mem::size_of::<T>();
        match self
            .raw
            .check_memory(&buf.mem)
            .and_then(|()| self.raw.register(&buf.mem, 0, bytes))
        {
            Ok(handle) => Ok(Registered {
                buf: ManuallyDrop::new(buf),
                comm: self,
                handle,
            }),
            Err(error) => Err(RegisterError { error, buffer: buf }),
        }
    }

    /// Deregisters and returns the buffer. A registration of another communicator is an
    /// `InvalidArgument` error (it is then deregistered from its own communicator and freed).
    /// If the library fails to deregister, the memory is leaked rather than freed while
    /// possibly still registered.
    pub fn deregister<T: Element>(&self, reg: Registered<'_, T, C>) -> Result<Buffer<T, C>> {
        if reg.comm.id != self.id {
            return Err(foreign(reg.comm.id, self.id));
        }
        let mut reg = ManuallyDrop::new(reg);
        self.raw.deregister(reg.handle)?;
        // SAFETY: `reg` is wrapped in ManuallyDrop, so its Drop (which would deregister
        // again and free) never runs; the buffer is moved out exactly once.
        Ok(unsafe { ManuallyDrop::take(&mut reg.buf) })
    }

    /// Registers `buf` as a symmetric window (`ncclCommWindowRegister`). Collective: every
    /// rank must call it, in the same order, with a buffer of the same size. A library that
    /// cannot give a window (NCCL < 2.27, or a NULL window where symmetric memory is not
    /// supported) gives `Unsupported`.
    pub fn register_window<T: Element>(
        &self,
        buf: Buffer<T, C>,
    ) -> Result<Window<'_, T, C>, RegisterError<T, C>> {
        let bytes = buf.len * std::mem::size_of::<T>();
        match self
            .raw
            .check_memory(&buf.mem)
            .and_then(|()| self.raw.register_window(&buf.mem, 0, bytes))
        {
            Ok(handle) => Ok(Window {
                buf: ManuallyDrop::new(buf),
                comm: self,
                handle,
            }),
            Err(error) => Err(RegisterError { error, buffer: buf }),
        }
    }

    /// Deregisters a window and returns the buffer (see [`Comm::deregister`]).
    pub fn deregister_window<T: Element>(&self, win: Window<'_, T, C>) -> Result<Buffer<T, C>> {
        if win.comm.id != self.id {
            return Err(foreign(win.comm.id, self.id));
        }
        let mut win = ManuallyDrop::new(win);
        self.raw.deregister_window(win.handle)?;
        // SAFETY: as in `deregister`.
        Ok(unsafe { ManuallyDrop::take(&mut win.buf) })
    }

    fn check<T: Element>(&self, v: &View<'_, T, C>) -> Result<()> {
        self.raw.check_memory(v.mem)
    }

    /// The views of an out-of-place operation, both checked to be this rank's memory.
    fn views<'a, T: Element>(
        &self,
        send: &'a impl DeviceSlice<T, C>,
        recv: &'a mut impl DeviceSliceMut<T, C>,
    ) -> Result<(View<'a, T, C>, ViewMut<'a, T, C>)> {
        let (s, r) = (send.view(), recv.view_mut());
        self.check(&s)?;
        self.check(&r.as_view())?;
        Ok((s, r))
    }

    /// The view of an in-place operation, checked to be this rank's memory.
    fn view_mut_of<'a, T: Element>(
        &self,
        buf: &'a mut impl DeviceSliceMut<T, C>,
    ) -> Result<ViewMut<'a, T, C>> {
        let b = buf.view_mut();
        self.check(&b.as_view())?;
        Ok(b)
    }

    fn run(&self, op: Op<'_, C::Memory>, stream: &C::Stream) -> Result<()> {
        self.raw.enqueue(op, stream)
    }

    fn root(&self, root: usize, argument: &'static str) -> Result<()> {
        if root >= self.world_size() {
            return Err(Error::invalid(
                argument,
                format!("rank {root} is outside 0..{}", self.world_size()),
            ));
        }
        Ok(())
    }

    /// `recv = op(send of every rank)`, `send.len()` elements; `recv` must hold as many.
    pub fn all_reduce<T: Element>(
        &self,
        send: &impl DeviceSlice<T, C>,
        recv: &mut impl DeviceSliceMut<T, C>,
        op: ReduceOp,
        stream: &C::Stream,
    ) -> Result<()> {
        let (s, r) = self.views(send, recv)?;
        at_least("recv", r.len, s.len)?;
        let count = s.len;
        self.run(
            Op::AllReduce {
                send: s.raw(),
                recv: r.as_view().slice(..count)?.raw(),
                count,
                dtype: T::DTYPE,
                op,
            },
            stream,
        )
    }

    /// In-place all-reduce of every element of `buf`.
    pub fn all_reduce_in_place<T: Element>(
        &self,
        buf: &mut impl DeviceSliceMut<T, C>,
        op: ReduceOp,
        stream: &C::Stream,
    ) -> Result<()> {
        let b = self.view_mut_of(buf)?;
        let raw = b.as_view().raw();
        self.run(
            Op::AllReduce {
                send: raw,
                recv: raw,
                count: b.len,
                dtype: T::DTYPE,
                op,
            },
            stream,
        )
    }

    /// Root's `send` (`send.len()` elements) to every rank's `recv`. `send` is read on the
    /// root only, but every rank passes one of the same length.
    pub fn broadcast<T: Element>(
        &self,
        send: &impl DeviceSlice<T, C>,
        recv: &mut impl DeviceSliceMut<T, C>,
        root: usize,
        stream: &C::Stream,
    ) -> Result<()> {
        self.root(root, "root")?;
        let (s, r) = self.views(send, recv)?;
        at_least("recv", r.len, s.len)?;
        let count = s.len;
        self.run(
            Op::Broadcast {
                send: s.raw(),
                recv: r.as_view().slice(..count)?.raw(),
                count,
                dtype: T::DTYPE,
                root,
            },
            stream,
        )
    }

    /// In-place broadcast: root's `buf` overwrites every other rank's.
    pub fn broadcast_in_place<T: Element>(
        &self,
        buf: &mut impl DeviceSliceMut<T, C>,
        root: usize,
        stream: &C::Stream,
    ) -> Result<()> {
        self.root(root, "root")?;
        let b = self.view_mut_of(buf)?;
        let raw = b.as_view().raw();
        self.run(
            Op::Broadcast {
                send: raw,
                recv: raw,
                count: b.len,
                dtype: T::DTYPE,
                root,
            },
            stream,
        )
    }

    /// The reduction of every rank's `send` into root's `recv` (written on the root only;
    /// every rank passes one at least as long as `send`).
    pub fn reduce<T: Element>(
        &self,
        send: &impl DeviceSlice<T, C>,
        recv: &mut impl DeviceSliceMut<T, C>,
        op: ReduceOp,
        root: usize,
        stream: &C::Stream,
    ) -> Result<()> {
        self.root(root, "root")?;
        let (s, r) = self.views(send, recv)?;
        at_least("recv", r.len, s.len)?;
        let count = s.len;
        self.run(
            Op::Reduce {
                send: s.raw(),
                recv: r.as_view().slice(..count)?.raw(),
                count,
                dtype: T::DTYPE,
                op,
                root,
            },
            stream,
        )
    }

    /// In-place reduce into root's `buf`.
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut impl DeviceSliceMut<T, C>,
        op: ReduceOp,
        root: usize,
        stream: &C::Stream,
    ) -> Result<()> {
        self.root(root, "root")?;
        let b = self.view_mut_of(buf)?;
        let raw = b.as_view().raw();
        self.run(
            Op::Reduce {
                send: raw,
                recv: raw,
                count: b.len,
                dtype: T::DTYPE,
                op,
                root,
            },
            stream,
        )
    }

    /// `recv[r*n..(r+1)*n] = send of rank r`, `n = send.len()`; `recv` holds `n*world_size`.
    pub fn all_gather<T: Element>(
        &self,
        send: &impl DeviceSlice<T, C>,
        recv: &mut impl DeviceSliceMut<T, C>,
        stream: &C::Stream,
    ) -> Result<()> {
        let (s, r) = self.views(send, recv)?;
        let total = self.times_world(s.len, "send")?;
        at_least("recv", r.len, total)?;
        self.run(
            Op::AllGather {
                send: s.raw(),
                recv: r.as_view().slice(..total)?.raw(),
                count: s.len,
                dtype: T::DTYPE,
            },
            stream,
        )
    }

    /// In-place all-gather: `buf` holds `n*world_size` elements and this rank's input is
    /// already at `buf[rank*n..(rank+1)*n]` (NCCL's in-place layout).
    pub fn all_gather_in_place<T: Element>(
        &self,
        buf: &mut impl DeviceSliceMut<T, C>,
        stream: &C::Stream,
    ) -> Result<()> {
        let b = self.view_mut_of(buf)?;
        let count = self.per_rank(b.len, "buf")?;
        let whole = b.as_view();
        self.run(
            Op::AllGather {
                send: whole
                    .slice(self.rank() * count..(self.rank() + 1) * count)?
                    .raw(),
                recv: whole.raw(),
                count,
                dtype: T::DTYPE,
            },
            stream,
        )
    }

    /// `recv = op(send_r[rank*n..(rank+1)*n] for every rank r)` with `n = send.len() /
    /// world_size` (which must divide); `recv` holds at least `n`.
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &impl DeviceSlice<T, C>,
        recv: &mut impl DeviceSliceMut<T, C>,
        op: ReduceOp,
        stream: &C::Stream,
    ) -> Result<()> {
        let (s, r) = self.views(send, recv)?;
        let count = self.per_rank(s.len, "send")?;
        at_least("recv", r.len, count)?;
        self.run(
            Op::ReduceScatter {
                send: s.raw(),
                recv: r.as_view().slice(..count)?.raw(),
                count,
                dtype: T::DTYPE,
                op,
            },
            stream,
        )
    }

    /// In-place reduce-scatter: the result lands in `buf[rank*n..(rank+1)*n]`.
    pub fn reduce_scatter_in_place<T: Element>(
        &self,
        buf: &mut impl DeviceSliceMut<T, C>,
        op: ReduceOp,
        stream: &C::Stream,
    ) -> Result<()> {
        let b = self.view_mut_of(buf)?;
        let count = self.per_rank(b.len, "buf")?;
        let whole = b.as_view();
        self.run(
            Op::ReduceScatter {
                send: whole.raw(),
                recv: whole
                    .slice(self.rank() * count..(self.rank() + 1) * count)?
                    .raw(),
                count,
                dtype: T::DTYPE,
                op,
            },
            stream,
        )
    }

    /// All-to-all: with `n = send.len() / world_size` (which must divide), this rank's
    /// `recv[p*n..(p+1)*n]` receives `send_p[rank*n..(rank+1)*n]` from every rank `p`.
    /// `recv` holds at least `send.len()`.
    pub fn all_to_all<T: Element>(
        &self,
        send: &impl DeviceSlice<T, C>,
        recv: &mut impl DeviceSliceMut<T, C>,
        stream: &C::Stream,
    ) -> Result<()> {
        let (s, r) = self.views(send, recv)?;
        let count = self.per_rank(s.len, "send")?;
        at_least("recv", r.len, s.len)?;
        self.run(
            Op::AllToAll {
                send: s.raw(),
                recv: r.as_view().slice(..s.len)?.raw(),
                count,
                dtype: T::DTYPE,
            },
            stream,
        )
    }

    /// Sends every element of `buf` to `peer`, which must post a matching `recv`. Inside a
    /// group, sends and receives between the same ranks do not deadlock.
    pub fn send<T: Element>(
        &self,
        buf: &impl DeviceSlice<T, C>,
        peer: usize,
        stream: &C::Stream,
    ) -> Result<()> {
        self.root(peer, "peer")?;
        let b = buf.view();
        self.check(&b)?;
        self.run(
            Op::Send {
                buf: b.raw(),
                count: b.len,
                dtype: T::DTYPE,
                peer,
            },
            stream,
        )
    }

    /// Receives `buf.len()` elements from `peer`.
    pub fn recv<T: Element>(
        &self,
        buf: &mut impl DeviceSliceMut<T, C>,
        peer: usize,
        stream: &C::Stream,
    ) -> Result<()> {
        self.root(peer, "peer")?;
        let b = self.view_mut_of(buf)?;
        self.run(
            Op::Recv {
                buf: b.as_view().raw(),
                count: b.len,
                dtype: T::DTYPE,
                peer,
            },
            stream,
        )
    }

    /// A stream-ordered barrier: work enqueued after it on `stream` starts once every rank
    /// has reached it. Call `stream.synchronize()` to wait on the host.
    pub fn barrier(&self, stream: &C::Stream) -> Result<()> {
        self.run(Op::Barrier, stream)
    }

    /// Runs `f` between `ncclGroupStart` and `ncclGroupEnd`; the group is closed even when
    /// `f` fails. Groups are per thread and may span several communicators of the backend
    /// (one thread driving every GPU).
    pub fn group<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        self.raw.group_start()?;
        let r = f();
        let end = self.raw.group_end();
        let r = r?;
        end?;
        Ok(r)
    }

    /// Flushes pending work and destroys the communicator (`ncclCommFinalize` +
    /// `ncclCommDestroy`). Registrations borrow the communicator, so none can be alive here.
    pub fn finalize(mut self) -> Result<()> {
        self.raw.finalize()
    }

    /// Destroys the communicator without waiting for pending work (`ncclCommAbort`).
    pub fn abort(mut self) -> Result<()> {
        self.raw.abort()
    }

    fn times_world(&self, n: usize, argument: &'static str) -> Result<usize> {
        n.checked_mul(self.world_size()).ok_or_else(|| {
            Error::invalid(
                argument,
                format!("{n} x {} ranks overflows", self.world_size()),
            )
        })
    }

    fn per_rank(&self, total: usize, argument: &'static str) -> Result<usize> {
        let w = self.world_size();
        if total % w != 0 {
            return Err(Error::invalid(
                argument,
                format!("{total} elements do not split evenly over {w} ranks"),
            ));
        }
        Ok(total / w)
    }
}

fn at_least(argument: &'static str, have: usize, need: usize) -> Result<()> {
    if have < need {
        return Err(Error::invalid(
            argument,
            format!("holds {have} elements, the operation needs {need}"),
        ));
    }
    Ok(())
}

fn foreign(owner: u64, this: u64) -> Error {
    Error::invalid(
        "registration",
        format!("belongs to communicator #{owner}, not to #{this}"),
    )
}

impl<C: Collective> std::fmt::Debug for Comm<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm")
            .field("id", &self.id)
            .field("rank", &self.rank())
            .field("world_size", &self.world_size())
            .finish()
    }
}
