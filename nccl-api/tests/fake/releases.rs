//! The same program against fake NCCLs with the symbol sets of 2.28.9, 2.30.7 and 2.32.3:
//! each call of 2.29-2.32 runs where the loaded release has it and is `Unsupported`
//! naming its release where not, before any library call. 2.30 has the sleep mode, the
//! properties, growing, the one-sided calls and the peer pointers, but not the
//! per-collective configuration (2.32). In a process of its own (the fake's counters).

use crate::common::{calls, comm, fake, flavors};
use unicomm_core::{CallOptions, Error, ReduceOp, Version};

/// Which of the 2.29-2.32 calls the loaded library ran: (suspend, properties, grow id,
/// signal, peer pointer, per-call options), each `Some(release named)` where refused.
fn probe(feature: &str) -> (Version, Vec<Option<String>>) {
    let path = fake(feature);
    let c = comm(flavors(false, false), &path);
    let st = c.create_stream().unwrap();
    let named = |r: unicomm_core::Result<()>| match r {
        Ok(()) => None,
        Err(Error::Unsupported { needs, .. }) => Some(needs),
        Err(e) => panic!("{feature}: {e:?}"),
    };
    let w = c.register_window(c.alloc::<f32>(4).unwrap()).unwrap();
    let mut b = c.alloc::<f32>(4).unwrap();
    let options = CallOptions {
        max_ctas: Some(2),
        ..CallOptions::default()
    };
    let configs = calls(&path, "ncclAllReduceConfig");
    let seen = vec![
        named(c.suspend().and_then(|()| c.resume())),
        named(c.properties().map(drop)),
        named(c.grow_id().map(drop)),
        named(c.signal(0, &st).and_then(|()| {
            c.wait_signal(&[unicomm_core::SignalWait::new(0, 1)], &st)?;
            st.synchronize()
        })),
        named(w.peer_address(0).map(drop)),
        named(c.with_options(&options, || {
            c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)
        })),
    ];
    if seen[5].is_some() {
        assert_eq!(calls(&path, "ncclAllReduceConfig"), configs, "{feature}");
    }
    (c.capabilities().version, seen)
}

isolated! {
    #[test]
    fn each_new_call_runs_from_its_release_and_names_it_before() {
        let (v, seen) = probe("nccl228");
        assert_eq!(v, Version::new(2, 28, 9));
        let want = ["2.29.7", "2.29.2", "2.29.2", "2.29.2", "2.29.2", "2.32"];
        for (s, w) in seen.iter().zip(want) {
            assert!(
                s.as_deref().is_some_and(|s| s.contains(w)),
                "2.28: {s:?} for {w}"
            );
        }
        let (v, seen) = probe("nccl230");
        assert_eq!(v, Version::new(2, 30, 7));
        assert!(seen[..5].iter().all(Option::is_none), "2.30: {seen:?}");
        assert!(
            seen[5].as_deref().is_some_and(|s| s.contains("2.32")),
            "2.30: {seen:?}"
        );
        let (v, seen) = probe("nccl232");
        assert_eq!(v, Version::new(2, 32, 3));
        assert!(seen.iter().all(Option::is_none), "2.32: {seen:?}");
    }
}
