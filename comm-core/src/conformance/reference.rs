//! The host reference: inputs chosen so every result is exact, the expected values
//! computed independently of any backend (in i128 / f64), and the check of one rank's output.

use crate::{bf16, f16, DataType, Element, ReduceOp};

use super::{Case, Coll, Count, Place};

/// Element types with the host arithmetic the reference needs.
pub(super) trait Sample: Element {
    /// The value `v` (small integers, exactly representable in every type).
    fn from_i64(v: i64) -> Self;
    /// The value as f64 (exact for every sample used).
    fn to_f64(self) -> f64;
    /// `v` wrapped into the type, as C's conversion to an unsigned type (and two's
    /// complement for signed) does. Floats convert.
    fn wrap(v: i128) -> Self;
    /// Whether the type is signed (integers) or a float.
    const SIGNED: bool;
}

macro_rules! sample_int {
    ($($t:ty, $s:expr;)*) => {$(
        impl Sample for $t {
            fn from_i64(v: i64) -> Self { v as $t }
            fn to_f64(self) -> f64 { self as f64 }
            fn wrap(v: i128) -> Self { v as $t }
            const SIGNED: bool = $s;
        }
    )*};
}
sample_int!(i8, true; u8, false; i32, true; u32, false; i64, true; u64, false;);

