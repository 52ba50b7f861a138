//! The suite's collectives with per-rank layouts and scalars: gather and scatter, the
//! variable-size exchanges (all-to-all-v on the library's path and, where the backend has
//! it, into a window on the copy-engine path), and scaled sums; each output checked exactly
//! against values computed here.

use unicomm_core::{packed_displs, Collective, Comm, Counts, Error, ReduceOp};

use super::exact::{same, upload, Out};
use super::reference::Sample;
use super::Failure;

/// Small exact values: `v(k)` is an integer in -4..=4 (exact in every element type).
fn v<T: Sample>(k: usize) -> T {
    T::from_i64((k % 9) as i64 - 4)
}

pub(super) fn gather_scatter<T: Sample, C: Collective>(c: &Comm<C>) -> Out {
    let (r, w, n) = (c.rank(), c.world_size(), 5);
    let root = w - 1;
    let st = c.create_stream()?;
    let send = upload(
        c,
        &(0..n).map(|i| v::<T>(r * 3 + i)).collect::<Vec<_>>(),
        &st,
    )?;
    let mut recv = c.alloc::<T>(if r == root { n * w } else { 1 })?;
    c.gather(&send, &mut recv, root, &st)?;
    if r == root {
        let want: Vec<T> = (0..w * n).map(|i| v(i / n * 3 + i % n)).collect();
        same(&recv.copy_to_host(&st)?, &want, "gather at the root")?;
    }
    let all: Vec<T> = (0..w * n).map(|i| v(i * 5 + 1)).collect();
    let src = upload(c, if r == root { &all[..] } else { &all[..0] }, &st)?;
    let mut out = c.alloc::<T>(n)?;
    c.scatter(&src, &mut out, root, &st)?;
    same(&out.copy_to_host(&st)?, &all[r * n..(r + 1) * n], "scatter")
}

/// The counts rank `from` sends rank `to` (zero for some pairs, skewed as MoE routing is).
fn a2a_count(from: usize, to: usize) -> usize {
    (from + 2 * to) % 4
}

pub(super) fn all_to_all_v<T: Sample, C: Collective>(c: &Comm<C>) -> Out {
    let (r, w) = (c.rank(), c.world_size());
    let sc: Vec<usize> = (0..w).map(|p| a2a_count(r, p)).collect();
    let rc: Vec<usize> = (0..w).map(|p| a2a_count(p, r)).collect();
    let (sd, rd) = (packed_displs(&sc)?, packed_displs(&rc)?);
    // Rank `from`'s element `i` for `to`.
    let val = |from: usize, to: usize, i: usize| v::<T>(from * 5 + to * 3 + i);
    let send: Vec<T> = (0..w)
        .flat_map(|p| (0..sc[p]).map(move |i| val(r, p, i)))
        .collect();
    let st = c.create_stream()?;
    let sb = upload(c, &send, &st)?;
    let total: usize = rc.iter().sum();
    // One element more than needed, which must stay as it was.
    let mut rb = upload(c, &vec![T::from_i64(7); total + 1], &st)?;
    let (scs, rcs) = (
        Counts {
            counts: &sc,
            displs: &sd,
        },
        Counts {
            counts: &rc,
            displs: &rd,
        },
    );
    c.all_to_all_v(&sb, scs, &mut rb, rcs, &st)?;
    let mut want: Vec<T> = (0..w)
        .flat_map(|p| (0..rc[p]).map(move |i| val(p, r, i)))
        .collect();
    want.push(T::from_i64(7));
    same(&rb.copy_to_host(&st)?, &want, "all_to_all_v")
}

