//! The ranks agree on the automatic policy at their first automatic registration, against
//! the fake NCCL in its barrier-world mode (three ranks on threads, joined with
//! `init_rank` as one rank per process would be; the fake's small all-reduces are real
//! reductions of the world's threads). Ranks whose policies differ would send the same
//! call to different communicators (or the copy engines) and wait for each other until the
//! deadline; instead their registration fails on every rank at once, and succeeds once
//! they agree. In a process of its own (the variables and counters).

use std::time::{Duration, Instant};

use crate::common::{calls, fake, flavors, on_ranks};
use unicomm_core::Error;
use unicomm_nccl_api::policy::Policy;

/// What a rank saw: its first registration's result, then (after every rank set
/// `second`) the second's, and the policy agreed.
type Out = (Result<(), Error>, Result<(), Error>, Option<Policy>);

/// Three ranks; `first(rank)`: the policy a rank sets before its first automatic
/// registration (`None`: the process's, here the built-in defaults); `second`: the policy
/// every rank sets before trying again.
fn run(
    path: &std::path::Path,
    rccl: bool,
    first: fn(usize) -> Option<Policy>,
    second: &Policy,
) -> Vec<Out> {
    on_ranks(flavors(false, rccl), path, 3, |r, c| -> Out {
        if let Some(p) = first(r) {
            c.backend().set_auto_policy(p).unwrap();
        }
        let a = c
            .register_auto(c.alloc::<f32>(64).unwrap())
            .map(|b| drop(c.deregister_auto(b).unwrap()))
            .map_err(|e| e.error);
        if a.is_err() {
            c.backend().set_auto_policy(second.clone()).unwrap();
        }
        let b = c
            .register_auto(c.alloc::<f32>(64).unwrap())
            .map(|b| drop(c.deregister_auto(b).unwrap()))
            .map_err(|e| e.error);
        let agreed = c.backend().auto_policy().cloned();
        if agreed.is_some() {
            // Agreed once: too late to change it.
            assert!(c.backend().set_auto_policy(second.clone()).is_err());
        }
        (a, b, agreed)
    })
}

fn agree(path: &std::path::Path, rccl: bool, windows: &Policy, defaults: &Policy) {
    // The same policy everywhere (the process's): agreed at the first registration, one
    // second communicator per rank.
    let splits = calls(path, "ncclCommSplit");
    for (r, (a, b, agreed)) in run(path, rccl, |_| None, windows).into_iter().enumerate() {
        assert!(a.is_ok() && b.is_ok(), "rank {r}: {a:?} {b:?}");
        assert_eq!(agreed.as_ref(), Some(defaults), "rank {r}");
    }
    assert_eq!(calls(path, "ncclCommSplit") - splits, 3);

    // Rank 2 brings a tune of its own: every rank's registration fails, at once (not at
    // the deadline), naming the policy, and nothing was split; with one policy set on
    // every rank the next registration agrees on it.
    let splits = calls(path, "ncclCommSplit");
    let t = Instant::now();
    let out = run(
        path,
        rccl,
        |r| (r == 2).then(|| Policy::parse("all_reduce max registered\n", "rank 2").unwrap()),
        windows,
    );
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    for (r, (a, b, agreed)) in out.into_iter().enumerate() {
        match a {
            Err(Error::InvalidArgument { argument, reason }) => {
                assert_eq!(argument, "policy", "rank {r}");
                assert!(reason.contains("differs"), "rank {r}: {reason}");
            }
            other => panic!("rank {r}: the first registration gave {other:?}"),
        }
        assert!(b.is_ok(), "rank {r}: {b:?}");
        assert_eq!(agreed.as_ref(), Some(windows), "rank {r}");
    }
    assert_eq!(
        calls(path, "ncclCommSplit") - splits,
        3,
        "split only once agreed"
    );
}

isolated! {
    #[test]
    fn ranks_with_different_policies_fail_together_then_agree() {
        std::env::set_var("FAKE_NCCL_BARRIER_WORLDS", "1");
        // The copy-engine sharing of automatic registrations is not what this tests.
        std::env::set_var("UNICOMM_AUTO_COPY_ENGINE", "0");
        let path = fake("nccl228");
        // SAFETY: the fake's initialisers do nothing; held so its counters outlive the comms.
        let _keep = unsafe { libloading::Library::new(&path) }.unwrap();
        let windows = Policy::parse("all_reduce max window\n", "windows").unwrap();
        let defaults = Policy::current().unwrap().clone();
        assert_ne!(windows.digest(), defaults.digest());
        // NCCL's flavour, then RCCL's (the same code over the other vendor's names).
        for rccl in [false, true] {
            agree(&path, rccl, &windows, &defaults);
        }
    }
}
