//! Host slices lent to collectives through the facade's [`Comm`](crate::Comm).

use unicomm_core::{Error, Result};

use crate::AnyComm;

/// The scope [`host_scope`] lends host slices through, for [`Comm`](crate::Comm)'s
/// collectives ([`unicomm_mock::HostScope`]).
pub type HostScope<'scope, 'env> = unicomm_mock::HostScope<'scope, 'env, AnyComm>;

/// Runs `f` with a scope that lends host slices (`&[T]`, `&mut [T]`) to `comm`'s
/// collectives, then waits for the work holding them and takes them back
/// ([`unicomm_mock::host_scope`], which says what happens at the deadline). Memory of the
/// mock only: a rank in this process reads and writes the slices where they are, a rank of
/// a world of processes through a copy (in when lent, back at the end when lent to be
/// written). On a GPU backend `Unsupported`: its collectives take device memory.
///
/// ```
/// use unicomm::{DeviceStream, ReduceOp, Vendor};
/// let comm = unicomm::local_comms_n(Vendor::Mock, Some(1))?.remove(0);
/// let stream = comm.create_stream()?;
/// let (input, mut output) = (vec![2.0f32; 8], vec![0.0f32; 8]);
/// unicomm::host_scope(&comm, |s| {
///     let (send, mut recv) = (s.lend(&input)?, s.lend_mut(&mut output)?);
///     comm.all_reduce(&send, &mut recv, ReduceOp::Sum, &stream)?;
///     stream.synchronize()
/// })?;
/// assert_eq!(output, input);
/// # Ok::<(), unicomm::Error>(())
/// ```
pub fn host_scope<'env, R>(
    comm: &'env crate::Comm,
    f: impl for<'scope> FnOnce(&'scope HostScope<'scope, 'env>) -> Result<R>,
) -> Result<R> {
    match comm.backend() {
        AnyComm::Mock(m) => unicomm_mock::host_scope(m, f),
        #[allow(unreachable_patterns, reason = "only the mock is compiled in")]
        _ => Err(Error::unsupported(
            "host slices lent to collectives",
            "the mock backend (its memory is host memory)",
            comm.capabilities().backend,
        )),
    }
}
