//! Growing a world on the mock with NCCL's rules (`ncclCommGrow`, NCCL 2.29.2): rank 0
//! makes the id, the world's ranks grow with it (the others passing none) while the new
//! ranks join with it; ranks keep their numbers, the grown world reduces exactly and the old
//! one still does. A world of threads and a world of processes (joined by id) both grow; a
//! target before 2.29.2 refuses naming it; an id is used once.

use unicomm_core::{Comm, DeviceStream, Error, ReduceOp, Result};
use unicomm_mock::{init_grown, local_comms_with, MockComm, MockConfig};

fn config(target: &str) -> MockConfig {
    MockConfig::standing_for(target).unwrap()
}

/// The sum of `rank + 1` over `c`'s world, on `c`.
fn sum(c: &Comm<MockComm>) -> Result<f32> {
    let st = c.create_stream()?;
    let mut b = c.upload(&[(c.rank() + 1) as f32; 4], &st)?;
    c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)?;
    st.synchronize()?;
    Ok(b.copy_to_host(&st)?[0])
}

/// `old` grows to `world` with new ranks joined by `join(id, rank)`: each rank's (rank,
/// grown world's sum, old world's sum after the grow; `None` for new ranks).
fn grow(
    old: Vec<Comm<MockComm>>,
    world: usize,
    join: impl Fn(&[u8; 128], usize) -> Result<Comm<MockComm>> + Sync,
) -> Vec<(usize, f32, Option<f32>)> {
    let id = old[0].grow_id().unwrap();
    let w = old.len();
    std::thread::scope(|s| {
        let mut hs = Vec::new();
        for c in &old {
            let id = (c.rank() == 0).then_some(id);
            hs.push(s.spawn(move || -> Result<_> {
                let g = c.grow(world, id.as_ref())?;
                Ok((g.rank(), sum(&g)?, Some(sum(c)?)))
            }));
        }
        for r in w..world {
            let join = &join;
            hs.push(s.spawn(move || -> Result<_> {
                let g = join(&id, r)?;
                Ok((g.rank(), sum(&g)?, None))
            }));
        }
        hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    })
}

#[test]
fn a_world_of_threads_grows_with_new_threads_and_both_worlds_reduce() {
    let old = local_comms_with(2, config("nccl-2.32.3")).unwrap();
    let got = grow(old, 4, |id, r| {
        Ok(Comm::from_backend(init_grown(
            id,
            r,
            4,
            config("nccl-2.32.3"),
        )?))
    });
    assert_eq!(
        got,
        vec![
            (0, 10.0, Some(3.0)),
            (1, 10.0, Some(3.0)),
            (2, 10.0, None),
            (3, 10.0, None)
        ]
    );
}

#[test]
fn a_world_joined_by_id_grows_as_a_world_of_processes() {
    let id = unicomm_mock::unique_id().unwrap();
    let old = vec![Comm::from_backend(
        unicomm_mock::init_rank(&id, 0, 1, config("nccl-2.29.2")).unwrap(),
    )];
    let got = grow(old, 3, |id, r| {
        Ok(Comm::from_backend(init_grown(
            id,
            r,
            3,
            config("nccl-2.29.2"),
        )?))
    });
    assert_eq!(
        got,
        vec![(0, 6.0, Some(1.0)), (1, 6.0, None), (2, 6.0, None)]
    );
}

#[test]
fn nccls_rules_for_the_id_and_the_release_are_kept() {
    let old = local_comms_with(2, config("nccl-2.32.3")).unwrap();
    let invalid = |r: Result<()>, word: &str| match r {
        Err(Error::InvalidArgument { reason, .. }) => assert!(reason.contains(word), "{reason}"),
        other => panic!("{other:?}"),
    };
    invalid(old[1].grow_id().map(drop), "rank 0 makes it");
    invalid(old[0].grow(2, None).map(drop), "a world of 2 grows");
    invalid(old[0].grow(3, None).map(drop), "rank 0 passes the id");
    invalid(old[1].grow(3, Some(&[0; 128])).map(drop), "only rank 0");
    // A new rank with an id no grow made here.
    let id = old[0].grow_id().unwrap();
    let mut other = id;
    other[12] ^= 0xff;
    invalid(
        init_grown(&other, 2, 3, config("nccl-2.32.3")).map(drop),
        "used already, or never made here",
    );
    invalid(
        init_grown(&id, 0, 3, config("nccl-2.32.3")).map(drop),
        "new ranks follow",
    );
    let before = local_comms_with(1, config("nccl-2.28.9")).unwrap();
    match before[0].grow_id() {
        Err(Error::Unsupported { needs, .. }) => assert!(needs.contains("2.29.2"), "{needs}"),
        other => panic!("{other:?}"),
    }
}
