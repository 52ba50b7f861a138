//! unicomm's symmetric kernels, the same on every backend that has them: the all-reduce of
//! each algorithm (one shot, two shots, Lamport) over f32, f16 and bf16 by sum, max and
//! min, exact on small-integer data at any world size (every partial sum is representable),
//! eagerly and over a graph's replays with new data before each; the fused residual add and
//! RMSNorm against its unfused sequence. Where the backend lacks them: `Unsupported`.

use unicomm_core::graph::Graph;
use unicomm_core::symmetric::SymmetricAlgorithm;
use unicomm_core::{bf16, each_rank, f16, Collective, Comm, DeviceStream, Element, Error};
use unicomm_core::{ReduceOp, Result};

/// The algorithms, in the order the suite runs them.
pub const ALGORITHMS: [SymmetricAlgorithm; 3] = [
    SymmetricAlgorithm::OneShot,
    SymmetricAlgorithm::TwoShot,
    SymmetricAlgorithm::Lamport,
];

/// An element the kernels reduce, from and to the small integers the suite uses.
pub trait Small: Element {
    /// `x` as the element.
    fn of(x: i32) -> Self;
    /// The element as f64.
    fn f64(self) -> f64;
}

impl Small for f32 {
    fn of(x: i32) -> Self {
        x as f32
    }
    fn f64(self) -> f64 {
        f64::from(self)
    }
}
impl Small for f16 {
    fn of(x: i32) -> Self {
        f16::from_f32(x as f32)
    }
    fn f64(self) -> f64 {
        self.to_f64()
    }
}
impl Small for bf16 {
    fn of(x: i32) -> Self {
        bf16::from_f32(x as f32)
    }
    fn f64(self) -> f64 {
        self.to_f64()
    }
}

/// Rank `r`'s input of round `k`: small integers, some negative (Lamport sends a negative
/// zero as a positive one: zeros of both signs appear).
fn input(r: usize, k: usize, n: usize) -> Vec<i32> {
    (0..n)
        .map(|i| ((r * 7 + i * 3 + k * 5) % 17) as i32 - 8)
        .collect()
}

/// What every rank's result must be.
fn expected(w: usize, k: usize, n: usize, op: ReduceOp) -> Vec<i32> {
    (0..n)
        .map(|i| {
            let all = (0..w).map(|r| input(r, k, n)[i]);
            match op {
                ReduceOp::Max => all.max().unwrap_or(0),
                ReduceOp::Min => all.min().unwrap_or(0),
                _ => all.sum(),
            }
        })
        .collect()
}

/// Every algorithm x reduction over `T`, `n` elements: eagerly for two rounds, then
/// captured in a graph and replayed `replays` times with new data before each. What each
/// rank saw: `true`, or `false` where the backend has no symmetric memory (`Unsupported`).
pub fn symmetric_all_reduce<T: Small, C: Collective>(
    comms: &[Comm<C>],
    n: usize,
    replays: usize,
) -> Result<Vec<bool>> {
    each_rank(comms, |c| -> Result<bool> {
        let (r, w) = (c.rank(), c.world_size());
        let st = c.create_stream()?;
        let sym = match c.alloc_symmetric_lamport::<T>(n) {
            Err(Error::Unsupported { .. }) => return Ok(false),
            other => other?,
        };
        let mut out = c.alloc::<T>(n)?;
        let mut round = 0;
        for algorithm in ALGORITHMS {
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
                for _ in 0..2 {
                    sym.write_from_host(&of::<T>(&input(r, round, n)), &st)?;
                    c.all_reduce_symmetric(&sym, n, &mut out, (op, algorithm), &st)?;
                    check(
                        &out.copy_to_host(&st)?,
                        &expected(w, round, n, op),
                        (algorithm, op, round),
                    )?;
                    round += 1;
                }
            }
            let graph = Graph::capture(&st, |g| {
                g.all_reduce_symmetric(c, &sym, n, &out, (ReduceOp::Sum, algorithm))
            })?;
            for _ in 0..replays {
                sym.write_from_host(&of::<T>(&input(r, round, n)), &st)?;
                graph.launch(&st)?;
                let got = out.copy_to_host(&st)?;
                check(
                    &got,
                    &expected(w, round, n, ReduceOp::Sum),
                    (algorithm, ReduceOp::Sum, round),
                )?;
                round += 1;
            }
        }
        st.synchronize()?;
        Ok(true)
    })
}

fn of<T: Small>(xs: &[i32]) -> Vec<T> {
    xs.iter().map(|&x| T::of(x)).collect()
}

fn check<T: Small>(
    got: &[T],
    want: &[i32],
    (algorithm, op, round): (SymmetricAlgorithm, ReduceOp, usize),
) -> Result<()> {
    match got
        .iter()
        .zip(want)
        .position(|(g, &w)| g.f64() != f64::from(w))
    {
        None if got.len() == want.len() => Ok(()),
        at => Err(Error::invalid(
            "symmetric all-reduce",
            format!(
                "{} {op:?} of {} round {round}: element {at:?} is {:?}, {:?} was due",
                algorithm.name(),
                T::DTYPE,
                at.map(|i| got[i].f64()),
                at.map(|i| want[i])
            ),
        )),
    }
}
