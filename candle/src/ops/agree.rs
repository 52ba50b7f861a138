//! The ranks' agreement on an op's input: type and shape, before the collective.

use candle_core::Shape;

use super::coll::{callers_dims, Coll};

/// Every rank's input agrees with rank 0's in type and shape (NCCL sees only a count of
/// elements: ranks of equal counts and other shapes would reinterpret each other's bytes):
/// one all-gather of each rank's type and dimensions; `Mismatch` naming the ranks, in the
/// caller's dimensions, otherwise. The CPU path compares on every call; the CUDA path where
/// collectives are checked (`UNICOMM_CHECK_COLLECTIVES=1`).
pub(crate) fn agree(
    comm: &unicomm::Comm,
    stream: &unicomm::Stream,
    coll: Coll,
    (shape, dim): (&Shape, usize),
    dtype: candle_core::DType,
) -> unicomm::Result<()> {
    let w = comm.world_size();
    if w == 1 {
        return Ok(());
    }
    let dims = callers_dims(shape, dim);
    let mine = describe(&dims, dtype);
    let send = comm.upload(&mine, stream)?;
    let mut all = comm.alloc::<i64>(w * DESC)?;
    comm.all_gather(&send, &mut all, stream)?;
    let all = all.copy_to_host(stream)?;
    let first = &all[..DESC];
    let Some(r) = (1..w).find(|&r| &all[r * DESC..][..DESC] != first) else {
        return Ok(());
    };
    let theirs = &all[r * DESC..][..DESC];
    let what = if theirs[0] != first[0] {
        "dtype"
    } else {
        "shape"
    };
    let show = |d: &[i64]| format!("{} {}", dtype_name(d[0]), shown_dims(d));
    Err(unicomm::Error::Mismatch {
        what,
        detail: format!(
            "{}: rank 0's input is {}, rank {r}'s is {} (every rank passes the same type and shape)",
            coll.name(),
            show(first),
            show(theirs)
        ),
    })
}

/// A rank's description: its type, its number of dimensions and the first seven, and a
/// digest of any further ones.
const DESC: usize = 10;

fn describe(dims: &[usize], dtype: candle_core::DType) -> [i64; DESC] {
    let mut d = [0i64; DESC];
    d[0] = DTYPES
        .iter()
        .position(|&t| t == dtype)
        .map_or(-1, |i| i as i64);
    d[1] = dims.len() as i64;
    for (slot, &n) in d[2..9].iter_mut().zip(dims) {
        *slot = n as i64;
    }
    d[9] = dims.iter().skip(7).fold(0xcbf2_9ce4_8422_2325u64, |h, &n| {
        (h ^ n as u64).wrapping_mul(0x100_0000_01b3)
    }) as i64;
    d
}

const DTYPES: [candle_core::DType; 8] = {
    use candle_core::DType::*;
    [U8, U32, I32, I64, BF16, F16, F32, F64]
};

fn dtype_name(code: i64) -> String {
    usize::try_from(code)
        .ok()
        .and_then(|i| DTYPES.get(i))
        .map_or_else(|| "another type".into(), |t| format!("{t:?}"))
}

fn shown_dims(d: &[i64]) -> String {
    let n = d[1].max(0) as usize;
    let listed: Vec<String> = d[2..2 + n.min(7)].iter().map(|x| x.to_string()).collect();
    let more = if n > 7 { ", ..." } else { "" };
    format!("[{}{more}]", listed.join(", "))
}
