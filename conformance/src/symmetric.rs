//! unicomm's symmetric kernels, the same on every backend that has them: the all-reduce of
//! each algorithm (one shot, two shots, Lamport) over f32, f16 and bf16 by sum, max and
//! min, exact on small-integer data at any world size (every partial sum is representable),
//! eagerly and over a graph's replays with new data before each; the fused residual add and
//! RMSNorm against its unfused sequence. Where the backend lacks them: `Unsupported`.

use unicomm_core::graph::Graph;
use unicomm_core::symmetric::{RmsNormOptions, SymmetricAlgorithm, SymmetricOptions};
use unicomm_core::{bf16, each_rank, f16, Collective, Comm, DeviceStream, Element, Error};
use unicomm_core::{Fp8Buffers, F8E4M3};
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
    /// An f32 result rounded to the element, as f64 (what a kernel writes).
    fn from_f64_rounded(x: f64) -> f64;
}

impl Small for f32 {
    fn of(x: i32) -> Self {
        x as f32
    }
    fn f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64_rounded(x: f64) -> f64 {
        f64::from(x as f32)
    }
}
/// The 16-bit floats, through `half`'s conversions.
macro_rules! small_half {
    ($($t:ty),*) => {$(
        impl Small for $t {
            fn of(x: i32) -> Self {
                <$t>::from_f32(x as f32)
            }
            fn f64(self) -> f64 {
                self.to_f64()
            }
            fn from_f64_rounded(x: f64) -> f64 {
                <$t>::from_f64(x).to_f64()
            }
        }
    )*};
}
small_half!(f16, bf16);

/// Rank `r`'s input of round `k`: small integers, some negative (Lamport sends a negative
/// zero as a positive one: zeros of both signs appear).
fn input(r: usize, k: usize, n: usize) -> Vec<i32> {
    (0..n)
        .map(|i| ((r * 7 + i * 3 + k * 5) % 17) as i32 - 8)
        .collect()
}

