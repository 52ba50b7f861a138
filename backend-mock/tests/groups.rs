//! Process groups and the collectives built on them on the mock's threads: the suite's
//! checks at every world size, and what the mock reports when ranks disagree.

use std::time::Duration;

use rstest::rstest;
use unicomm_conformance::{group_check_refused_by_design, run_groups_refusing};
use unicomm_core::{packed_displs, Comm, Counts, DeviceStream, Error, ReduceOp};
use unicomm_mock::{local_comms_with, MockComm, MockConfig};

fn world(n: usize) -> Vec<Comm<MockComm>> {
    world_within(n, Duration::from_secs(20))
}

fn world_within(n: usize, timeout: Duration) -> Vec<Comm<MockComm>> {
    let config = MockConfig {
        timeout,
        ..MockConfig::default()
    };
    local_comms_with(n, config).unwrap()
}

/// Every check runs right, but what NCCL refuses by design (the mock's default target is
/// the newest NCCL): those pass only as `Unsupported`.
#[rstest]
fn the_suite_of_groups_passes(#[values(1, 2, 3, 4, 5, 8)] n: usize) {
    let comms = world(n);
    let refused = |check: &str| group_check_refused_by_design(check, n, true);
    if let Err(e) = run_groups_refusing(&comms, &refused) {
        panic!("{e}");
    }
}

/// On a target that does not reduce fp8 (NCCL on an sm80 GPU), the fp8 checks are refused
/// and every other check still runs right.
#[test]
fn the_suite_of_groups_passes_where_fp8_is_not_reduced() {
    let config = MockConfig::standing_for("nccl-2.28.9-sm80")
        .unwrap()
        .within(Duration::from_secs(20));
    let comms = local_comms_with(3, config).unwrap();
    assert!(!comms[0].capabilities().fp8_reduce);
    let refused = |check: &str| group_check_refused_by_design(check, 3, false);
    if let Err(e) = run_groups_refusing(&comms, &refused) {
        panic!("{e}");
    }
}

/// The children of a rank share its device: a buffer and a stream of the parent serve the
/// child (a communicator of the same rank), and memory of another rank does not.
#[test]
fn a_child_uses_its_parents_streams_and_buffers() {
    let comms = world(2);
    let out = unicomm_core::each_rank(&comms, |c| {
        let st = c.create_stream()?;
        let mut b = c.alloc::<f32>(8)?;
        b.copy_from_host(&[c.rank() as f32 + 1.0; 8], &st)?;
        let child = c.split(Some(0), 0)?.expect("a child");
        child.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)?;
        let host = b.copy_to_host(&st)?;
        drop(b);
        child.finalize()?;
        Ok::<_, Error>(host)
    })
    .unwrap();
    assert!(out.iter().all(|h| h == &[3.0; 8]), "{out:?}");
    // A buffer of rank 1 is not rank 0's memory, in the parent or in a child.
    let mut other = comms[1].alloc::<f32>(4).unwrap();
    let st = comms[0].create_stream().unwrap();
    let e = comms[0]
        .all_reduce_in_place(&mut other, ReduceOp::Sum, &st)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
}

/// The parent dropped without `finalize` on every rank (as a mesh's world often is) leaves
/// its children working: a drop finalizes (NCCL's rule), it does not abort the peers.
#[test]
fn children_outlive_a_parent_dropped_without_finalize() {
    let comms = world(4);
    let sums = unicomm_core::each_rank(comms, |c| {
        let child = c.split(Some(c.rank() as u32 % 2), 0)?.expect("a child");
        let rank = c.rank();
        drop(c);
        let st = child.create_stream()?;
        let mut b = child.alloc::<i32>(2)?;
        b.copy_from_host(&[rank as i32; 2], &st)?;
        child.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)?;
        let host = b.copy_to_host(&st)?;
        drop(b);
        child.finalize()?;
        Ok::<_, Error>(host[0])
    })
    .unwrap();
    assert_eq!(sums, [2, 4, 2, 4]);
}

/// A child's abort fails its own peers, not the parent's: the parent goes on.
#[test]
fn a_childs_abort_leaves_the_parent_usable() {
    let comms = world(2);
    let out = unicomm_core::each_rank(&comms, |c| {
        let child = c.split(Some(0), 0)?.expect("a child");
        child.abort()?;
        let st = c.create_stream()?;
        let mut b = c.alloc::<f32>(4)?;
        b.copy_from_host(&[1.0; 4], &st)?;
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)?;
        b.copy_to_host(&st)
    })
    .unwrap();
    assert!(out.iter().all(|h| h == &[2.0; 4]), "{out:?}");
}