impl Sample for f32 {
    fn from_i64(v: i64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn wrap(v: i128) -> Self {
        v as f32
    }
    const SIGNED: bool = true;
}
impl Sample for f64 {
    fn from_i64(v: i64) -> Self {
        v as f64
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn wrap(v: i128) -> Self {
        v as f64
    }
    const SIGNED: bool = true;
}
impl Sample for f16 {
    fn from_i64(v: i64) -> Self {
        f16::from_f64(v as f64)
    }
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    fn wrap(v: i128) -> Self {
        f16::from_f64(v as f64)
    }
    const SIGNED: bool = true;
}
impl Sample for bf16 {
    fn from_i64(v: i64) -> Self {
        bf16::from_f64(v as f64)
    }
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    fn wrap(v: i128) -> Self {
        bf16::from_f64(v as f64)
    }
    const SIGNED: bool = true;
}

/// Input element `i` of rank `r`, chosen so that every reference result is exact: sums of
/// at most 8 values in -3..=3 (0..=6 unsigned), products of 1, 2 or -1, max/min over
/// -5..=5 (0..=10 unsigned).
pub(super) fn input<T: Sample>(op: ReduceOp, r: usize, i: usize) -> i64 {
    let h = (r as i64) * 7 + (i as i64) * 3 + (i as i64 / 13);
    match op {
        ReduceOp::Sum | ReduceOp::Avg => {
            if T::SIGNED {
                h % 7 - 3
            } else {
                h % 7
            }
        }
        ReduceOp::Prod => match h % 4 {
            0 | 1 => 1,
            2 => 2,
            _ if T::SIGNED => -1,
            _ => 1,
        },
        ReduceOp::Max | ReduceOp::Min => {
            if T::SIGNED {
                (h * 5) % 11 - 5
            } else {
                (h * 5) % 11
            }
        }
    }
}

/// The reference reduction of `vals` (one per rank), computed in i128 and converted once,
/// wrapping as the type does. Float averages are checked by [`check_value`] instead.
pub(super) fn reference<T: Sample>(op: ReduceOp, vals: &[i64]) -> T {
    let n = vals.len() as i128;
    match op {
        ReduceOp::Sum => T::wrap(vals.iter().map(|&v| v as i128).sum()),
        ReduceOp::Prod => {
            // Integer products wrap at every step, as the type does; the float samples are
            // exact (at most 2^8).
            vals.iter().fold(T::wrap(1), |acc, &v| {
                T::wrap((acc.to_f64() as i128).wrapping_mul(v as i128))
            })
        }
        ReduceOp::Max => T::wrap(vals.iter().copied().max().unwrap_or(0) as i128),
        ReduceOp::Min => T::wrap(vals.iter().copied().min().unwrap_or(0) as i128),
        ReduceOp::Avg => {
            // NCCL's SumPostDiv: the sum wraps in the type, then divides, truncating.
            let wrapped = T::wrap(vals.iter().map(|&v| v as i128).sum()).to_f64() as i128;
            T::wrap(wrapped / n)
        }
    }
}

/// The exact expected value, or for float averages the exact mean and its tolerance.
pub(super) fn reference_or_tolerance<T: Sample>(
    op: ReduceOp,
    vals: &[i64],
) -> std::result::Result<T, (f64, f64)> {
    if op == ReduceOp::Avg && T::DTYPE.is_float() {
        // NCCL pre-multiplies each input by 1/n (rounded) and sums: 2n-1 roundings of values
        // of magnitude < 4, each within half an ulp, so within 4*n*eps of the exact mean.
        let n = vals.len() as f64;
        let mean = vals.iter().map(|&v| v as f64).sum::<f64>() / n;
        let eps = match T::DTYPE {
            DataType::F16 => (-10f64).exp2(),
            DataType::Bf16 => (-7f64).exp2(),
            DataType::F32 => (-23f64).exp2(),
            _ => (-52f64).exp2(),
        };
        return Err((mean, 4.0 * n * eps));
    }
    Ok(reference::<T>(op, vals))
}

const SENTINEL: i64 = 9;

pub(super) fn sentinel<T: Sample>() -> T {
    T::from_i64(SENTINEL)
}

/// Elements per rank's chunk and total buffer lengths for a case.
pub(super) struct Shape {
    /// The count the collective is called with (per peer for the per-rank collectives).
    pub(super) count: usize,
    pub(super) send_len: usize,
    pub(super) recv_len: usize,
}

pub(super) fn shape(case: &Case) -> Shape {
    let w = case.world;
    let base = match case.count {
        Count::Zero => 0,
        Count::One => 1,
        Count::Odd => 1001,
        Count::Large => 1 << 20,
        Count::Exactly(n) => n,
    };
    let per_rank = |n: usize| if case.count == Count::Large { n / w } else { n };
    match case.coll {
        Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => Shape {
            count: base,
            send_len: base,
            recv_len: base,
        },
        Coll::Barrier => Shape {
            count: 0,
            send_len: 0,
            recv_len: 0,
        },
        Coll::AllGather => {
            let c = per_rank(base);
            Shape {
                count: c,
                send_len: c,
                recv_len: c * w,
            }
        }
        Coll::ReduceScatter => {
            let c = per_rank(base);
            Shape {
                count: c,
                send_len: c * w,
                recv_len: c,
            }
        }
        Coll::AllToAll => {
            let c = per_rank(base);
            Shape {
                count: c,
                send_len: c * w,
                recv_len: c * w,
            }
        }
    }
}

pub(super) fn root(case: &Case) -> usize {
    match case.coll {
        Coll::Broadcast => case.world - 1,
        Coll::Reduce => case.world / 2,
        _ => 0,
    }
}

/// What rank `r` starts with in its send buffer (in place: in its one buffer).
pub(super) fn send_data<T: Sample>(case: &Case, exp: &Expected<T>, r: usize) -> Vec<T> {
    let s = shape(case);
    let input = |_: ReduceOp, r: usize, i: usize| exp.inputs[r][i] as i64;
    let op = ReduceOp::Sum;
    match (case.coll, case.place) {
        // In place, the rank's input is its chunk of the larger buffer; the rest is sentinel.
        (Coll::AllGather, Place::In) => (0..s.recv_len)
            .map(|i| {
                if i / s.count.max(1) == r && s.count > 0 {
                    T::from_i64(input(op, r, i))
                } else {
                    sentinel()
                }
            })
            .collect(),
        _ => (0..s.send_len)
            .map(|i| T::from_i64(input(op, r, i)))
            .collect(),
    }
}

pub(super) fn reduces(c: Coll) -> bool {
    matches!(c, Coll::AllReduce | Coll::Reduce | Coll::ReduceScatter)
}

/// The inputs of every rank and the reduced values, computed once per case.
pub(super) struct Expected<T> {
    /// `inputs[k][i]`: element `i` of rank `k`'s input (as in `input`, which stays in
    /// -5..=10).
    inputs: Vec<Vec<i8>>,
    /// For the reducing collectives, element `i` of the reduction over every rank's
    /// element `i`, computed once and reused by every rank.
    reduced: Vec<T>,
    /// For float averages instead: the exact means, and the tolerance.
    means: Vec<f64>,
    tol: f64,
}

impl<T: Sample> Expected<T> {
    pub(super) fn new(case: &Case) -> Self {
        let s = shape(case);
        let op = if reduces(case.coll) {
            case.op
        } else {
            ReduceOp::Sum
        };
        let len = s.send_len.max(s.recv_len);
        let inputs: Vec<Vec<i8>> = (0..case.world)
            .map(|k| (0..len).map(|i| input::<T>(op, k, i) as i8).collect())
            .collect();
        let mut e = Expected {
            inputs,
            reduced: Vec::new(),
            means: Vec::new(),
            tol: 0.0,
        };
        if !reduces(case.coll) {
            return e;
        }
        let mut vals = vec![0i64; case.world];
        for i in 0..s.send_len {
            for (k, v) in vals.iter_mut().enumerate() {
                *v = e.inputs[k][i] as i64;
            }
            match reference_or_tolerance::<T>(op, &vals) {
                Ok(want) => e.reduced.push(want),
                Err((mean, tol)) => {
                    e.means.push(mean);
                    e.tol = tol;
                }
            }
        }
        e
    }

