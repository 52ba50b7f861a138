//! Device memory as users hold it: [`Buffer`] (owned), [`View`] and [`ViewMut`] (borrowed
//! element ranges), and the traits every collective argument implements.

use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use crate::backend::{Collective, DeviceMemory};
use crate::element::{as_bytes, as_bytes_mut, Element};
use crate::op::Slice;
use crate::{Error, Result};

/// Device memory of `len` elements of `T`, owned; freed on drop.
pub struct Buffer<T: Element, C: Collective> {
    pub(crate) mem: C::Memory,
    pub(crate) len: usize,
    pub(crate) _t: PhantomData<T>,
}

/// A shared view of `len` elements of some device memory.
pub struct View<'a, T: Element, C: Collective> {
    pub(crate) mem: &'a C::Memory,
    pub(crate) offset: usize,
    pub(crate) len: usize,
    pub(crate) _t: PhantomData<T>,
}

/// An exclusive view of `len` elements of some device memory.
pub struct ViewMut<'a, T: Element, C: Collective> {
    pub(crate) mem: &'a C::Memory,
    pub(crate) offset: usize,
    pub(crate) len: usize,
    pub(crate) _t: PhantomData<&'a mut T>,
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

pub(crate) fn elem_bytes<T: Element>(count: usize, argument: &'static str) -> Result<usize> {
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

pub(crate) fn range_of(r: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize)> {
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
    /// The device address of the first element (for handing to other libraries; using it is
    /// `unsafe` there).
    pub fn device_ptr(&self) -> usize {
        self.mem
            .address()
            .wrapping_add(self.offset * std::mem::size_of::<T>())
    }
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
    pub(crate) fn raw(&self) -> Slice<'a, C::Memory> {
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
    /// The same elements as a shared view, for as long as this one lived.
    pub fn into_view(self) -> View<'a, T, C> {
        View {
            mem: self.mem,
            offset: self.offset,
            len: self.len,
            _t: PhantomData,
        }
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
        self.reborrow().into_slice_mut(r)
    }
    /// The same elements, for as long as this view is borrowed.
    fn reborrow(&mut self) -> ViewMut<'_, T, C> {
        ViewMut {
            mem: self.mem,
            offset: self.offset,
            len: self.len,
            _t: PhantomData,
        }
    }
    /// A sub-range of the view that keeps its lifetime (a view made once and held, as a
    /// captured graph's arguments are).
    pub fn into_slice_mut(self, r: impl RangeBounds<usize>) -> Result<ViewMut<'a, T, C>> {
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
    /// Copies `src` to the start of the view (a source longer than the view is refused,
    /// `InvalidArgument` naming `src`; a shorter one leaves the rest as it was), ordered after the
    /// work enqueued on `stream`; returns once `src` may be reused (see
    /// [`crate::DeviceMemory::write`]).
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

// The methods every owned device buffer has, written once for both owners (Buffer and
// Registration).
/// A write into an owned buffer through a shared borrow ([`Buffer::write_from`]): the
/// lengths checked, refused inside a capture's closure (it would be captured into the graph
/// without the graph borrowing `src`), then a device copy in stream order.
pub(crate) fn write_shared<T: Element, C: Collective>(
    dst: View<'_, T, C>,
    src: View<'_, T, C>,
    stream: &C::Stream,
) -> Result<()> {
    if !crate::capturing::direct_call_allowed() {
        return Err(crate::capturing::direct_call_refused());
    }
    if src.len != dst.len {
        return Err(Error::invalid(
            "src",
            format!("holds {} elements, the buffer {}", src.len, dst.len),
        ));
    }
    copy_view(&dst, &src, stream)
}

/// `src`'s elements into `dst` (of as many) in stream order on `stream`: the device copy of
/// [`Comm::copy`](crate::Comm::copy) and [`write_shared`].
pub(crate) fn copy_view<T: Element, C: Collective>(
    dst: &View<'_, T, C>,
    src: &View<'_, T, C>,
    stream: &C::Stream,
) -> Result<()> {
    let size = std::mem::size_of::<T>();
    dst.mem.copy_from(
        dst.offset * size,
        src.mem,
        src.offset * size,
        src.len * size,
        stream,
    )
}

