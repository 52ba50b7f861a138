//! The data check: every rank's input a function of its rank and index, every output
//! compared with what the collective must give (nccl-tests' `-c`).

use half::{bf16, f16};
use unicomm::{Element, ReduceOp};

use crate::{Coll, Work};

/// Element types with the values the check uses (small integers, exact in every type).
pub trait Val: Element {
    /// The value of a small integer.
    fn of(v: i64) -> Self;
    /// As f64.
    fn f(self) -> f64;
}
macro_rules! val {
    ($($t:ty),*) => {$(
        impl Val for $t {
            fn of(v: i64) -> Self { v as $t }
            fn f(self) -> f64 { self as f64 }
        }
    )*};
}
val!(f32, f64, i8, u8, i32, u32, i64, u64);
impl Val for f16 {
    fn of(v: i64) -> Self {
        f16::from_f64(v as f64)
    }
    fn f(self) -> f64 {
        self.to_f64()
    }
}
impl Val for bf16 {
    fn of(v: i64) -> Self {
        bf16::from_f64(v as f64)
    }
    fn f(self) -> f64 {
        self.to_f64()
    }
}

/// Rank `r`'s input element `i`: small, so every reduction is exact.
pub(crate) fn input(r: usize, i: usize) -> i64 {
    (r as i64 + 1) + (i % 3) as i64
}

/// The reduction over `w` ranks of `input(p, j)` (closed forms: `input` is `p + 1 + j % 3`).
pub(crate) fn reduced(op: ReduceOp, w: usize, j: usize) -> i64 {
    let (w, m) = (w as i64, (j % 3) as i64);
    match op {
        ReduceOp::Max => w + m,
        ReduceOp::Min => 1 + m,
        _ => w * (w + 1) / 2 + w * m,
    }
}

/// Element counts of a workload for `w` ranks: (the call's count, send elements, recv
/// elements), or `None` when the size is too small to give every rank an element.
pub(crate) fn shape(work: &Work, w: usize) -> Option<(usize, usize, usize)> {
    let elems = work.bytes / work.dtype.size();
    let n = if work.coll.per_rank() {
        elems / w
    } else {
        elems
    };
    if n == 0 {
        return None;
    }
    Some(match work.coll {
        Coll::AllReduce | Coll::Broadcast => (n, n, n),
        Coll::AllGather => (n, n, n * w),
        Coll::ReduceScatter => (n, n * w, n),
        Coll::AllToAll => (n, n * w, n * w),
        Coll::Gather => (n, n, n * w),
        Coll::Scatter => (n, n * w, n),
        Coll::AllToAllV => {
            let cap = super::vcounts::A2av::new(work, n, w).cap();
            (n, cap, cap)
        }
    })
}
macro_rules! val_fp8 {
    ($($t:ty),*) => {$(
        impl Val for $t {
            fn of(v: i64) -> Self { <$t>::from_f64(v as f64) }
            fn f(self) -> f64 { self.to_f64() }
        }
    )*};
}
val_fp8!(unicomm::F8E4M3, unicomm::F8E5M2);
