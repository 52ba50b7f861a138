//! Registration on a communicator: the buffer goes in, a handle that borrows the
//! communicator comes out ([`crate::registration`] holds the handles and their rules).

use super::Comm;
use crate::backend::Collective;
use crate::buffer::Buffer;
use crate::element::Element;
use crate::registration::{Kind, RegisterError, Registered, Registration, Window};
use crate::Result;

impl<C: Collective> Comm<C> {
    fn register_as<T: Element, K: Kind>(
        &self,
        buf: Buffer<T, C>,
        call: impl FnOnce(&C, &C::Memory, usize) -> Result<crate::RawHandle>,
    ) -> Result<Registration<'_, T, C, K>, RegisterError<T, C>> {
        let bytes = buf.len * std::mem::size_of::<T>();
        match crate::capturing::refuse_in_capture("register")
            .and_then(|()| self.raw.check_memory(&buf.mem))
            .and_then(|()| call(&self.raw, &buf.mem, bytes))
        {
            Ok(handle) => Ok(Registration::new(buf, self, handle)),
            Err(error) => Err(RegisterError { error, buffer: buf }),
        }
    }

    /// Registers `buf` with this communicator (`ncclCommRegister`). Lazy in NCCL: the work
    /// happens at the first collective that uses it. If any rank passes registered buffers
    /// to a collective, all ranks must. On failure the buffer comes back in the error.
    pub fn register<T: Element>(
        &self,
        buf: Buffer<T, C>,
    ) -> Result<Registered<'_, T, C>, RegisterError<T, C>> {
        self.register_as(buf, |c, m, bytes| c.register(m, 0, bytes))
    }

    /// Deregisters and returns the buffer. A registration of another communicator is an
    /// `InvalidArgument` error (it is then deregistered from its own communicator and freed).
    /// If the library fails to deregister, the memory is leaked rather than freed while
    /// possibly still registered.
    pub fn deregister<T: Element>(&self, reg: Registered<'_, T, C>) -> Result<Buffer<T, C>> {
        reg.release(self)
    }

    /// Registers `buf` as a symmetric window (`ncclCommWindowRegister`). Collective: every
    /// rank must call it, in the same order, with a buffer of the same size. A library that
    /// cannot give a window (NCCL < 2.27, or a NULL window where symmetric memory is not
    /// supported) gives `Unsupported`.
    pub fn register_window<T: Element>(
        &self,
        buf: Buffer<T, C>,
    ) -> Result<Window<'_, T, C>, RegisterError<T, C>> {
        self.register_as(buf, |c, m, bytes| c.register_window(m, 0, bytes))
    }

    /// Registers `buf` for the automatic policy (collective, like a window): each call whose
    /// buffers are so registered takes the fastest path for its collective and size, from
    /// thresholds calibrated on the machine (`UNICOMM_TUNE_FILE`, written by `cargo xtask
    /// tune`) or built-in defaults. On NCCL/RCCL the buffer is a symmetric window of this
    /// communicator and `ncclCommRegister`ed with a second communicator over the same ranks
    /// (NCCL picks its algorithm from how a buffer is registered); both paths run on the
    /// caller's stream, so ordering holds; at the first one the ranks agree on the
    /// thresholds, and where they differ (tune files from different machines) it fails on
    /// every rank with `InvalidArgument` rather than letting one call take different paths.
    /// Each rank picks the path from its own buffers, so a call must use automatically
    /// registered buffers on every rank or on none (a rank whose buffer is plain would
    /// take another path, and the ranks would wait for each other until their deadline).
    /// On the mock it is a window.
    pub fn register_auto<T: Element>(
        &self,
        buf: Buffer<T, C>,
    ) -> Result<crate::AutoRegistered<'_, T, C>, RegisterError<T, C>> {
        self.register_as(buf, |c, m, bytes| c.register_auto(m, 0, bytes))
    }

    /// Ends an automatic registration and returns the buffer (collective).
    pub fn deregister_auto<T: Element>(
        &self,
        reg: crate::AutoRegistered<'_, T, C>,
    ) -> Result<Buffer<T, C>> {
        reg.release(self)
    }

    /// Deregisters a window and returns the buffer (collective, like registration; see
    /// [`Comm::deregister`]).
    pub fn deregister_window<T: Element>(&self, win: Window<'_, T, C>) -> Result<Buffer<T, C>> {
        win.release(self)
    }
}
