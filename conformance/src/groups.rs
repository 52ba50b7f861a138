//! The suite's process groups and the collectives built on them: split (several color and
//! key patterns, ranks without a color, reversed keys), the device mesh, gather and
//! scatter, the variable-size exchanges, scaled sums, the 8-bit floats and the ordering
//! between streams. Every rank runs the same sequence ([`run_groups_on_rank`]), so it runs
//! alike with ranks as threads ([`run_groups`]) and as processes; every output is checked
//! exactly against values computed here.

use unicomm_core::{each_rank, Collective, Comm, DeviceMesh, DeviceStream, ReduceOp, F8E4M3};

use super::var::{
    all_gather_v, all_to_all_v, all_to_all_v_copy_engine, gather_scatter, overlapping_receives,
    reduce_scatter_v, scaled_sums,
};
use super::Failure;

use super::exact::{same, upload, Out};

/// Every check below on every communicator of one world, one thread per rank.
pub fn run_groups<C: Collective>(comms: &[Comm<C>]) -> Out {
    run_groups_refusing(comms, &|_| false)
}

/// [`run_groups`] where the backend refuses the checks `refused` names, by design and
/// documented (a behaviour that differs by vendor): each of those passes only if it is
/// `Unsupported` on every rank.
pub fn run_groups_refusing<C: Collective>(
    comms: &[Comm<C>],
    refused: &(dyn Fn(&str) -> bool + Sync),
) -> Out {
    each_rank(comms, |c| run_groups_on_rank_refusing(c, refused)).map(drop)
}

/// Every check below on this rank (every rank of the world calls it, in the same order).
pub fn run_groups_on_rank<C: Collective>(c: &Comm<C>) -> Out {
    run_groups_on_rank_refusing(c, &|_| false)
}

/// [`run_groups_on_rank`] with the checks the backend refuses (see [`run_groups_refusing`]).
pub fn run_groups_on_rank_refusing<C: Collective>(
    c: &Comm<C>,
    refused: &(dyn Fn(&str) -> bool + Sync),
) -> Out {
    let rank = c.rank();
    // A check the backend refuses passes only as `Unsupported`; any other passes only by
    // running right.
    let expect_refusal = |what: &'static str, r: Out| -> Out {
        let unsupported = |f: &Failure| {
            matches!(
                f.1.as_deref(),
                Some(unicomm_core::Error::Unsupported { .. })
            )
        };
        match (refused(what), r) {
            (false, Ok(())) => Ok(()),
            (true, Err(f)) if unsupported(&f) => Ok(()),
            (true, Ok(())) => Err(Failure::msg(format!(
                "rank {rank}, {what}: expected Unsupported, but it ran"
            ))),
            (true, Err(Failure(m, e))) => Err(Failure(
                format!("rank {rank}, {what}: expected Unsupported: {m}"),
                e,
            )),
            (false, Err(Failure(m, e))) => Err(Failure(format!("rank {rank}, {what}: {m}"), e)),
        }
    };
    expect_refusal("split", splits(c))?;
    expect_refusal("mesh", mesh(c))?;
    expect_refusal("a child as a full communicator", full_child(c))?;
    expect_refusal("gather/scatter f32", gather_scatter::<f32, C>(c))?;
    expect_refusal("gather/scatter f8e4m3", gather_scatter::<F8E4M3, C>(c))?;
    expect_refusal("all_to_all_v i32", all_to_all_v::<i32, C>(c))?;
    expect_refusal(
        "all_to_all_v bf16",
        all_to_all_v::<unicomm_core::bf16, C>(c),
    )?;
    expect_refusal(
        "all_to_all_v into a window, copy-engine path",
        all_to_all_v_copy_engine(c),
    )?;
    expect_refusal("all_gather_v f32", all_gather_v::<f32, C>(c))?;
    expect_refusal(
        "overlapping receive ranges refused",
        overlapping_receives(c),
    )?;
    expect_refusal("reduce_scatter_v i64", reduce_scatter_v::<i64, C>(c))?;
    expect_refusal("pre-multiplied sum f32", scaled_sums::<f32, C>(c))?;
    expect_refusal(
        "pre-multiplied sum bf16",
        scaled_sums::<unicomm_core::bf16, C>(c),
    )?;
    expect_refusal("pre-multiplied sum f8e4m3", scaled_sums::<F8E4M3, C>(c))?;
    expect_refusal("ordering between streams", streams(c))?;
    Ok(())
}