/// Receive layouts whose ranges share elements (MPI forbids a receive location written
/// twice; the grouped receives of a GPU race there) are `InvalidArgument` naming both ranks,
/// on every rank and before anything is enqueued: the receive buffer keeps its values.
/// Overlapping send ranges stay allowed. Needs two ranks (one range cannot overlap).
pub(super) fn overlapping_receives<C: Collective>(c: &Comm<C>) -> Out {
    let (r, w) = (c.rank(), c.world_size());
    if w < 2 {
        return Ok(());
    }
    let st = c.create_stream()?;
    // Two elements per peer; rank 1's range starts inside rank 0's.
    let counts = vec![2usize; w];
    let mut displs: Vec<usize> = (0..w).map(|p| 2 * p).collect();
    displs[1] = 1;
    let bad = Counts {
        counts: &counts,
        displs: &displs,
    };
    let packed = packed_displs(&counts)?;
    let fine = Counts {
        counts: &counts,
        displs: &packed,
    };
    let sb = upload(c, &vec![r as i32; 2 * w], &st)?;
    let mut rb = upload(c, &vec![-1i32; 2 * w], &st)?;
    let refused = |what: &str, e: unicomm_core::Result<()>| -> Out {
        match e {
            Err(Error::InvalidArgument { reason, .. })
                if reason.contains("rank 0") && reason.contains("rank 1") =>
            {
                Ok(())
            }
            other => Err(super::Failure::msg(format!(
                "rank {r}, {what} with overlapping receive ranges: {other:?}, not InvalidArgument naming ranks 0 and 1"
            ))),
        }
    };
    refused("all_to_all_v", c.all_to_all_v(&sb, fine, &mut rb, bad, &st))?;
    let own = upload(c, &[r as i32; 2], &st)?;
    refused("all_gather_v", c.all_gather_v(&own, &mut rb, bad, &st))?;
    same(
        &rb.copy_to_host(&st)?,
        &vec![-1; 2 * w],
        "a refused receive's buffer",
    )?;
    // The same send ranges overlapping are allowed: every peer gets rank r's first two.
    let zeros = vec![0usize; w];
    let shared = Counts {
        counts: &counts,
        displs: &zeros,
    };
    c.all_to_all_v(&sb, shared, &mut rb, fine, &st)?;
    let want: Vec<i32> = (0..w).flat_map(|p| [p as i32; 2]).collect();
    same(
        &rb.copy_to_host(&st)?,
        &want,
        "all_to_all_v from overlapping send ranges",
    )
}

pub(super) fn all_gather_v<T: Sample, C: Collective>(c: &Comm<C>) -> Out {
    let (r, w) = (c.rank(), c.world_size());
    let counts: Vec<usize> = (0..w).map(|p| (p * 2 + 1) % 4).collect();
    let displs = packed_displs(&counts)?;
    let st = c.create_stream()?;
    let send = upload(
        c,
        &(0..counts[r])
            .map(|i| v::<T>(r * 7 + i))
            .collect::<Vec<_>>(),
        &st,
    )?;
    let total = counts.iter().sum();
    let mut recv = c.alloc::<T>(total)?;
    let layout = Counts {
        counts: &counts,
        displs: &displs,
    };
    c.all_gather_v(&send, &mut recv, layout, &st)?;
    let want: Vec<T> = (0..w)
        .flat_map(|p| (0..counts[p]).map(move |i| v(p * 7 + i)))
        .collect();
    same(&recv.copy_to_host(&st)?, &want, "all_gather_v")
}

pub(super) fn reduce_scatter_v<T: Sample, C: Collective>(c: &Comm<C>) -> Out {
    let (r, w) = (c.rank(), c.world_size());
    let counts: Vec<usize> = (0..w).map(|p| (p + 2) % 3).collect();
    let displs = packed_displs(&counts)?;
    let total: usize = counts.iter().sum();
    let st = c.create_stream()?;
    let send = upload(
        c,
        &(0..total).map(|i| v::<T>(r + i)).collect::<Vec<_>>(),
        &st,
    )?;
    let mut recv = c.alloc::<T>(counts[r])?;
    let layout = Counts {
        counts: &counts,
        displs: &displs,
    };
    c.reduce_scatter_v(&send, layout, &mut recv, ReduceOp::Sum, &st)?;
    let want: Vec<T> = (0..counts[r])
        .map(|i| {
            T::from_i64(
                (0..w)
                    .map(|p| v::<T>(p + displs[r] + i).to_f64() as i64)
                    .sum(),
            )
        })
        .collect();
    same(&recv.copy_to_host(&st)?, &want, "reduce_scatter_v")
}