/// [`write_shared`] from host memory ([`Buffer::write_from_host`]).
pub(crate) fn write_shared_host<T: Element, C: Collective>(
    dst: View<'_, T, C>,
    src: &[T],
    stream: &C::Stream,
) -> Result<()> {
    if !crate::capturing::direct_call_allowed() {
        return Err(crate::capturing::direct_call_refused());
    }
    if src.len() > dst.len {
        return Err(Error::invalid(
            "src",
            format!("holds {} elements, the buffer only {}", src.len(), dst.len),
        ));
    }
    dst.mem
        .write(dst.offset * std::mem::size_of::<T>(), as_bytes(src), stream)
}

macro_rules! owned_buffer_methods {
    ([$($gen:tt)*] $ty:ty, $self_:ident => $mem:expr, $len:expr) => {
        impl<$($gen)*> $ty {
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
            /// Copies `src` to the start of the buffer (a source longer than the buffer is
            /// refused, `InvalidArgument` naming `src`; a shorter one leaves the rest), ordered after
            /// the work enqueued on `stream`. Returns once `src` may be reused: the GPU
            /// backends wait for the copy (pageable host memory), the mock stages the bytes.
            pub fn copy_from_host(&mut $self_, src: &[T], stream: &C::Stream) -> Result<()> {
                $crate::buffer::DeviceSliceMut::view_mut($self_).copy_from_host(src, stream)
            }
            /// Copies `src` (a device range of as many elements) into this buffer in stream
            /// order on `stream`, the host not waiting (`cuMemcpyDtoDAsync`): through a shared
            /// borrow, so that a captured graph's input is written between its replays while
            /// the graph borrows it (a decode loop's next hidden state or token), with no
            /// staging and no wait. The write lands in stream order: after the replay
            /// launched before it on `stream`, before the one launched after (order another
            /// stream with a marker). Inside a capture's closure it is refused, as every
            /// call beside the [`Step`](crate::step::Step) is.
            pub fn write_from(&$self_, src: &impl $crate::buffer::DeviceSlice<T, C>, stream: &C::Stream) -> Result<()> {
                $crate::buffer::write_shared::<T, C>(View { mem: $mem, offset: 0, len: $len, _t: PhantomData }, src.view(), stream)
            }
            /// Copies `src` (at most as many elements; a longer one is refused) to the start of
            /// this buffer through a shared borrow, in stream order on `stream`, returning once
            /// `src` may be reused (the GPU backends wait for the copy, the mock stages it):
            /// a graph's input written from the host between replays, where the next input is
            /// on the host (token ids). [`write_from`](Self::write_from) does not wait.
            pub fn write_from_host(&$self_, src: &[T], stream: &C::Stream) -> Result<()> {
                $crate::buffer::write_shared_host::<T, C>(View { mem: $mem, offset: 0, len: $len, _t: PhantomData }, src, stream)
            }
            /// Copies the whole buffer to a new host vector after the work enqueued on
            /// `stream` (waits for it).
            pub fn copy_to_host(&$self_, stream: &C::Stream) -> Result<Vec<T>> {
                $crate::buffer::DeviceSlice::view($self_).copy_to_host(stream)
            }
            /// Copies the whole buffer into `dst` (of the same length: `InvalidArgument`
            /// otherwise) after the work enqueued on `stream` (waits for it), reusing the
            /// caller's host memory.
            pub fn copy_to_host_into(&$self_, dst: &mut [T], stream: &C::Stream) -> Result<()> {
                $crate::buffer::DeviceSlice::view($self_).copy_to_host_into(dst, stream)
            }
        }
        impl<$($gen)*> $crate::buffer::DeviceSlice<T, C> for $ty {
            fn view(&$self_) -> View<'_, T, C> {
                View { mem: $mem, offset: 0, len: $len, _t: PhantomData }
            }
        }
        impl<$($gen)*> $crate::buffer::DeviceSliceMut<T, C> for $ty {
            fn view_mut(&mut $self_) -> ViewMut<'_, T, C> {
                ViewMut { mem: $mem, offset: 0, len: $len, _t: PhantomData }
            }
        }
    };
}

pub(crate) use owned_buffer_methods;

owned_buffer_methods!([T: Element, C: Collective] Buffer<T, C>, self => &self.mem, self.len);
