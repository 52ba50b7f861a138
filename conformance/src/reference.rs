//! The host reference: inputs chosen so every result is exact, the expected values
//! computed independently of any backend (in i128 / f64), and the check of one rank's output.

use unicomm_core::{DataType, ReduceOp};

use super::{Case, Coll, Count, Place};

pub(super) use super::sample::Sample;

/// Input element `i` of rank `r`, chosen so that every reference result is exact: sums of
/// at most 8 values in -3..=3 (0..=6 unsigned), products of 1, 2 or -1, max/min over
/// -5..=5 (0..=10 unsigned).
pub(super) fn input<T: Sample>(op: ReduceOp, r: usize, i: usize) -> i64 {
    let h = (r as i64) * 7 + (i as i64) * 3 + (i as i64 / 13);
    match op {
        ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PreMulSum(_) => {
            if T::NARROW {
                // A function of h % 7, so the period of the inputs holds.
                [-1, 0, 1, -1, 0, 1, 0][(h % 7) as usize]
            } else if T::SIGNED {
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
        // The suite's tables scale by one (the scaled sums have their own cases).
        ReduceOp::Sum | ReduceOp::PreMulSum(_) => T::wrap(vals.iter().map(|&v| v as i128).sum()),
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
            DataType::F8E4M3 => (-3f64).exp2(),
            DataType::F8E5M2 => (-2f64).exp2(),
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
    let mut v = Vec::with_capacity(s.send_len.max(s.recv_len));
    match (case.coll, case.place) {
        // In place, the rank's input is its chunk of the larger buffer; the rest is sentinel.
        (Coll::AllGather, Place::In) => {
            v.resize(r * s.count, sentinel());
            exp.extend(&mut v, r, r * s.count, s.count);
            v.resize(s.recv_len, sentinel());
        }
        _ => exp.extend(&mut v, r, 0, s.send_len),
    }
    v
}

pub(super) fn reduces(c: Coll) -> bool {
    matches!(c, Coll::AllReduce | Coll::Reduce | Coll::ReduceScatter)
}

/// [`input`] repeats with this period in the element index: `h` grows by
/// `3 * 1001 + 1001 / 13 = 3080 = 10 * 308` over it, a multiple of 7, 4 and 11. The
/// reference is therefore computed for one period and indexed modulo it (the 1 Mi-element
/// cases check every element against the same values, for a thousandth of the work).
pub(super) const PERIOD: usize = 1001;

/// The inputs of every rank and the reduced values, computed once per case for one
/// [`PERIOD`] of element indices.
pub(super) struct Expected<T> {
    /// `inputs[k][i % PERIOD]`: element `i` of rank `k`'s input (as in [`input`], which
    /// stays in -5..=10), in the case's type.
    inputs: Vec<Vec<T>>,
    /// For the reducing collectives, element `i % PERIOD` of the reduction over every
    /// rank's element `i`.
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
        let len = s.send_len.max(s.recv_len).min(PERIOD);
        let raw: Vec<Vec<i64>> = (0..case.world)
            .map(|k| (0..len).map(|i| input::<T>(op, k, i)).collect())
            .collect();
        let mut e = Expected {
            inputs: raw
                .iter()
                .map(|row| row.iter().map(|&v| T::from_i64(v)).collect())
                .collect(),
            reduced: Vec::new(),
            means: Vec::new(),
            tol: 0.0,
        };
        if !reduces(case.coll) {
            return e;
        }
        let mut vals = Vec::with_capacity(case.world);
        for i in 0..s.send_len.min(PERIOD) {
            vals.clear();
            vals.extend(raw.iter().map(|row| row[i]));
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

    /// Appends elements `start..start + n` of rank `k`'s input to `v`.
    fn extend(&self, v: &mut Vec<T>, k: usize, start: usize, n: usize) {
        let row = &self.inputs[k];
        let mut done = 0;
        while done < n {
            let from = (start + done) % PERIOD;
            let take = row.len().saturating_sub(from).min(n - done);
            if take == 0 {
                // Beyond the table (a caller's bug): what `verify` reports as wrong data.
                v.resize(v.len() + n - done, sentinel());
                return;
            }
            v.extend_from_slice(&row[from..from + take]);
            done += take;
        }
    }

    /// Checks a reduced element against the reduction of every rank's element `src`.
    fn reduced(&self, src: usize, got: T) -> std::result::Result<(), String> {
        let src = src % PERIOD;
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

/// Where a stretch of a rank's output comes from: the expected value of its element `j`
/// (counting from the stretch's start).
#[derive(Clone, Copy)]
enum Source {
    /// Element `start + j` of rank `rank`'s input.
    Input { rank: usize, start: usize },
    /// Element `start + j` of the reduction over every rank's input.
    Reduced { start: usize },
    /// The sentinel a buffer was filled with: the collective must not write there.
    Sentinel,
}

/// Rank `r`'s whole output as consecutive stretches `(length, source)`.
fn layout(case: &Case, r: usize, len: usize) -> Vec<(usize, Source)> {
    let s = shape(case);
    let w = case.world;
    let c = s.count;
    let chunks = |f: &dyn Fn(usize) -> Source| (0..w).map(|k| (c, f(k))).collect();
    match case.coll {
        Coll::AllReduce => vec![(len, Source::Reduced { start: 0 })],
        Coll::Reduce if r == root(case) => vec![(len, Source::Reduced { start: 0 })],
        // Non-root buffers are inputs only and stay as they were.
        Coll::Reduce if case.place == Place::In => {
            vec![(len, Source::Input { rank: r, start: 0 })]
        }
        Coll::Reduce => vec![(len, Source::Sentinel)],
        Coll::Broadcast => vec![(
            len,
            Source::Input {
                rank: root(case),
                start: 0,
            },
        )],
        // In place the source chunk k of rank k sits at its place in its buffer.
        Coll::AllGather if case.place == Place::In => chunks(&|k| Source::Input {
            rank: k,
            start: k * c,
        }),
        Coll::AllGather => chunks(&|k| Source::Input { rank: k, start: 0 }),
        Coll::ReduceScatter if case.place == Place::In => {
            // Outside this rank's chunk the buffer keeps its input.
            chunks(&|k| {
                if k == r {
                    Source::Reduced { start: r * c }
                } else {
                    Source::Input {
                        rank: r,
                        start: k * c,
                    }
                }
            })
        }
        Coll::ReduceScatter => vec![(len, Source::Reduced { start: r * c })],
        Coll::AllToAll => chunks(&|p| Source::Input {
            rank: p,
            start: r * c,
        }),
        Coll::SendRecv => vec![(
            len,
            Source::Input {
                rank: (r + w - 1) % w,
                start: 0,
            },
        )],
        Coll::Barrier => vec![(len, Source::Sentinel)],
    }
}

/// Checks rank `r`'s output against the reference.
pub(super) fn verify<T: Sample>(
    case: &Case,
    exp: &Expected<T>,
    r: usize,
    out: &[T],
) -> std::result::Result<(), String> {
    if case.coll == Coll::Barrier {
        return Ok(());
    }
    let mut at = 0;
    for (n, src) in layout(case, r, out.len()) {
        let n = n.min(out.len() - at);
        check_stretch(exp, src, &out[at..at + n])
            .map_err(|(j, e)| format!("rank {r}, element {}: {e}", at + j))?;
        at += n;
    }
    if at != out.len() {
        return Err(format!(
            "rank {r}: the reference covers {at} of {} elements",
            out.len()
        ));
    }
    Ok(())
}

/// Checks one stretch of output against its source, a table period at a time (a slice
/// comparison each), element by element only where one differs or for float averages.
fn check_stretch<T: Sample>(
    exp: &Expected<T>,
    src: Source,
    out: &[T],
) -> std::result::Result<(), (usize, String)> {
    let (table, start): (&[T], usize) = match src {
        Source::Input { rank, start } => (&exp.inputs[rank], start),
        Source::Reduced { start } if exp.means.is_empty() => (&exp.reduced, start),
        Source::Reduced { start } => {
            for (j, &got) in out.iter().enumerate() {
                exp.reduced(start + j, got).map_err(|e| (j, e))?;
            }
            return Ok(());
        }
        Source::Sentinel => {
            return match out.iter().position(|&got| got != sentinel()) {
                None => Ok(()),
                Some(j) => Err((j, mismatch(out[j], sentinel()))),
            };
        }
    };
    let mut j = 0;
    while j < out.len() {
        let from = (start + j) % PERIOD;
        let take = table.len().saturating_sub(from).min(out.len() - j);
        if take == 0 {
            return Err((j, format!("no reference for element {}", start + j)));
        }
        let (got, want) = (&out[j..j + take], &table[from..from + take]);
        if got != want {
            let k = (0..take).find(|&k| got[k] != want[k]).unwrap_or(0);
            return Err((j + k, mismatch(got[k], want[k])));
        }
        j += take;
    }
    Ok(())
}

pub(super) fn expect<T: Sample>(got: T, want: T) -> std::result::Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(mismatch(got, want))
    }
}

fn mismatch<T: Sample>(got: T, want: T) -> String {
    format!("got {got:?}, want {want:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference is computed for one period only: every input of every rank, for every
    /// op and signedness, repeats with it up to the largest count the suite uses.
    #[test]
    fn inputs_repeat_with_the_period() {
        for op in [
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Max,
            ReduceOp::Min,
            ReduceOp::Avg,
        ] {
            for r in 0..8 {
                for i in PERIOD..(1 << 20) + PERIOD {
                    assert_eq!(input::<i32>(op, r, i), input::<i32>(op, r, i % PERIOD));
                    assert_eq!(input::<u8>(op, r, i), input::<u8>(op, r, i % PERIOD));
                }
            }
        }
    }

    fn case(coll: Coll, op: ReduceOp, world: usize) -> Case {
        Case {
            coll,
            dtype: DataType::I32,
            op,
            count: Count::Large,
            place: Place::Out,
            reg: crate::Reg::None,
            world,
        }
    }

    /// What rank `r` must hold after the case, computed element by element from [`input`]
    /// and [`reference`] with no table.
    fn direct(c: &Case, r: usize) -> Vec<i32> {
        let s = shape(c);
        let op = if reduces(c.coll) { c.op } else { ReduceOp::Sum };
        let inp = |k: usize, i: usize| input::<i32>(op, k, i) as i32;
        let red = |i: usize| {
            let vals: Vec<i64> = (0..c.world).map(|k| input::<i32>(op, k, i)).collect();
            reference::<i32>(op, &vals)
        };
        let (n, inplace) = (s.count, c.place == Place::In);
        let len = if inplace {
            s.send_len.max(s.recv_len)
        } else {
            s.recv_len
        };
        (0..len)
            .map(|i| match c.coll {
                Coll::AllReduce => red(i),
                Coll::Reduce if r == root(c) => red(i),
                Coll::Reduce if inplace => inp(r, i),
                Coll::Reduce => sentinel(),
                Coll::Broadcast => inp(root(c), i),
                Coll::ReduceScatter if inplace && i / n != r => inp(r, i),
                Coll::ReduceScatter if inplace => red(i),
                Coll::ReduceScatter => red(r * n + i),
                Coll::AllGather if inplace => inp(i / n, i),
                Coll::AllGather => inp(i / n, i % n),
                Coll::AllToAll => inp(i / n, r * n + i % n),
                Coll::SendRecv => inp((r + c.world - 1) % c.world, i),
                Coll::Barrier => unreachable!("no output"),
            })
            .collect()
    }

    /// The check built from one period accepts exactly the output computed element by
    /// element over a whole 1 Mi-element case, and rejects one wrong element anywhere in
    /// it (past the first period included).
    #[test]
    fn the_period_table_checks_every_element() {
        for (coll, op, place) in [
            (Coll::AllReduce, ReduceOp::Sum, Place::Out),
            (Coll::AllReduce, ReduceOp::Prod, Place::In),
            (Coll::AllReduce, ReduceOp::Max, Place::Out),
            (Coll::Reduce, ReduceOp::Min, Place::In),
            (Coll::Reduce, ReduceOp::Sum, Place::Out),
            (Coll::ReduceScatter, ReduceOp::Min, Place::Out),
            (Coll::ReduceScatter, ReduceOp::Sum, Place::In),
            (Coll::Broadcast, ReduceOp::Sum, Place::Out),
            (Coll::AllGather, ReduceOp::Sum, Place::Out),
            (Coll::AllGather, ReduceOp::Sum, Place::In),
            (Coll::AllToAll, ReduceOp::Sum, Place::Out),
            (Coll::SendRecv, ReduceOp::Sum, Place::Out),
        ] {
            let c = Case {
                place,
                ..case(coll, op, 3)
            };
            let exp = Expected::<i32>::new(&c);
            for r in 0..c.world {
                let mut out = direct(&c, r);
                verify(&c, &exp, r, &out).unwrap_or_else(|e| panic!("{coll:?} {op:?}: {e}"));
                let n = out.len();
                for i in [PERIOD + 7, n / 2 + 1, n - 1] {
                    out[i] = out[i].wrapping_add(1);
                    let err = verify(&c, &exp, r, &out).expect_err("a wrong element");
                    assert!(err.contains(&format!("element {i}:")), "{err}");
                    out[i] = out[i].wrapping_sub(1);
                }
            }
        }
    }

    /// The send buffers are the inputs of [`input`], element by element (in-place
    /// all-gather: the rank's own chunk at its place, the sentinel elsewhere).
    #[test]
    fn send_data_is_the_input() {
        let c = case(Coll::AllToAll, ReduceOp::Sum, 4);
        let exp = Expected::<i32>::new(&c);
        for r in 0..c.world {
            let want: Vec<i32> = (0..shape(&c).send_len)
                .map(|i| input::<i32>(ReduceOp::Sum, r, i) as i32)
                .collect();
            assert_eq!(send_data(&c, &exp, r), want);
        }
        let c = Case {
            place: Place::In,
            ..case(Coll::AllGather, ReduceOp::Sum, 3)
        };
        let exp = Expected::<i32>::new(&c);
        let n = shape(&c).count;
        for r in 0..c.world {
            let want: Vec<i32> = (0..n * c.world)
                .map(|i| {
                    if i / n == r {
                        input::<i32>(ReduceOp::Sum, r, i) as i32
                    } else {
                        sentinel()
                    }
                })
                .collect();
            assert_eq!(send_data(&c, &exp, r), want);
        }
    }
}
