//! Symmetric calls that disagree across ranks, the same on every backend: one rank's call
//! differs in count, reduction, algorithm, element type (of equal bytes), the fused norm's
//! row width or epsilon, fusion itself, or is a barrier; every rank must get `Mismatch`
//! naming the field, never `Ok` with another call's data. Where the ranks' counters stay in
//! step (both calls wait on the same words: the barrier kernels among themselves, Lamport
//! with Lamport) an agreeing call after it must be exact; where they cannot (a Lamport call
//! against a barrier kernel) the communicator ends, so each attempt runs on a child of its
//! own. And Lamport calls of count 0 among others keep the rounds in step.

use unicomm_core::symmetric::{RmsNormOptions, SymmetricAlgorithm, SymmetricOptions};
use unicomm_core::{
    bf16, Buffer, Collective, Comm, DeviceStream, Error, ReduceOp, Result, Symmetric,
};

use crate::symmetric::ALGORITHMS;

/// How one rank's call differs from the others'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disagreement {
    /// One element fewer.
    Count,
    /// Max instead of the others' sum.
    Op,
    /// This algorithm instead of the others'.
    Algorithm(SymmetricAlgorithm),
    /// bf16 of twice the count (the same bytes) instead of f32.
    Dtype,
    /// The fused norm with rows of half the width.
    Hidden,
    /// The fused norm with ten times the epsilon.
    Eps,
    /// The plain all-reduce where the others fuse the norm.
    Norm,
    /// A barrier where the others all-reduce.
    Barrier,
}

impl Disagreement {
    /// Every disagreement with calls of `algorithm` (the element type only where the
    /// allocation is untyped: a Lamport workspace's type is compared when it is made).
    pub fn all(algorithm: SymmetricAlgorithm) -> Vec<Disagreement> {
        let mut v = vec![Disagreement::Count, Disagreement::Op];
        v.extend(
            ALGORITHMS
                .into_iter()
                .filter(|&a| a != algorithm)
                .map(Disagreement::Algorithm),
        );
        if algorithm != SymmetricAlgorithm::Lamport {
            v.push(Disagreement::Dtype);
        }
        v.extend([
            Disagreement::Hidden,
            Disagreement::Eps,
            Disagreement::Norm,
            Disagreement::Barrier,
        ]);
        v
    }

    /// The field the `Mismatch` names.
    pub fn what(self) -> &'static str {
        match self {
            Disagreement::Count => "count",
            Disagreement::Op => "op",
            Disagreement::Algorithm(_) | Disagreement::Barrier => "algorithm",
            Disagreement::Dtype => "dtype",
            Disagreement::Hidden => "hidden",
            Disagreement::Eps => "eps",
            Disagreement::Norm => "norm",
        }
    }

    /// Whether the ranks' counters leave the call out of step (a Lamport call against a
    /// barrier kernel): the communicator ends.
    pub fn ends_the_communicator(self, algorithm: SymmetricAlgorithm) -> bool {
        let lamport = |a: SymmetricAlgorithm| a == SymmetricAlgorithm::Lamport;
        match self {
            Disagreement::Algorithm(a) => lamport(a) != lamport(algorithm),
            Disagreement::Barrier => lamport(algorithm),
            _ => false,
        }
    }
}

/// Elements per rank, rows of [`HIDDEN`].
const N: usize = 16;
const HIDDEN: usize = 8;

/// One rank's buffers of a disagreement's attempt.
struct Bufs<'c, C: Collective> {
    sym: Symmetric<'c, f32, C>,
    out: Buffer<f32, C>,
    residual: Buffer<f32, C>,
    weight: Buffer<f32, C>,
}

/// The calls of rank `r` in disagreement `d` of `algorithm` (rank `odd` differs).
fn call<C: Collective>(
    c: &Comm<C>,
    b: &mut Bufs<'_, C>,
    (d, algorithm): (Disagreement, SymmetricAlgorithm),
    odd: bool,
    st: &C::Stream,
) -> Result<()> {
    let (mut alg, mut count, mut op) = (algorithm, N, ReduceOp::Sum);
    let (mut fused, mut hidden, mut eps) = (false, HIDDEN, 1e-5f32);
    if matches!(
        d,
        Disagreement::Hidden | Disagreement::Eps | Disagreement::Norm
    ) {
        fused = true;
    }
    if odd {
        match d {
            Disagreement::Count => count -= 1,
            Disagreement::Op => op = ReduceOp::Max,
            Disagreement::Algorithm(a) => alg = a,
            Disagreement::Hidden => hidden /= 2,
            Disagreement::Eps => eps *= 10.0,
            Disagreement::Norm => fused = false,
            Disagreement::Barrier => return c.symmetric_barrier(&b.sym, st),
            Disagreement::Dtype => return Err(Error::invalid("dtype", "its own attempt")),
        }
    }
    if !fused {
        return c.all_reduce_symmetric(
            &b.sym,
            count,
            &mut b.out,
            SymmetricOptions::new(op, alg),
            st,
        );
    }
    let weight = b.weight.slice(0..hidden)?;
    c.all_reduce_rms_norm(
        &b.sym,
        count,
        &mut b.residual,
        &weight,
        &mut b.out,
        RmsNormOptions::new(eps, alg),
        st,
    )
}

