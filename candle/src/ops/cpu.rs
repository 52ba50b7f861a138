//! The CPU path: candle's CPU tensors through a communicator whose memory is host memory
//! (the mock). The input's storage and the output's new vector are lent to the collective
//! for the call (`unicomm::host_scope`): no copy where the rank lives in this process; in
//! a world of processes the mock copies them into shared memory and back.

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
    let mut out = vec![T::zero(); n];
    unicomm::host_scope(c, |s| {
        let (send, mut recv) = (s.lend(input)?, s.lend_mut(&mut out)?);
        coll.enqueue_unwrapped(c, &send, &mut recv, st)?;
        st.synchronize()
    })
    .map_err(|e| wrap(what, e))?;
    Ok(out)
}
