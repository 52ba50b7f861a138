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
    (coll, dim): (Coll, usize),
    s: &CpuStorage,
    l: &Layout,
) -> Result<(CpuStorage, Shape)> {
    let (start, end) = contiguous(l, coll)?;
    let shape = coll.out_shape(l.shape(), comm.world_size(), dim)?;
    let n = shape.elem_count();
    let input = (l.shape(), dim);
    let out = match s {
        CpuStorage::F32(v) => CpuStorage::F32(run(comm, coll, &v[start..end], input, n)?),
        CpuStorage::F64(v) => CpuStorage::F64(run(comm, coll, &v[start..end], input, n)?),
        CpuStorage::F16(v) => CpuStorage::F16(run(comm, coll, &v[start..end], input, n)?),
        CpuStorage::BF16(v) => CpuStorage::BF16(run(comm, coll, &v[start..end], input, n)?),
        other => return Err(unsupported_dtype(coll, other.dtype())),
    };
    Ok((out, shape))
}

fn run<T: Element + WithDType>(
    comm: &Communicator,
    coll: Coll,
    input: &[T],
    shape: (&Shape, usize),
    n: usize,
) -> Result<Vec<T>> {
    let what = coll.name();
    let mut streams = comm.locked(what)?;
    let c = comm.comm();
    let st = streams.host(c)?;
    // Compared on every call here (the mock, where tests run); on CUDA where checked.
    super::agree(c, st, coll, shape, <T as WithDType>::DTYPE).map_err(|e| wrap(what, e))?;
    let mut out = vec![T::zero(); n];
    unicomm::host_scope(c, |s| {
        let (send, mut recv) = (s.lend(input)?, s.lend_mut(&mut out)?);
        coll.enqueue_unwrapped(c, &send, &mut recv, st)?;
        st.synchronize()
    })
    .map_err(|e| wrap(what, e))?;
    Ok(out)
}