/// One rank's outcome of an attempt: the `Mismatch` it got, checked to name `d`'s field.
fn outcome(r: usize, d: Disagreement, got: Result<()>) -> Result<String> {
    match got {
        Err(e @ Error::Mismatch { what, .. }) if what == d.what() => Ok(e.to_string()),
        Err(e) => Err(Error::invalid(
            "disagreement",
            format!("{d:?} on rank {r}: {e}"),
        )),
        Ok(()) => Err(Error::invalid(
            "disagreement",
            format!("{d:?} on rank {r}: Ok, where every rank must get Mismatch"),
        )),
    }
}

/// `attempts` calls of `algorithm` in which one rank (the next each time) disagrees by `d`,
/// each followed, where the counters stay in step, by an agreeing all-reduce checked exact;
/// where they cannot, each attempt runs on a child communicator of its own. What each rank
/// saw: the first attempt's `Mismatch`, as it reads (`None` where the backend has no
/// symmetric memory); an error for anything else.
pub fn symmetric_disagreement<C: Collective>(
    c: &Comm<C>,
    d: Disagreement,
    algorithm: SymmetricAlgorithm,
    attempts: usize,
) -> Result<Option<String>> {
    let mut first = None;
    let ends = d.ends_the_communicator(algorithm);
    for k in 0..attempts {
        let odd = k % c.world_size() == c.rank();
        let seen = if ends {
            let child = c.split(Some(0), c.rank() as i32)?;
            let child = child.ok_or_else(|| Error::invalid("split", "no child"))?;
            let seen = attempt(&child, (d, algorithm), odd, false);
            drop(child);
            seen?
        } else {
            attempt(c, (d, algorithm), odd, true)?
        };
        match seen {
            None => return Ok(None),
            Some(s) => {
                first.get_or_insert(s);
            }
        }
    }
    Ok(first)
}

/// One attempt of disagreement `d` in `algorithm` (rank 0 differs) on a child of `c` made
/// for it, for a backend where every `Mismatch` of a kernel ends the communicator (NCCL's:
/// a kernel's fault is reported as NCCL's asynchronous errors are). Each rank's
/// `Mismatch`, as it reads (`None` without symmetric memory).
pub fn symmetric_disagreement_ending<C: Collective>(
    c: &Comm<C>,
    d: Disagreement,
    algorithm: SymmetricAlgorithm,
) -> Result<Option<String>> {
    let child = c.split(Some(0), c.rank() as i32)?;
    let child = child.ok_or_else(|| Error::invalid("split", "no child"))?;
    let seen = attempt(&child, (d, algorithm), c.rank() == 0, false);
    drop(child);
    seen
}

/// One attempt on `c`: the disagreeing call, then (`after`) an agreeing one, exact.
fn attempt<C: Collective>(
    c: &Comm<C>,
    (d, algorithm): (Disagreement, SymmetricAlgorithm),
    odd: bool,
    after: bool,
) -> Result<Option<String>> {
    if d == Disagreement::Dtype {
        return dtype_attempt(c, algorithm, odd, after);
    }
    let (r, w) = (c.rank(), c.world_size());
    let st = c.create_stream()?;
    let sym = match c.alloc_symmetric_lamport::<f32>(N) {
        Err(Error::Unsupported { .. }) => return Ok(None),
        other => other?,
    };
    // Where the mismatch ends the communicator, a slower rank may meet it in any call
    // after the allocation: each is part of the outcome.
    let mut made = None;
    let got = (|| {
        let b = made.insert(Bufs {
            out: c.alloc::<f32>(N)?,
            residual: c.upload(&[0.0f32; N], &st)?,
            weight: c.upload(&[1.0f32; HIDDEN], &st)?,
            sym,
        });
        b.sym.write_from_host(&[(r + 1) as f32; N], &st)?;
        call(c, b, (d, algorithm), odd, &st)?;
        st.synchronize()
    })();
    let seen = outcome(r, d, got)?;
    // Where the mismatch ends the communicator (no agreeing call after it), a slower rank
    // may have met it before its buffers were made.
    if after {
        let b = made
            .as_mut()
            .ok_or_else(|| Error::invalid("disagreement", "no buffers"))?;
        b.sym.write_from_host(&[(r + 1) as f32; N], &st)?;
        c.all_reduce_symmetric(
            &b.sym,
            N,
            &mut b.out,
            SymmetricOptions::new(ReduceOp::Sum, algorithm),
            &st,
        )?;
        let got = b.out.copy_to_host(&st)?;
        let want = (w * (w + 1) / 2) as f32;
        if got.iter().any(|&x| x != want) {
            return Err(Error::invalid(
                "disagreement",
                format!(
                    "{d:?} on rank {r}: the agreeing call after it gave {got:?}, {want} was due"
                ),
            ));
        }
    }
    Ok(Some(seen))
}

