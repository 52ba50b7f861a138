//! Shrinking on the fake NCCL-ABI library, three ranks on threads joined with `init_rank`
//! (a barrier world: its in-place uint64 all-reduces are real): `ncclCommShrink` in its two
//! modes where the library has it (2.28.9), the survivors' re-forming where it does not
//! (2.17), where the parent already failed, or where it is asked for; `ncclCommRevoke` and
//! its version gate; the exact sums of the survivors' communicator. In a process of its own (the
//! variables and the fake's counters).

use std::sync::Arc;

use crate::common::{calls, fake, flavors, Host};
use unicomm_bootstrap::Rejoin;
use unicomm_core::{Comm, CommConfig, Error, ReduceOp, ShrinkMode};
use unicomm_nccl_api::{Api, ApiComm};

type C = Comm<ApiComm<Host>>;
const W: usize = 3;
const LOST: usize = 1;

/// What a survivor saw: its new rank and size, the survivors' sum of `parent rank + 1`,
/// whether the parent was aborted by the shrink, and revoke's result.
type Seen = (usize, usize, u64, bool, Option<String>);

fn sum(c: &C, x: u64) -> unicomm_core::Result<u64> {
    let st = c.create_stream()?;
    let mut b = c.alloc::<u64>(4)?;
    b.copy_from_host(&[x; 4], &st)?;
    c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)?;
    st.synchronize()?;
    Ok(b.copy_to_host(&st)?[0])
}

/// Three ranks; rank `LOST` stops; the others (after `before`) shrink it out with `mode`.
fn run(
    feature: &str,
    mode: ShrinkMode,
    rejoin: bool,
    before: impl Fn(&C) + Sync,
) -> Vec<Option<Result<Seen, Error>>> {
    run_with(feature, mode, rejoin, before, &CommConfig::default())
}

