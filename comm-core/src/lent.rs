//! Someone else's device memory lent to unicomm for the length of a borrow: an engine's
//! tensor used as a collective's input or output without being given away or copied.
//!
//! A backend makes these from its own borrowed memory (cudarc slices and views on NCCL, raw
//! pointers on NCCL and RCCL); the borrow (`'a`) keeps the owner alive and, for
//! [`LentMut`], unaliased while the view exists. Dropping one never frees the memory.
//! What the borrow cannot cover is the stream: a collective enqueued on a stream runs
//! after the view is gone, so the owner's later writes must be ordered after it on the same
//! stream (an engine's own compute stream) or by a marker (record, wait).

use std::marker::PhantomData;

use crate::backend::{Collective, DeviceMemory};
use crate::buffer::{elem_bytes, DeviceSlice, DeviceSliceMut, View, ViewMut};
use crate::element::Element;
use crate::{Error, Result};

/// `len` elements of someone else's device memory, lent for `'a` to be read.
pub struct Lent<'a, T: Element, C: Collective> {
    mem: C::Memory,
    len: usize,
    _b: PhantomData<&'a [T]>,
}

/// `len` elements of someone else's device memory, lent for `'a` to be written (no other
/// view of it exists meanwhile).
pub struct LentMut<'a, T: Element, C: Collective> {
    mem: C::Memory,
    len: usize,
    _b: PhantomData<&'a mut [T]>,
}

fn fits<T: Element, M: DeviceMemory>(mem: &M, len: usize) -> Result<()> {
    let need = elem_bytes::<T>(len, "len")?;
    if need > mem.byte_len() {
        return Err(Error::invalid(
            "len",
            format!(
                "{len} elements of {} need {need} bytes, the lent memory spans {}",
                T::DTYPE,
                mem.byte_len()
            ),
        ));
    }
    Ok(())
}

macro_rules! lent_common {
    ($ty:ident) => {
        impl<'a, T: Element, C: Collective> $ty<'a, T, C> {
            /// `len` elements at the start of `mem`, held for `'a`: the backends' lending
            /// functions make `mem` over someone else's allocation (never freed by it) and
            /// tie `'a` to a borrow of its owner. Safe for any memory: the lifetime only
            /// shortens how long the memory may be used.
            pub fn from_memory(mem: C::Memory, len: usize) -> Result<Self> {
                fits::<T, _>(&mem, len)?;
                Ok($ty {
                    mem,
                    len,
                    _b: PhantomData,
                })
            }
            /// The view as memory of another backend type that wraps this one (the facade's
            /// `AnyComm`, which every compiled backend's memory converts into).
            pub fn into_backend<D: Collective>(self) -> $ty<'a, T, D>
            where
                D::Memory: From<C::Memory>,
            {
                $ty {
                    mem: D::Memory::from(self.mem),
                    len: self.len,
                    _b: PhantomData,
                }
            }
            /// The number of elements.
            pub fn len(&self) -> usize {
                self.len
            }
            /// Whether it holds no elements.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }
        }

        impl<T: Element, C: Collective> DeviceSlice<T, C> for $ty<'_, T, C> {
            fn view(&self) -> View<'_, T, C> {
                View {
                    mem: &self.mem,
                    offset: 0,
                    len: self.len,
                    _t: PhantomData,
                }
            }
        }

        impl<T: Element, C: Collective> std::fmt::Debug for $ty<'_, T, C> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(
                    f,
                    "{}({} x {} at {:#x})",
                    stringify!($ty),
                    self.len,
                    T::DTYPE,
                    self.mem.address()
                )
            }
        }
    };
}

lent_common!(Lent);
lent_common!(LentMut);

impl<T: Element, C: Collective> DeviceSliceMut<T, C> for LentMut<'_, T, C> {
    fn view_mut(&mut self) -> ViewMut<'_, T, C> {
        ViewMut {
            mem: &self.mem,
            offset: 0,
            len: self.len,
            _t: PhantomData,
        }
    }
}