    /// Checks a reduced element against the reduction of every rank's element `src`.
    fn reduced(&self, src: usize, got: T) -> std::result::Result<(), String> {
        if let Some(&want) = self.reduced.get(src) {
            return expect(got, want);
        }
        let mean = self.means[src];
        if (got.to_f64() - mean).abs() <= self.tol {
            Ok(())
        } else {
            Err(format!("got {got:?}, want {mean} within {:e}", self.tol))
        }
    }
}

/// Checks rank `r`'s output against the reference.
pub(super) fn verify<T: Sample>(
    case: &Case,
    exp: &Expected<T>,
    r: usize,
    out: &[T],
) -> std::result::Result<(), String> {
    let s = shape(case);
    let w = case.world;
    let inp = |rank: usize, i: usize| exp.inputs[rank][i] as i64;
    let bad = |i: usize, e: String| Err(format!("rank {r}, element {i}: {e}"));
    for (i, &got) in out.iter().enumerate() {
        let res = match case.coll {
            Coll::AllReduce => exp.reduced(i, got),
            Coll::Reduce => {
                if r == root(case) {
                    exp.reduced(i, got)
                } else if case.place == Place::In {
                    // Non-root buffers are inputs only and stay as they were.
                    expect(got, T::from_i64(inp(r, i)))
                } else {
                    expect(got, sentinel())
                }
            }
            Coll::Broadcast => expect(got, T::from_i64(inp(root(case), i))),
            Coll::AllGather => {
                let (k, j) = (i / s.count, i % s.count);
                // In place the source chunk k of rank k sits at index i of its buffer.
                let idx = if case.place == Place::In { i } else { j };
                expect(got, T::from_i64(inp(k, idx)))
            }
            Coll::ReduceScatter => {
                let base = if case.place == Place::In {
                    r * s.count
                } else {
                    0
                };
                if case.place == Place::In && (i < base || i >= base + s.count) {
                    // Outside this rank's chunk the buffer keeps its input.
                    expect(got, T::from_i64(inp(r, i)))
                } else {
                    exp.reduced(r * s.count + (i - base), got)
                }
            }
            Coll::AllToAll => {
                let (p, j) = (i / s.count, i % s.count);
                expect(got, T::from_i64(inp(p, r * s.count + j)))
            }
            Coll::SendRecv => {
                let from = (r + w - 1) % w;
                expect(got, T::from_i64(inp(from, i)))
            }
            Coll::Barrier => Ok(()),
        };
        if let Err(e) = res {
            return bad(i, e);
        }
    }
    Ok(())
}

pub(super) fn expect<T: Sample>(got: T, want: T) -> std::result::Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("got {got:?}, want {want:?}"))
    }
}
