//! Registered memory: a [`Registration`] owns its buffer and borrows its communicator, so
//! the memory cannot be freed and the communicator cannot be destroyed while registered,
//! yet the buffer can still be the output (`&mut`) of a collective. Ordinary registrations
//! ([`Registered`], `ncclCommRegister`) and symmetric windows ([`Window`],
//! `ncclCommWindowRegister`) are one implementation with two kinds, so they cannot be
//! confused (deregistering one as the other does not compile).

#![allow(
    unsafe_code,
    reason = "the buffer taken out of its ManuallyDrop once, at release or drop"
)]

use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::RangeBounds;

use crate::backend::{Collective, RawHandle};
use crate::buffer::{owned_buffer_methods, range_of, Buffer, View, ViewMut};
use crate::comm::Comm;
use crate::element::Element;
use crate::registry::RegKind;
use crate::{Error, Result};

mod sealed {
    pub trait Sealed {}
}

/// The two kinds of registration: how each is deregistered.
pub trait Kind: sealed::Sealed + Send + Sync + 'static {
    /// The bookkeeping kind.
    const KIND: RegKind;
    /// Whether ending it is collective (every rank must take part).
    const COLLECTIVE: bool = false;
    /// The backend call that ends a registration of this kind.
    fn deregister<C: Collective>(comm: &C, handle: RawHandle) -> Result<()>;
}

/// Ordinary user-buffer registration (`ncclCommRegister`).
#[derive(Debug)]
pub enum BufferKind {}
/// Symmetric window (`ncclCommWindowRegister`, NCCL >= 2.27; collective).
#[derive(Debug)]
pub enum WindowKind {}

/// Registered for the backend's automatic policy: every call picks the fastest path for its
/// collective and size (plain-registered, window, copy engine). Collective, like a window.
#[derive(Debug)]
pub enum AutoKind {}

impl sealed::Sealed for BufferKind {}
impl sealed::Sealed for WindowKind {}
impl sealed::Sealed for AutoKind {}

impl Kind for AutoKind {
    const KIND: RegKind = RegKind::Auto;
    const COLLECTIVE: bool = true;
    fn deregister<C: Collective>(comm: &C, handle: RawHandle) -> Result<()> {
        comm.deregister_auto(handle)
    }
}

impl Kind for BufferKind {
    const KIND: RegKind = RegKind::Buffer;
    fn deregister<C: Collective>(comm: &C, handle: RawHandle) -> Result<()> {
        comm.deregister(handle)
    }
}
impl Kind for WindowKind {
    const KIND: RegKind = RegKind::Window;
    const COLLECTIVE: bool = true;
    fn deregister<C: Collective>(comm: &C, handle: RawHandle) -> Result<()> {
        comm.deregister_window(handle)
    }
}

/// A buffer registered with a communicator.
///
/// It owns the buffer, so the memory cannot be freed while registered, and borrows the
/// communicator, so the communicator cannot be destroyed while registered; it can still be
/// the output (`&mut`) of a collective. [`Comm::deregister`] (or
/// [`Comm::deregister_window`]) gives the buffer back; dropping it deregisters and frees.
pub struct Registration<'c, T: Element, C: Collective, K: Kind> {
    pub(crate) buf: ManuallyDrop<Buffer<T, C>>,
    pub(crate) comm: &'c Comm<C>,
    pub(crate) handle: RawHandle,
    _kind: PhantomData<K>,
}

/// A buffer registered with `ncclCommRegister`.
pub type Registered<'c, T, C> = Registration<'c, T, C, BufferKind>;

/// A buffer registered for the automatic policy ([`Comm::register_auto`]).
pub type AutoRegistered<'c, T, C> = Registration<'c, T, C, AutoKind>;

/// A buffer in a symmetric window (`ncclCommWindowRegister`, NCCL >= 2.27). Registered and
/// deregistered collectively: every rank calls, in the same order. Dropping a window
/// deregisters it, which is collective too: drop windows on every rank in the same order.
pub type Window<'c, T, C> = Registration<'c, T, C, WindowKind>;

