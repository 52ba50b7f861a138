//! Host slices lent to the mock's collectives for a scope ([`host_scope`]): an engine's CPU
//! tensors used as a collective's input and output where they are.

use unicomm_core::element::{as_bytes, as_bytes_mut};
use unicomm_core::{Collective, Element, Lent, LentMut, Result};

use crate::memory::{HostBytes, HostScope, MockMemory};
use crate::MockComm;

/// Runs `f` with a [`HostScope`] of `comm`'s rank, then ends the scope: waits until no work
/// holds a slice lent in it (the communicator's deadline) and takes them back. The result is
/// `f`'s, else the end's error (`Timeout`: work still held a slice at the deadline and is
/// refused it). `D` is the communicator type the views are for: [`MockComm`], or a type
/// wrapping it (the facade's `AnyComm`: `unicomm::host_scope`).
///
/// The work's own errors surface at the stream's `synchronize`, as on a GPU, and at the
/// scope's end: work on a lent slice that failed (a peer that aborted or never joined) ends
/// the scope with its error even where it let go of the slice before the deadline, so an
/// `Ok` scope always had its work done.
///
/// ```
/// use unicomm_core::{Comm, DeviceStream, ReduceOp};
/// let comms = unicomm_mock::world(1, Default::default())?;
/// let comm = Comm::from_backend(comms.into_iter().next().unwrap());
/// let (input, mut output) = (vec![1.5f32; 4], vec![0f32; 4]);
/// let stream = comm.create_stream()?;
/// unicomm_mock::host_scope(comm.backend(), |s| {
///     let send = s.lend(&input)?;
///     let mut recv = s.lend_mut(&mut output)?;
///     comm.all_reduce(&send, &mut recv, ReduceOp::Sum, &stream)?;
///     stream.synchronize()
/// })?;
/// assert_eq!(output, input);
/// # Ok::<(), unicomm_core::Error>(())
/// ```
///
/// A lent slice cannot leave the scope:
///
/// ```compile_fail,E0521
/// let comms = unicomm_mock::world(1, Default::default())?;
/// let input = vec![1f32; 4];
/// let mut kept = None;
/// unicomm_mock::host_scope::<unicomm_mock::MockComm, _>(&comms[0], |s| {
///     kept = Some(s.lend(&input)?);
///     Ok(())
/// })?;
/// # Ok::<(), unicomm_core::Error>(())
/// ```
pub fn host_scope<'env, D, R>(
    comm: &'env MockComm,
    f: impl for<'scope> FnOnce(&'scope HostScope<'scope, 'env, D>) -> Result<R>,
) -> Result<R> {
    let scope = HostScope::new(comm);
    // A panic in `f` ends the scope too (every lending taken back before the caller's
    // frame, which owns the slices, unwinds), then carries on.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&scope)));
    let end = scope.end();
    let r = r.unwrap_or_else(|p| std::panic::resume_unwind(p))?;
    end.map(|()| r)
}

impl<'scope, D> HostScope<'scope, '_, D>
where
    D: Collective,
    D::Memory: From<MockMemory>,
{
    /// `s`, lent to be read by the collectives of this scope's rank.
    pub fn lend<T: Element>(&'scope self, s: &'scope [T]) -> Result<Lent<'scope, T, D>> {
        let mem = self.take(HostBytes::Read(as_bytes(s)))?;
        Lent::from_memory(D::Memory::from(mem), s.len())
    }

    /// `s`, lent to be written (and read) by the collectives of this scope's rank.
    pub fn lend_mut<T: Element>(&'scope self, s: &'scope mut [T]) -> Result<LentMut<'scope, T, D>> {
        let len = s.len();
        let mem = self.take(HostBytes::Write(as_bytes_mut(s)))?;
        LentMut::from_memory(D::Memory::from(mem), len)
    }
}