/// What every rank's result must be: each rank's input made once (made per element, this
/// was n^2 work, about 20 ms a round at 4,099 elements: the GPU tests' 10,000 replays did
/// not finish in 170 s).
fn expected(w: usize, k: usize, n: usize, op: ReduceOp) -> Vec<i32> {
    let inputs: Vec<Vec<i32>> = (0..w).map(|r| input(r, k, n)).collect();
    (0..n)
        .map(|i| {
            let all = inputs.iter().map(|x| x[i]);
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
                    c.all_reduce_symmetric(
                        &sym,
                        n,
                        &mut out,
                        SymmetricOptions::new(op, algorithm),
                        &st,
                    )?;
                    check(
                        &out.copy_to_host(&st)?,
                        &expected(w, round, n, op),
                        (algorithm, op, round),
                    )?;
                    round += 1;
                }
            }
            let graph = Graph::capture(&st, |g| {
                g.all_reduce_symmetric(
                    c,
                    &sym,
                    n,
                    &out,
                    SymmetricOptions::new(ReduceOp::Sum, algorithm),
                )
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

/// The fused all-reduce + residual add + RMSNorm of each algorithm over `T`, `rows` rows of
/// `hidden`: eagerly once, then captured in a graph and replayed `replays` times with a new
/// input and the residual written again before each, against the host's unfused sequence on
/// the same small-integer data (the all-reduce and the add exact, the norm in f32 as the
/// kernel's contract says): the residual exactly, the output within `tolerance` relative (0:
/// the same bits, what the mock gives; a GPU's reduction order may differ in the last bits).
/// What each rank saw: `true`, or `false` where the backend has no symmetric memory.
pub fn symmetric_rms_norm<T: Small, C: Collective>(
    comms: &[Comm<C>],
    hidden: usize,
    rows: usize,
    tolerance: f64,
    replays: usize,
) -> Result<Vec<bool>> {
    let n = hidden * rows;
    each_rank(comms, |c| -> Result<bool> {
        let (r, w) = (c.rank(), c.world_size());
        let st = c.create_stream()?;
        let sym = match c.alloc_symmetric_lamport::<T>(n) {
            Err(Error::Unsupported { .. }) => return Ok(false),
            other => other?,
        };
        let weight: Vec<i32> = (0..hidden).map(|i| (i % 5) as i32 - 2).collect();
        let wbuf = c.upload(&of::<T>(&weight), &st)?;
        let res0: Vec<i32> = (0..n).map(|i| (i % 7) as i32 - 3).collect();
        let res0_t = of::<T>(&res0);
        let fused = Fused {
            weight: weight.iter().map(|&v| v as f32).collect(),
            res0: &res0,
            tolerance,
            w,
        };
        let scale = c.upload(&[FP8_SCALE], &st)?;
        let mut round = 0;
        for algorithm in ALGORITHMS {
            let how = RmsNormOptions::new(1e-5, algorithm);
            let mut residual = c.upload(&res0_t, &st)?;
            let mut out = c.alloc::<T>(n)?;
            sym.write_from_host(&of::<T>(&input(r, round, n)), &st)?;
            c.all_reduce_rms_norm(&sym, n, &mut residual, &wbuf, &mut out, how, &st)?;
            fused.check(&residual, &out, (algorithm, round), &st)?;
            round += 1;
            // The same with the result also as FP8: eagerly, then over a graph's replays.
            let mut q = c.alloc::<F8E4M3>(n)?;
            sym.write_from_host(&of::<T>(&input(r, round, n)), &st)?;
            residual.write_from_host(&res0_t, &st)?;
            let fp8 = Fp8Buffers {
                out: &mut q,
                scale: &scale,
            };
            c.all_reduce_rms_norm_fp8(&sym, n, &mut residual, &wbuf, &mut out, fp8, how, &st)?;
            fused.check(&residual, &out, (algorithm, round), &st)?;
            check_fp8(&out, &q, FP8_SCALE, &st)?;
            round += 1;
            let graph = Graph::capture(&st, |g| {
                let fp8 = Fp8Buffers {
                    out: &q,
                    scale: &scale,
                };
                g.all_reduce_rms_norm_fp8(c, &sym, n, &residual, &wbuf, &out, fp8, how)
            })?;
            for _ in 0..replays {
                sym.write_from_host(&of::<T>(&input(r, round, n)), &st)?;
                residual.write_from_host(&res0_t, &st)?;
                graph.launch(&st)?;
                fused.check(&residual, &out, (algorithm, round), &st)?;
                check_fp8(&out, &q, FP8_SCALE, &st)?;
                round += 1;
            }
        }
        st.synchronize()?;
        Ok(true)
    })
}

/// The FP8 output's scale in the suite: large enough that some of the normalized results
/// saturate at e4m3's ±448.
const FP8_SCALE: f32 = 150.0;

/// The fused step's FP8 output against its contract on what the step wrote to `out`:
/// `e4m3(out[i] * scale)`, saturated to ±448, rounded to nearest even; exact.
fn check_fp8<T: Small, C: Collective>(
    out: &unicomm_core::Buffer<T, C>,
    q: &unicomm_core::Buffer<F8E4M3, C>,
    scale: f32,
    st: &C::Stream,
) -> Result<()> {
    let (out, q) = (out.copy_to_host(st)?, q.copy_to_host(st)?);
    for (i, (o, got)) in out.iter().zip(&q).enumerate() {
        let x = o.f64() as f32 * scale;
        let want = F8E4M3::from_f32(x.clamp(-448.0, 448.0));
        if got.to_bits() != want.to_bits() {
            return Err(Error::invalid(
                "symmetric rms norm fp8",
                format!(
                    "element {i}: {got} (0x{:02x}) where e4m3({x}) is {want}",
                    got.to_bits()
                ),
            ));
        }
    }
    Ok(())
}

/// What a fused step's results must be, for one rank of `w`.
struct Fused<'r> {
    weight: Vec<f32>,
    res0: &'r [i32],
    tolerance: f64,
    w: usize,
}

impl Fused<'_> {
    /// The residual (exact) and the output (the unfused norm within the tolerance) of the
    /// step of `round`.
    fn check<T: Small, C: Collective>(
        &self,
        residual: &unicomm_core::Buffer<T, C>,
        out: &unicomm_core::Buffer<T, C>,
        (algorithm, round): (SymmetricAlgorithm, usize),
        st: &C::Stream,
    ) -> Result<()> {
        let hidden = self.weight.len();
        let sums = expected(self.w, round, self.res0.len(), ReduceOp::Sum);
        let added: Vec<i32> = sums.iter().zip(self.res0).map(|(s, r)| s + r).collect();
        check(
            &residual.copy_to_host(st)?,
            &added,
            (algorithm, ReduceOp::Sum, round),
        )?;
        let got = out.copy_to_host(st)?;
        let xs: Vec<f32> = added.iter().map(|&v| v as f32).collect();
        let want = rms_norm_reference(&xs, &self.weight, 1e-5);
        for (i, (gv, wv)) in got.iter().zip(&want).enumerate() {
            let want = T::from_f64_rounded(f64::from(*wv));
            let err = (gv.f64() - want).abs();
            if err > self.tolerance * want.abs().max(1e-3) && gv.f64() != want {
                return Err(Error::invalid(
                    "symmetric rms norm",
                    format!(
                        "{} round {round} row {} element {}: {} where the unfused sequence gives {want}",
                        algorithm.name(),
                        i / hidden,
                        i % hidden,
                        gv.f64()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The RMSNorm of the fused step's contract, on the host: for each row of `weight.len()`
/// elements of `xs` (the summed residual), `x * (1 / sqrt(mean(x^2) + eps)) * weight` in f32,
/// the squares summed in order. What the unfused sequence's norm computes.
pub fn rms_norm_reference(xs: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(xs.len());
    for row in xs.chunks(weight.len()) {
        let ss: f32 = row.iter().map(|x| x * x).sum();
        let scale = 1.0 / (ss / row.len() as f32 + eps).sqrt();
        out.extend(row.iter().zip(weight).map(|(x, w)| x * scale * w));
    }
    out
}

/// unicomm's kernel written against a library's device API (`Comm::all_reduce_device`) on
/// windows, over `T`, `n` elements, by sum, max and min: eagerly for two rounds each, then
/// captured in a graph and replayed `replays` times with new data before each, exact; the
/// device communicator made with `reqs`. What each rank saw: `true`, or `false` where the
/// backend or its library has no device API (`Unsupported`).
pub fn device_api_all_reduce<T: Small, C: Collective>(
    comms: &[Comm<C>],
    n: usize,
    replays: usize,
    reqs: &unicomm_core::DeviceCommRequirements,
) -> Result<Vec<bool>> {
    each_rank(comms, |c| -> Result<bool> {
        let (r, w) = (c.rank(), c.world_size());
        let st = c.create_stream()?;
        let dc = match c.device_comm(reqs) {
            Err(Error::Unsupported { .. }) => return Ok(false),
            other => other?,
        };
        let send = c.register_window(c.alloc::<T>(n)?)?;
        let mut recv = c.register_window(c.alloc::<T>(n)?)?;
        let mut round = 0;
        let algorithm = SymmetricAlgorithm::OneShot; // as the kernel's messages name it
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            for _ in 0..2 {
                send.write_from_host(&of::<T>(&input(r, round, n)), &st)?;
                c.all_reduce_device(&dc, &send, &mut recv, n, op, &st)?;
                let want = expected(w, round, n, op);
                check(&recv.copy_to_host(&st)?, &want, (algorithm, op, round))?;
                round += 1;
            }
        }
        let graph = Graph::capture(&st, |g| {
            g.all_reduce_device(c, &dc, &send, &recv, n, ReduceOp::Sum)
        })?;
        for _ in 0..replays {
            send.write_from_host(&of::<T>(&input(r, round, n)), &st)?;
            graph.launch(&st)?;
            let want = expected(w, round, n, ReduceOp::Sum);
            check(
                &recv.copy_to_host(&st)?,
                &want,
                (algorithm, ReduceOp::Sum, round),
            )?;
            round += 1;
        }
        st.synchronize()?;
        drop(graph);
        Ok(true)
    })
}