/// Ranks that disagree on an all-to-all-v count (rank 0 sends 2 elements, rank 1 expects
/// 3) get `Mismatch` naming both counts, not a hang.
#[test]
fn an_all_to_all_v_count_disagreement_is_a_mismatch() {
    let comms = world_within(2, Duration::from_secs(3));
    let errs = unicomm_core::each_rank(&comms, |c| {
        let st = c.create_stream()?;
        let (sc, rc) = if c.rank() == 0 {
            (vec![1, 2], vec![1, 1])
        } else {
            (vec![1, 1], vec![3, 1])
        };
        let (sd, rd) = (packed_displs(&sc)?, packed_displs(&rc)?);
        let send = c.alloc::<f32>(sc.iter().sum())?;
        let mut recv = c.alloc::<f32>(rc.iter().sum())?;
        let s = Counts {
            counts: &sc,
            displs: &sd,
        };
        let r = Counts {
            counts: &rc,
            displs: &rd,
        };
        c.all_to_all_v(&send, s, &mut recv, r, &st)?;
        Ok::<_, Error>(st.synchronize())
    })
    .unwrap();
    assert!(
        errs.iter()
            .any(|e| matches!(e, Err(Error::Mismatch { .. }))),
        "{errs:?}"
    );
}

/// Counts that do not fit the buffer, or overflow, are refused before anything is enqueued,
/// naming the rank.
#[test]
fn counts_out_of_bounds_are_refused_naming_the_rank() {
    let comms = world(2);
    let c = &comms[0];
    let st = c.create_stream().unwrap();
    let send = c.alloc::<f32>(4).unwrap();
    let mut recv = c.alloc::<f32>(4).unwrap();
    let ok = [2usize, 2];
    let displs = [0usize, 2];
    let big = [2usize, 3];
    let over = [1usize, usize::MAX];
    for (counts, ds) in [
        (&big[..], &displs[..]),
        (&over[..], &[0, 1][..]),
        (&ok[..1], &displs[..1]),
    ] {
        let e = c
            .all_to_all_v(
                &send,
                Counts { counts, displs: ds },
                &mut recv,
                Counts {
                    counts: &ok,
                    displs: &displs,
                },
                &st,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank") || e.contains("counts"), "{e}");
    }
    // all_gather_v: this rank's send must be its own entry.
    let e = c
        .all_gather_v(
            &send,
            &mut recv,
            Counts {
                counts: &ok,
                displs: &displs,
            },
            &st,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("entry"), "{e}");
}

/// A pre-multiplied sum's scalar must be of the elements' type.
#[test]
fn a_scalar_of_another_type_is_refused() {
    let comms = world(1);
    let c = &comms[0];
    let st = c.create_stream().unwrap();
    let mut b = c.alloc::<f32>(4).unwrap();
    let e = c
        .all_reduce_in_place(&mut b, ReduceOp::pre_mul_sum(2.0f64), &st)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
}

/// A mesh's dimensions must multiply to the world: refused before any split.
#[test]
fn a_mesh_whose_sizes_do_not_multiply_to_the_world_is_refused() {
    let comms = world(4);
    let e = unicomm_core::DeviceMesh::new(&comms[0], &[("dp", 3), ("tp", 2)]).unwrap_err();
    assert!(e.to_string().contains("multiply"), "{e}");
}

/// The reverse: a parent's abort fails the parent's peers, not its children, which go on.
#[test]
fn a_parents_abort_leaves_its_children_usable() {
    let comms = world(2);
    let out = unicomm_core::each_rank(comms, |c| {
        let child = c.split(Some(0), 0)?.expect("a child");
        c.abort()?;
        let refused = c.create_stream().and_then(|s| c.barrier(&s));
        assert!(refused.is_err(), "the aborted parent refuses work");
        drop(c);
        let st = child.create_stream()?;
        let mut b = child.alloc::<f32>(4)?;
        b.copy_from_host(&[1.0; 4], &st)?;
        child.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)?;
        let host = b.copy_to_host(&st)?;
        drop(b);
        child.finalize()?;
        Ok::<_, Error>(host)
    })
    .unwrap();
    assert!(out.iter().all(|h| h == &[2.0; 4]), "{out:?}");
}
