//! `shrink` on the mock's threads: a rank that stops taking part times the others out; the
//! survivors shrink the world without it, in each mode, and go on with exact data. The
//! arguments NCCL forbids (an excluded rank calling, ranks out of range or twice) are
//! refused before anything is called.

use std::time::Duration;

use unicomm_core::{each_rank, Comm, Error, ReduceOp, ShrinkMode};
use unicomm_mock::{local_comms_with, MockComm, MockConfig};

fn world(n: usize) -> Vec<Comm<MockComm>> {
    local_comms_with(
        n,
        MockConfig {
            timeout: Duration::from_millis(300),
            ..MockConfig::default()
        },
    )
    .unwrap()
}

/// Every rank's sum of `rank + 1` over `c`'s world, through an all-reduce on `c`.
fn sum_of_ranks(c: &Comm<MockComm>, parent_rank: usize) -> unicomm_core::Result<f32> {
    let st = c.create_stream()?;
    let mut b = c.alloc::<f32>(64)?;
    b.copy_from_host(&[(parent_rank + 1) as f32; 64], &st)?;
    c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)?;
    let h = b.copy_to_host(&st)?;
    assert!(h.iter().all(|&x| x == h[0]));
    Ok(h[0])
}

#[test]
fn survivors_shrink_past_a_silent_rank_in_every_mode() {
    for mode in [ShrinkMode::Default, ShrinkMode::Abort, ShrinkMode::Reform] {
        let lost = 2;
        let out = each_rank(
            world(4),
            |c| -> unicomm_core::Result<Option<(usize, usize, f32)>> {
                let r = c.rank();
                if r == lost {
                    // Gone: never calls again (its communicator lives on, silent).
                    std::thread::sleep(Duration::from_millis(900));
                    return Ok(None);
                }
                let e = sum_of_ranks(&c, r).unwrap_err();
                assert!(
                    matches!(e, Error::Timeout { .. } | Error::Aborted { .. }),
                    "{e}"
                );
                let small = c.shrink(&[lost], mode)?;
                let got = sum_of_ranks(&small, r)?;
                if mode != ShrinkMode::Default {
                    assert!(c.poll_async_error().is_err() || sum_of_ranks(&c, r).is_err());
                }
                Ok(Some((small.rank(), small.world_size(), got)))
            },
        )
        .unwrap();
        for (r, o) in out.into_iter().enumerate() {
            if r == lost {
                continue;
            }
            let (nr, nw, got) = o.unwrap();
            assert_eq!((nr, nw), (if r > lost { r - 1 } else { r }, 3), "{mode:?}");
            assert_eq!(got, (1 + 2 + 4) as f32, "{mode:?}: rank {r}");
        }
    }
}

#[test]
fn a_shrunk_world_shrinks_again() {
    let out = each_rank(world(4), |c| -> unicomm_core::Result<Option<f32>> {
        let r = c.rank();
        if r == 0 {
            return Ok(None);
        }
        let three = c.shrink(&[0], ShrinkMode::Reform)?;
        if three.rank() == 2 {
            return Ok(None);
        }
        let two = three.shrink(&[2], ShrinkMode::Reform)?;
        Ok(Some(sum_of_ranks(&two, r)?))
    })
    .unwrap();
    assert_eq!(out, vec![None, Some(5.0), Some(5.0), None]);
}

#[test]
fn shrink_refuses_what_nccl_forbids_before_calling_anything() {
    let comms = world(3);
    let c = &comms[1];
    for (exclude, what) in [
        (&[1][..], "excludes itself"),
        (&[3][..], "outside"),
        (&[0, 0][..], "twice"),
    ] {
        match c.shrink(exclude, ShrinkMode::Default) {
            Err(Error::InvalidArgument { reason, .. }) => {
                assert!(reason.contains(what), "{reason}")
            }
            other => panic!("{exclude:?}: {other:?}"),
        }
    }
}

/// An elastic engine re-forms its groups after a shrink: the survivors' world splits into
/// tensor-parallel pairs whose all-reduces are exact (each survivor's new world had a number
/// of its own, so every member formed a group of one and timed out).
#[test]
fn a_shrunk_world_splits_into_groups_that_work() {
    let lost = 3;
    let out = each_rank(
        world(5),
        |c| -> unicomm_core::Result<Option<(usize, f32)>> {
            let r = c.rank();
            if r == lost {
                std::thread::sleep(Duration::from_millis(900));
                return Ok(None);
            }
            let _ = sum_of_ranks(&c, r).unwrap_err();
            let small = c.shrink(&[lost], ShrinkMode::Default)?;
            let color = (small.rank() / 2) as u32;
            let group = small
                .split(Some(color), 0)?
                .expect("every survivor has a color");
            Ok(Some((group.world_size(), sum_of_ranks(&group, r)?)))
        },
    )
    .unwrap();
    // Survivors 0, 1, 2, 4 are ranks 0..4 of the shrunk world: pairs (0, 1) and (2, 4).
    let want = [
        Some((2, 3.0)),
        Some((2, 3.0)),
        Some((2, 8.0)),
        None,
        Some((2, 8.0)),
    ];
    for (r, (o, w)) in out.into_iter().zip(want).enumerate() {
        assert_eq!(o, w, "rank {r}");
    }
}