impl<'c, T: Element, C: Collective, K: Kind> Registration<'c, T, C, K> {
    pub(crate) fn new(buf: Buffer<T, C>, comm: &'c Comm<C>, handle: RawHandle) -> Self {
        Registration {
            buf: ManuallyDrop::new(buf),
            comm,
            handle,
            _kind: PhantomData,
        }
    }

    /// The backend's handle (`ncclCommRegister`'s handle, or the `ncclWindow_t`).
    pub fn handle(&self) -> RawHandle {
        self.handle
    }

    /// The number of the communicator it belongs to ([`Comm::id`]).
    pub fn comm_id(&self) -> u64 {
        self.comm.id()
    }

    /// Ends the registration through `comm` and returns the buffer; a registration of
    /// another communicator is an `InvalidArgument` error (it is then dropped, which
    /// deregisters it from its own communicator).
    pub(crate) fn release(self, comm: &Comm<C>) -> Result<Buffer<T, C>> {
        if self.comm.id() != comm.id() {
            return Err(Error::invalid(
                "registration",
                format!(
                    "belongs to communicator #{}, not to #{}",
                    self.comm.id(),
                    comm.id()
                ),
            ));
        }
        let mut this = ManuallyDrop::new(self);
        K::deregister(comm.backend(), this.handle)?;
        // SAFETY: `this` is in ManuallyDrop, so its Drop (which would deregister again and
        // free) never runs; the buffer is moved out exactly once.
        Ok(unsafe { ManuallyDrop::take(&mut this.buf) })
    }
}

owned_buffer_methods!(['c, T: Element, C: Collective, K: Kind] Registration<'c, T, C, K>, self => &self.buf.mem, self.buf.len);

impl<T: Element, C: Collective> Registration<'_, T, C, WindowKind> {
    /// Where rank `rank`'s part of this window lies for this rank's kernels (NCCL 2.29.2's
    /// `ncclGetPeerDevicePointer`): an address to hand to an engine's kernel, with the
    /// rules of [`SymmetricArgs`](crate::symmetric::SymmetricArgs); `None` where the peer
    /// is outside this rank's NVLink domain. A rank outside the world is `InvalidArgument`;
    /// a library before 2.29.2 is `Unsupported` naming it. The mock's windows are not
    /// mapped across ranks: `Unsupported` there (its symmetric memory,
    /// [`Comm::alloc_symmetric`], gives peer addresses).
    pub fn peer_address(&self, rank: usize) -> Result<Option<usize>> {
        let w = self.comm.world_size();
        if rank >= w {
            return Err(Error::invalid(
                "rank",
                format!("rank {rank} is not in a world of {w}"),
            ));
        }
        self.comm.backend().window_peer_address(self.handle, rank)
    }
}

impl<T: Element, C: Collective, K: Kind> std::ops::Deref for Registration<'_, T, C, K> {
    type Target = Buffer<T, C>;
    fn deref(&self) -> &Buffer<T, C> {
        &self.buf
    }
}

impl<T: Element, C: Collective, K: Kind> Drop for Registration<'_, T, C, K> {
    fn drop(&mut self) {
        // A collective deregistration cannot complete on a thread that is unwinding (its
        // peers are not coming with it): abort the communicator instead, which tells the
        // peers at once, and leak the memory (the failed deregistration below) rather than
        // block until the deadline.
        if K::COLLECTIVE && std::thread::panicking() {
            let _ = self.comm.backend().abort();
        }
        // Errors cannot be reported from drop; `Comm::deregister` reports them.
        if K::deregister(self.comm.backend(), self.handle).is_ok() {
            // SAFETY: `buf` is never used again; dropping it frees the memory, which is no
            // longer registered.
            unsafe { ManuallyDrop::drop(&mut self.buf) }
        }
        // On failure the memory is leaked: freeing memory the library may still consider
        // registered is what NCCL's docs warn against.
    }
}

impl<T: Element, C: Collective, K: Kind> std::fmt::Debug for Registration<'_, T, C, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("kind", &K::KIND)
            .field("handle", &self.handle)
            .field("len", &self.buf.len)
            .finish()
    }
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
