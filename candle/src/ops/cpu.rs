//! The CPU path: candle's CPU tensors through a communicator whose memory is host memory
//! (the mock). The mock's buffers are its own (in processes, shared memory), so the input
//! is copied in and the output out: two host copies per call.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, Layout, Result, Shape, WithDType};
use unicomm::Element;

use super::{contiguous, unsupported_dtype, Coll};
use crate::comm::{wrap, Communicator};

pub(crate) fn forward(
    comm: &Communicator,
    coll: Coll,
    s: &CpuStorage,
    l: &Layout,
) -> Result<(CpuStorage, Shape)> {
    let (start, end) = contiguous(l, coll)?;
    let shape = coll.out_shape(l.shape(), comm.world_size())?;
    let n = shape.elem_count();
    let out = match s {
        CpuStorage::F32(v) => CpuStorage::F32(run(comm, coll, &v[start..end], n)?),
        CpuStorage::F64(v) => CpuStorage::F64(run(comm, coll, &v[start..end], n)?),
        CpuStorage::F16(v) => CpuStorage::F16(run(comm, coll, &v[start..end], n)?),
        CpuStorage::BF16(v) => CpuStorage::BF16(run(comm, coll, &v[start..end], n)?),
        other => return Err(unsupported_dtype(coll, other.dtype())),
    };
    Ok((out, shape))
}

fn run<T: Element + WithDType>(
    comm: &Communicator,
    coll: Coll,
    input: &[T],
    n: usize,
) -> Result<Vec<T>> {
    let what = coll.name();
    let mut streams = comm.locked(what)?;
    let c = comm.comm();
    let st = streams.host(c)?;
    let send = c.upload(input, st).map_err(|e| wrap(what, e))?;
    let mut recv = c.alloc::<T>(n).map_err(|e| wrap(what, e))?;
    coll.enqueue(c, &send, &mut recv, st)?;
    let mut out = vec![T::zero(); n];
    recv.copy_to_host_into(&mut out, st)
        .map_err(|e| wrap(what, e))?;
    Ok(out)
}