/// A re-form completes for every survivor or fails for every survivor (NCCL's
/// `ncclCommInitRank` waits for all): with survivor 2 lost during it, survivors 0 and 1 get
/// an error at the deadline instead of a world of three that rank 2 never joins.
#[test]
fn a_re_form_missing_a_survivor_fails_for_the_others() {
    let out = each_rank(world(4), |c| -> unicomm_core::Result<Option<bool>> {
        let r = c.rank();
        if r >= 2 {
            // 3 is the lost rank, 2 is lost during the re-form.
            std::thread::sleep(Duration::from_millis(1500));
            return Ok(None);
        }
        let _ = sum_of_ranks(&c, r);
        Ok(Some(c.shrink(&[3], ShrinkMode::Reform).is_err()))
    })
    .unwrap();
    assert_eq!(out, vec![Some(true), Some(true), None, None]);
}

/// What the old communicator does after a shrink, one rule per mode, eager and replayed
/// alike: with `Default` it stays usable (NCCL's rule), so a collective that needs the
/// excluded rank, silent now, ends as any collective with a silent peer: `Timeout` at the
/// deadline (the shrink did not abort it), and every call after that fails at once; with
/// `Abort` and `Reform` it was aborted, so every later call, eager or a graph's replay
/// captured before the shrink, is `Aborted` at once.
#[test]
fn the_old_communicator_after_a_shrink_follows_its_mode_eager_and_replayed() {
    use std::time::Instant;
    use unicomm_core::graph::Graph;
    use unicomm_core::DeviceStream;
    for mode in [ShrinkMode::Default, ShrinkMode::Abort, ShrinkMode::Reform] {
        for replay_first in [false, true] {
            // Every rank past the capture before a survivor's shrink aborts the old world.
            let captured = std::sync::Barrier::new(3);
            let out = each_rank(world(3), |c| -> unicomm_core::Result<Option<_>> {
                let st = c.create_stream()?;
                let x = c.upload(&[1f32; 8], &st)?;
                let y = c.upload(&[1f32; 8], &st)?;
                let z = std::cell::RefCell::new(c.alloc::<f32>(8)?);
                let g = Graph::capture(&st, |g| g.all_reduce_in_place(&c, &x, ReduceOp::Sum))
                    .and_then(|g| st.synchronize().map(|()| g));
                captured.wait();
                let g = g?;
                if c.rank() == 2 {
                    std::thread::sleep(Duration::from_millis(1200));
                    return Ok(None);
                }
                let small = c.shrink(&[2], mode)?;
                let eager = || -> unicomm_core::Result<()> {
                    c.all_reduce(&y, &mut *z.borrow_mut(), ReduceOp::Sum, &st)?;
                    st.synchronize()
                };
                let replay = || g.launch(&st).and_then(|()| st.synchronize());
                let (first, then): (&dyn Fn() -> _, &dyn Fn() -> _) = match replay_first {
                    true => (&replay, &eager),
                    false => (&eager, &replay),
                };
                let t = Instant::now();
                let one = first();
                let took = t.elapsed();
                let t = Instant::now();
                let two = then();
                let after = t.elapsed();
                drop(g);
                drop(small);
                Ok(Some((one, took, two, after)))
            })
            .unwrap();
            for (one, took, two, after) in out.into_iter().flatten() {
                let scene = format!(
                    "{mode:?}, replay first {replay_first}: {one:?} after {took:?}, then {two:?}"
                );
                match mode {
                    ShrinkMode::Default => assert!(
                        matches!(one, Err(Error::Timeout { .. }))
                            && took >= Duration::from_millis(250),
                        "{scene}"
                    ),
                    _ => assert!(
                        matches!(one, Err(Error::Aborted { .. }))
                            && took < Duration::from_millis(150),
                        "{scene}"
                    ),
                }
                assert!(
                    two.is_err() && after < Duration::from_millis(150),
                    "{scene}"
                );
            }
        }
    }
}

/// Survivors whose first re-forms failed at different times (one arrived after the
/// other's deadline) retry and meet: a failed attempt is retried under the same round
/// (counting attempts, the survivor one failure ahead met the other never, 1 run in 3
/// across processes).
#[test]
fn survivors_whose_attempts_failed_at_different_times_meet_on_retry() {
    let out = each_rank(
        world(3),
        |c| -> unicomm_core::Result<Option<(usize, f32)>> {
            let r = c.rank();
            if r == 2 {
                return Ok(None);
            }
            if r == 0 {
                // Later than rank 1's whole first attempt (its deadline is 300 ms).
                std::thread::sleep(Duration::from_millis(450));
            }
            let mut failures = 0;
            for _ in 0..20 {
                match c.shrink(&[2], ShrinkMode::Default) {
                    Ok(small) => return Ok(Some((failures, sum_of_ranks(&small, r)?))),
                    Err(_) => failures += 1,
                }
            }
            Err(Error::invalid(
                "shrink",
                format!("rank {r}: 20 attempts failed"),
            ))
        },
    )
    .unwrap();
    assert_eq!(out[0].map(|o| o.1), Some(3.0), "{out:?}");
    assert_eq!(out[1].map(|o| o.1), Some(3.0), "{out:?}");
    assert!(
        out[1].is_some_and(|o| o.0 >= 1),
        "rank 1's first attempt had to fail: {out:?}"
    );
}