/// The child's all-reduce of its members' parent ranks: every member must get their sum.
fn check_child<C: Collective>(
    child: &Comm<C>,
    members: &[usize],
    parent_rank: usize,
    what: &str,
) -> Out {
    let me = members.iter().position(|&r| r == parent_rank);
    if me != Some(child.rank()) || child.world_size() != members.len() {
        return Err(Failure::msg(format!(
            "{what}: rank {}/{} of the child, want {me:?}/{}",
            child.rank(),
            child.world_size(),
            members.len()
        )));
    }
    let st = child.create_stream()?;
    let mut b = upload(child, &[parent_rank as i64; 3], &st)?;
    child.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)?;
    let want = members.iter().map(|&r| r as i64).sum::<i64>();
    same(&b.copy_to_host(&st)?, &[want; 3], what)
}

fn splits<C: Collective>(c: &Comm<C>) -> Out {
    let (r, w) = (c.rank(), c.world_size());
    // (color of rank p, key of rank p): even/odd, reversed keys, a third without color,
    // everyone together.
    type Pattern = (
        &'static str,
        fn(usize, usize) -> Option<u32>,
        fn(usize) -> i32,
    );
    let patterns: [Pattern; 4] = [
        ("even/odd", |p, _| Some(p as u32 % 2), |p| p as i32),
        ("reversed keys", |_, _| Some(7), |p| -(p as i32)),
        (
            "no color for every third rank",
            |p, _| (p % 3 != 2).then_some(1),
            |p| p as i32,
        ),
        (
            "halves, equal keys",
            |p, w| Some((2 * p / w.max(1)) as u32),
            |_| 0,
        ),
    ];
    for (what, color, key) in patterns {
        let child = c.split(color(r, w), key(r))?;
        let mine = color(r, w);
        match (child, mine) {
            (None, None) => {}
            (Some(child), Some(m)) => {
                // NCCL's order: by key, ties by parent rank.
                let mut members: Vec<(i32, usize)> = (0..w)
                    .filter(|&p| color(p, w) == Some(m))
                    .map(|p| (key(p), p))
                    .collect();
                members.sort();
                let members: Vec<usize> = members.into_iter().map(|(_, p)| p).collect();
                check_child(&child, &members, r, what)?;
                child.finalize()?;
            }
            (got, _) => {
                return Err(Failure::msg(format!(
                    "{what}: a child {} for color {mine:?}",
                    if got.is_some() { "given" } else { "missing" }
                )))
            }
        }
    }
    // A child sharing its parent's resources (NCCL's splitShare): a communicator like any.
    let shared = unicomm_core::CommConfig {
        split_share: Some(true),
        ..unicomm_core::CommConfig::default()
    };
    let child = c
        .split_with(Some(0), r as i32, &shared)?
        .ok_or_else(|| Failure::msg("split_share: no child"))?;
    check_child(&child, &(0..w).collect::<Vec<_>>(), r, "split_share")?;
    child.finalize()?;
    // The rank-list form, and a child of a child.
    let evens: Vec<usize> = (0..w).step_by(2).collect();
    if let Some(child) = c.split_ranks(&evens)? {
        check_child(&child, &evens, r, "split_ranks")?;
        let first = child.split_ranks(&[0])?;
        if let Some(g) = first {
            check_child(&g, &[0], child.rank(), "a child's child")?;
            g.finalize()?;
        }
        child.finalize()?;
    } else if r % 2 == 0 {
        return Err(Failure::msg("split_ranks: an even rank got no child"));
    }
    Ok(())
}

