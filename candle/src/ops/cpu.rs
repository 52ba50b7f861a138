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
    shape: Shape,
) -> Result<(CpuStorage, Shape)> {
    let (start, end) = contiguous(l, coll)?;
    let n = shape.elem_count();
    let input = (l.shape(), dim);
    macro_rules! each {
        ($($d:ident),*) => {
            match s {
                $(CpuStorage::$d(v) => CpuStorage::$d(run(comm, coll, &v[start..end], input, n)?),)*
                other => return Err(unsupported_dtype(coll, other.dtype())),
            }
        };
    }
    let out = each!(F32, F64, F16, BF16, U8, U32, I32, I64);
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
    if coll.every_rank() {
        super::agree(c, st, coll, shape, <T as WithDType>::DTYPE).map_err(|e| wrap(what, e))?;
    }
    let mut out = vec![T::zero(); n];
    unicomm::host_scope(c, |s| {
        let (send, mut recv) = (s.lend(input)?, s.lend_mut(&mut out)?);
        coll.enqueue_unwrapped(c, &send, &mut recv, st)?;
        st.synchronize()
    })
    .map_err(|e| wrap(what, e))?;
    Ok(out)
}