/// [`run`] with the shrunk communicator's configuration.
fn run_with(
    feature: &str,
    mode: ShrinkMode,
    rejoin: bool,
    before: impl Fn(&C) + Sync,
    config: &CommConfig,
) -> Vec<Option<Result<Seen, Error>>> {
    let path = fake(feature);
    let api =
        Arc::new(Api::open(flavors(false, feature == "rccl-old"), &path).expect("load the fake"));
    let id = api.unique_id().unwrap();
    let board: Arc<dyn unicomm_core::Rejoin> = Arc::new(Rejoin::local());
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..W)
            .map(|r| {
                let (api, board, before) = (api.clone(), board.clone(), &before);
                s.spawn(move || {
                    let c = Comm::from_backend(
                        ApiComm::init_rank(api, Arc::new(Host), id, r, W, 0).unwrap(),
                    );
                    if rejoin {
                        c.backend().set_rejoin(board).unwrap();
                    }
                    if r == LOST {
                        c.abort().unwrap();
                        return None;
                    }
                    before(&c);
                    let out = c.shrink_with(&[LOST], mode, config).and_then(|small| {
                        let got = sum(&small, r as u64 + 1)?;
                        let parent_aborted =
                            matches!(c.poll_async_error(), Err(Error::Aborted { .. }));
                        let rv = small.revoke().err().map(|e| e.to_string());
                        Ok((small.rank(), small.world_size(), got, parent_aborted, rv))
                    });
                    Some(out)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn survivors(out: Vec<Option<Result<Seen, Error>>>) -> Vec<Seen> {
    out.into_iter()
        .enumerate()
        .filter(|(r, _)| *r != LOST)
        .map(|(r, o)| o.unwrap().unwrap_or_else(|e| panic!("rank {r}: {e}")))
        .collect()
}

/// The fake's call counters are per process: these tests run one at a time, so that one
/// test's calls (two of them revoke on NCCL 2.28) never land between another's counts.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

isolated! {
    #[test]
    fn shrink_uses_the_library_where_it_can_and_re_forms_where_it_cannot() {
        let _one = serial();
        std::env::set_var("FAKE_NCCL_BARRIER_WORLDS", "1");
        std::env::set_var("UNICOMM_TIMEOUT_MS", "3000");
        let path = fake("nccl228");
        // SAFETY: the fake, loaded by the runs anyway: held so its counters live across them.
        let _held = unsafe { libloading::Library::new(&path) }.unwrap();
        let count = |n: &str| calls(&path, n);

        // 1. NCCL 2.28.9, default mode: ncclCommShrink, the parent still usable; revoke works.
        let (shrinks, inits, revokes) = (
            count("ncclCommShrink"),
            count("ncclCommInitRank"),
            count("ncclCommRevoke"),
        );
        let seen = survivors(run("nccl228", ShrinkMode::Default, false, |_| {}));
        assert_eq!(
            seen,
            vec![(0, 2, 1 + 3, false, None), (1, 2, 1 + 3, false, None)]
        );
        // (NCCL's default mode leaves the parent usable: not aborted.)
        assert_eq!(count("ncclCommShrink") - shrinks, 2);
        assert_eq!(
            count("ncclCommInitRank") - inits,
            W as i32,
            "only the parents' inits"
        );
        assert_eq!(count("ncclCommRevoke") - revokes, 2);

        // 2. Abort mode: NCCL's flag, then the parent is aborted (not destroyed).
        let aborts = count("ncclCommShrink:abort");
        let seen = survivors(run("nccl228", ShrinkMode::Abort, false, |_| {}));
        assert!(seen.iter().all(|s| s.2 == 4 && s.3), "{seen:?}");
        assert_eq!(count("ncclCommShrink:abort") - aborts, 2);

        // 3. Re-forming asked for: no ncclCommShrink; a fresh communicator of the survivors.
        let (shrinks, inits) = (count("ncclCommShrink"), count("ncclCommInitRank"));
        let seen = survivors(run("nccl228", ShrinkMode::Reform, true, |_| {}));
        let got: Vec<_> = seen.iter().map(|s| (s.0, s.1, s.2, s.3)).collect();
        assert_eq!(got, [(0, 2, 4, true), (1, 2, 4, true)]);
        assert_eq!(count("ncclCommShrink"), shrinks);
        assert_eq!(count("ncclCommInitRank") - inits, (W + 2) as i32);

        // 4. A parent that already failed (aborted, as a deadline does): re-formed even where
        //    ncclCommShrink exists (it needs a live parent).
        let shrinks = count("ncclCommShrink");
        let seen = survivors(run("nccl228", ShrinkMode::Default, true, |c| {
            c.abort().unwrap()
        }));
        assert!(seen.iter().all(|s| s.2 == 4), "{seen:?}");
        assert_eq!(count("ncclCommShrink"), shrinks);

        // 5. Nowhere to meet (init_rank without a rejoin channel), re-forming needed: the
        //    typed refusal names the way out.
        let out = run("nccl228", ShrinkMode::Reform, false, |_| {});
        for o in out.into_iter().flatten() {
            match o {
                Err(Error::Unsupported { what, needs, .. }) => {
                    assert!(
                        what.contains("re-forming") && needs.contains("set_rejoin"),
                        "{needs}"
                    )
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_library_without_ncclcommshrink_re_forms_and_revoke_names_its_version() {
        let _one = serial();
        std::env::set_var("FAKE_NCCL_BARRIER_WORLDS", "1");
        let path = fake("nccl217");
        // SAFETY: as above.
        let _held = unsafe { libloading::Library::new(&path) }.unwrap();
        let inits = calls(&path, "ncclCommInitRank");
        let seen = survivors(run("nccl217", ShrinkMode::Default, true, |_| {}));
        for s in &seen {
            assert_eq!((s.1, s.2, s.3), (2, 4, true), "{seen:?}");
            let rv = s.4.as_deref().unwrap_or("");
            assert!(rv.contains("2.28.7"), "{rv}");
        }
        assert_eq!(calls(&path, "ncclCommInitRank") - inits, (W + 2) as i32);
    }

    #[test]
    fn rccl_without_ncclcommshrink_re_forms() {
        let _one = serial();
        std::env::set_var("FAKE_NCCL_BARRIER_WORLDS", "1");
        let path = fake("rccl-old");
        // SAFETY: as above.
        let _held = unsafe { libloading::Library::new(&path) }.unwrap();
        let seen = survivors(run("rccl-old", ShrinkMode::Default, true, |_| {}));
        for s in &seen {
            assert_eq!((s.1, s.2, s.3), (2, 4, true), "{seen:?}");
            assert!(s.4.as_deref().unwrap_or("").contains("RCCL"), "{:?}", s.4);
        }
    }

    /// NCCL's rule: a non-blocking communicator is used only once it settled. A non-blocking
    /// child of a blocking parent is settled by the shrink itself (polled until it leaves
    /// ncclInProgress), as a split's is.
    #[test]
    fn a_non_blocking_shrunk_child_of_a_blocking_parent_is_settled_before_it_is_returned() {
        let _one = serial();
        std::env::set_var("FAKE_NCCL_BARRIER_WORLDS", "1");
        let path = fake("nccl228");
        // SAFETY: as above.
        let _held = unsafe { libloading::Library::new(&path) }.unwrap();
        let polls = calls(&path, "ncclCommGetAsyncError");
        let config = CommConfig {
            blocking: Some(false),
            ..CommConfig::default()
        };
        let seen = survivors(run_with(
            "nccl228",
            ShrinkMode::Default,
            false,
            |_| {},
            &config,
        ));
        assert!(seen.iter().all(|s| s.2 == 4), "{seen:?}");
        // Each survivor's child answered ncclInProgress three times before the shrink returned.
        assert!(
            calls(&path, "ncclCommGetAsyncError") - polls >= 2 * 4,
            "{} polls",
            calls(&path, "ncclCommGetAsyncError") - polls
        );
    }
}