/// Each rank's input scaled by its own scalar, then summed (`ncclRedOpCreatePreMulSum`):
/// all-reduce, reduce to the last rank and reduce-scatter. Scalars are 1 and -1 (2 for
/// the wide types) and inputs in -1..=1, so every partial sum is exact in every type.
pub(super) fn scaled_sums<T: Sample, C: Collective>(c: &Comm<C>) -> Out {
    let (r, w, n) = (c.rank(), c.world_size(), 4);
    let scale = |p: usize| -> i64 {
        match (p % 2, T::NARROW) {
            (0, _) => 1,
            (_, true) => -1,
            _ => 2,
        }
    };
    let x = |p: usize, i: usize| ((p + i) % 3) as i64 - 1;
    let op = ReduceOp::pre_mul_sum(T::from_i64(scale(r)));
    let st = c.create_stream()?;
    let input: Vec<T> = (0..n * w).map(|i| T::from_i64(x(r, i))).collect();
    let reduced = |i: usize| T::from_i64((0..w).map(|p| scale(p) * x(p, i)).sum());
    let send = upload(c, &input[..n], &st)?;
    let mut out = c.alloc::<T>(n)?;
    c.all_reduce(&send, &mut out, op, &st)?;
    let want: Vec<T> = (0..n).map(reduced).collect();
    same(&out.copy_to_host(&st)?, &want, "all_reduce")?;
    c.reduce(&send, &mut out, op, w - 1, &st)?;
    if r == w - 1 {
        same(&out.copy_to_host(&st)?, &want, "reduce")?;
    }
    let whole = upload(c, &input, &st)?;
    c.reduce_scatter(&whole, &mut out, op, &st)?;
    let want: Vec<T> = (r * n..(r + 1) * n).map(reduced).collect();
    same(&out.copy_to_host(&st)?, &want, "reduce_scatter")
}

/// All-to-all-v into a symmetric window with the copy-engine path on, receive displacements
/// in reverse peer order with gaps (a copy placed by the sender's layout instead of the
/// receiver's lands wrong; the gaps must stay as they were). A backend without the path
/// refuses to switch it on, as documented (`Capabilities::copy_engine`).
pub(super) fn all_to_all_v_copy_engine<C: Collective>(c: &Comm<C>) -> Out {
    if !c.capabilities().copy_engine {
        return match c.set_copy_engine(true) {
            Err(Error::Unsupported { .. }) => Ok(()),
            other => Err(Failure::msg(format!(
                "set_copy_engine on a backend without the path: {other:?}"
            ))),
        };
    }
    let (r, w) = (c.rank(), c.world_size());
    let count = |from: usize, to: usize| a2a_count(from, to) * 3 + (from + to) % 2;
    let sc: Vec<usize> = (0..w).map(|p| count(r, p)).collect();
    let rc: Vec<usize> = (0..w).map(|p| count(p, r)).collect();
    let sd = packed_displs(&sc)?;
    let mut rd = vec![0; w];
    let mut at = 1;
    for p in (0..w).rev() {
        rd[p] = at;
        at += rc[p] + 1;
    }
    // The same window on every rank (NCCL's symmetric rule): the largest layout fits.
    let len = 1
        + (0..w)
            .map(|q| (0..w).map(|p| count(p, q) + 1).sum::<usize>())
            .max()
            .unwrap_or(0);
    let val = |from: usize, to: usize, i: usize| (from * 1000 + to * 50 + i) as i32;
    let send: Vec<i32> = (0..w)
        .flat_map(|p| (0..sc[p]).map(move |i| val(r, p, i)))
        .collect();
    c.set_copy_engine(true)?;
    let st = c.create_stream()?;
    let run = || -> Out {
        let sb = upload(c, &send, &st)?;
        let mut win = c
            .register_window(upload(c, &vec![-1i32; len], &st)?)
            .map_err(|e| e.error)?;
        let layout = |counts, displs| Counts { counts, displs };
        let r1 = c.all_to_all_v(&sb, layout(&sc, &sd), &mut win, layout(&rc, &rd), &st);
        let got = win.copy_to_host(&st);
        c.deregister_window(win)?;
        r1?;
        let mut want = vec![-1i32; len];
        for p in 0..w {
            for i in 0..rc[p] {
                want[rd[p] + i] = val(p, r, i);
            }
        }
        same(&got?, &want, "all_to_all_v into a window")
    };
    let out = run();
    c.set_copy_engine(false)?;
    out
}