/// The type disagreement: the odd rank all-reduces bf16 x 2N on its allocation, the others
/// f32 x N on theirs (the same bytes, so the allocation agrees); then (`after`) a barrier
/// on every rank, which passes only where the counters stayed in step.
fn dtype_attempt<C: Collective>(
    c: &Comm<C>,
    algorithm: SymmetricAlgorithm,
    odd: bool,
    after: bool,
) -> Result<Option<String>> {
    let (r, d) = (c.rank(), Disagreement::Dtype);
    let st = c.create_stream()?;
    let how = SymmetricOptions::new(ReduceOp::Sum, algorithm);
    let (got, barrier) = if odd {
        let x = match c.alloc_symmetric::<bf16>(2 * N) {
            Err(Error::Unsupported { .. }) => return Ok(None),
            other => other?,
        };
        let got = (|| {
            let mut out = c.alloc::<bf16>(2 * N)?;
            x.write_from_host(&[bf16::ONE; 2 * N], &st)?;
            c.all_reduce_symmetric(&x, 2 * N, &mut out, how, &st)?;
            st.synchronize()
        })();
        (got, after.then(|| c.symmetric_barrier(&x, &st)))
    } else {
        let x = match c.alloc_symmetric::<f32>(N) {
            Err(Error::Unsupported { .. }) => return Ok(None),
            other => other?,
        };
        let got = (|| {
            let mut out = c.alloc::<f32>(N)?;
            x.write_from_host(&[1.0f32; N], &st)?;
            c.all_reduce_symmetric(&x, N, &mut out, how, &st)?;
            st.synchronize()
        })();
        (got, after.then(|| c.symmetric_barrier(&x, &st)))
    };
    let seen = outcome(r, d, got)?;
    if let Some(b) = barrier {
        b.and_then(|()| st.synchronize()).map_err(|e| {
            Error::invalid(
                "disagreement",
                format!("{d:?} on rank {r}: the barrier after it: {e}"),
            )
        })?;
    }
    Ok(Some(seen))
}

/// `runs` fresh Lamport allocations, each given calls of counts 5, 0, 0, 5, 0, 0, 5 with
/// new data before each: every count-5 call exact (a call of count 0 keeps the rounds in
/// step: it exchanges its headers as any other). `false` where the backend has no
/// symmetric memory.
pub fn lamport_count_zero_sequence<C: Collective>(c: &Comm<C>, runs: usize) -> Result<bool> {
    let (r, w) = (c.rank(), c.world_size());
    let st = c.create_stream()?;
    let mut out = c.alloc::<f32>(5)?;
    for run in 0..runs {
        let sym = match c.alloc_symmetric_lamport::<f32>(5) {
            Err(Error::Unsupported { .. }) => return Ok(false),
            other => other?,
        };
        for (k, count) in [5, 0, 0, 5, 0, 0, 5].into_iter().enumerate() {
            let mine = (r * 10 + k + run) as f32;
            sym.write_from_host(&[mine; 5], &st)?;
            let how = SymmetricOptions::new(ReduceOp::Sum, SymmetricAlgorithm::Lamport);
            c.all_reduce_symmetric(&sym, count, &mut out, how, &st)?;
            st.synchronize()?;
            if count == 0 {
                continue;
            }
            let want = (0..w).map(|q| (q * 10 + k + run) as f32).sum::<f32>();
            let got = out.copy_to_host(&st)?;
            if got != [want; 5] {
                return Err(Error::invalid(
                    "lamport",
                    format!("run {run} call {k} on rank {r}: {got:?}, {want} was due"),
                ));
            }
        }
    }
    Ok(true)
}