fn mesh<C: Collective>(c: &Comm<C>) -> Out {
    let w = c.world_size();
    let dims: Vec<(&str, usize)> = match w {
        8 => vec![("pp", 2), ("dp", 2), ("tp", 2)],
        w if w % 2 == 0 => vec![("dp", 2), ("tp", w / 2)],
        w => vec![("dp", 1), ("tp", w)],
    };
    let m = DeviceMesh::new(c, &dims)?;
    // Row-major: the last dimension fastest.
    let mut stride = 1;
    let mut strides = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        strides[d] = stride;
        stride *= dims[d].1;
    }
    for (d, &(name, size)) in dims.iter().enumerate() {
        let coord = m.coord(name)?;
        let base = c.rank() - coord * strides[d];
        let members: Vec<usize> = (0..size).map(|k| base + k * strides[d]).collect();
        check_child(m.dim(name)?, &members, c.rank(), name)?;
    }
    Ok(m.finalize()?)
}

/// A child registers buffers, windows and automatic registrations, polls its asynchronous
/// error, and runs collectives in one group with its parent, each exact.
fn full_child<C: Collective>(c: &Comm<C>) -> Out {
    let (r, w) = (c.rank(), c.world_size());
    let child = c
        .split(Some(0), -(r as i32))?
        .ok_or_else(|| Failure::msg("no child"))?;
    let me = (w - 1 - r) as i64;
    let st = c.create_stream()?;
    let reg = child
        .register(upload(&child, &[me; 8], &st)?)
        .map_err(|e| e.error)?;
    let mut win = child
        .register_window(upload(&child, &[0i64; 8], &st)?)
        .map_err(|e| e.error)?;
    child.all_reduce(&reg, &mut win, ReduceOp::Sum, &st)?;
    let want = (w * (w - 1) / 2) as i64;
    same(
        &win.copy_to_host(&st)?,
        &[want; 8],
        "registered into a window",
    )?;
    let mut auto = child
        .register_auto(upload(&child, &[me; 8], &st)?)
        .map_err(|e| e.error)?;
    child.all_reduce_in_place(&mut auto, ReduceOp::Max, &st)?;
    same(
        &auto.copy_to_host(&st)?,
        &[(w - 1) as i64; 8],
        "automatic registration",
    )?;
    child.poll_async_error()?;
    // One group over parent and child (NCCL's groups span communicators).
    let mut a = upload(c, &[1i64; 4], &st)?;
    let mut b = upload(&child, &[2i64; 4], &st)?;
    c.group(|| {
        c.all_reduce_in_place(&mut a, ReduceOp::Sum, &st)?;
        child.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)
    })?;
    same(
        &a.copy_to_host(&st)?,
        &[w as i64; 4],
        "the parent in the group",
    )?;
    same(
        &b.copy_to_host(&st)?,
        &[2 * w as i64; 4],
        "the child in the group",
    )?;
    child.deregister_auto(auto)?;
    child.deregister_window(win)?;
    child.deregister(reg)?;
    Ok(child.finalize()?)
}

/// A collective on one stream ordered after a copy on another by a marker: the
/// communication stream waits for the compute stream on the device, not on the host.
fn streams<C: Collective>(c: &Comm<C>) -> Out {
    let (r, w, n) = (c.rank(), c.world_size(), 1 << 16);
    let (compute, comm) = (c.create_stream()?, c.create_stream()?);
    let mut b = c.alloc::<f32>(n)?;
    b.copy_from_host(&vec![(r + 1) as f32; n], &compute)?;
    let ready = compute.record()?;
    comm.wait(&ready)?;
    c.all_reduce_in_place(&mut b, ReduceOp::Sum, &comm)?;
    let want = (w * (w + 1) / 2) as f32;
    same(
        &b.copy_to_host(&comm)?,
        &vec![want; n],
        "all_reduce after the marker",
    )
}
