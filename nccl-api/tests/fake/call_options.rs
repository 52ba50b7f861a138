//! Per-call options (NCCL 2.32's `ncclCollConfig_t`) against fake NCCLs of 2.28 and 2.32:
//! the scope's options reach the library through the `nccl*Config` entry points with the
//! 2.32 layout's header and each field's value, calls outside the scope stay plain, and what
//! cannot carry them is refused before the library (a 2.28 library naming 2.32, a send, the
//! copy-engine path), never run without them. In a process of its own (the fake's counters).

use crate::common::{calls, comm, fake, flavors};
use unicomm_core::{Algorithm, Algorithms, CallOptions, CtaPolicy, Error, ReduceOp};
use unicomm_nccl_api::Api;

fn options() -> CallOptions {
    CallOptions {
        min_ctas: Some(1),
        max_ctas: Some(2),
        algorithms: Some(Algorithms::Only(vec![Algorithm::Ring])),
        force_algorithms: Some(false),
        cta_policy: Some(CtaPolicy::Efficiency),
        profiler_tag: Some(42),
        ..CallOptions::default()
    }
}

const SEEN: &str =
    "collconfig version=23200 min=1 max=2 nvls=- cga=- alg=Ring force=0 policy=1 tag=42 event=-";

/// The launch marker's event reaches `launchCompletionEvent`; inside a group (NCCL launches
/// the group's kernels at its end, after the scope) it is refused before the library.
fn a_launch_marker_reaches_the_library_outside_groups_only() {
    let path = fake("nccl232");
    let c = comm(flavors(false, false), &path);
    let st = c.create_stream().unwrap();
    let mut a = c.alloc::<f32>(16).unwrap();
    let o = CallOptions {
        launch_marker: Some(unicomm_core::LaunchMarker::new(&st).unwrap()),
        ..CallOptions::default()
    };
    let seen =
        "collconfig version=23200 min=- max=- nvls=- cga=- alg=- force=1 policy=- tag=0 event=set";
    c.with_options(&o, || c.all_reduce_in_place(&mut a, ReduceOp::Sum, &st))
        .unwrap();
    assert_eq!(calls(&path, seen), 1);
    let r = c.with_options(&o, || {
        c.group(|| c.all_reduce_in_place(&mut a, ReduceOp::Sum, &st))
    });
    match r {
        Err(Error::InvalidArgument { reason, .. }) => {
            assert!(reason.contains("launch marker"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(calls(&path, seen), 1, "refused before the library");
}

fn the_scopes_options_reach_the_library_and_only_inside_it() {
    let path = fake("nccl232");
    let _kept = Api::open(flavors(false, false), &path).unwrap();
    let c = comm(flavors(false, false), &path);
    let st = c.create_stream().unwrap();
    let mut a = c.alloc::<f32>(64).unwrap();
    a.copy_from_host(&[1.0; 64], &st).unwrap();
    let mut g = c.alloc::<f32>(64).unwrap();
    let plain = calls(&path, "ncclAllReduce");
    c.with_options(&options(), || {
        c.all_reduce_in_place(&mut a, ReduceOp::Sum, &st)?;
        c.all_gather(&a, &mut g, &st)?;
        c.broadcast_in_place(&mut a, 0, &st)
    })
    .unwrap();
    assert_eq!(calls(&path, "ncclAllReduceConfig"), 1);
    assert_eq!(calls(&path, "ncclAllGatherConfig"), 1);
    assert_eq!(calls(&path, "ncclBroadcastConfig"), 1);
    assert_eq!(calls(&path, SEEN), 3, "the fields the library received");
    assert_eq!(
        calls(&path, "ncclAllReduce"),
        plain + 1,
        "run by the config call"
    );
    assert_eq!(g.copy_to_host(&st).unwrap(), vec![1.0; 64]);
    // After the scope: the plain entry point.
    c.all_reduce_in_place(&mut a, ReduceOp::Sum, &st).unwrap();
    assert_eq!(calls(&path, "ncclAllReduceConfig"), 1);
    assert_eq!(calls(&path, "ncclAllReduce"), plain + 2);
}

fn what_cannot_carry_them_is_refused_before_the_library() {
    let path = fake("nccl232");
    let c = comm(flavors(false, false), &path);
    let st = c.create_stream().unwrap();
    let mut a = c.alloc::<f32>(16).unwrap();
    let sends = calls(&path, "ncclSend");
    let r = c.with_options(&options(), || c.send(&a, 0, &st));
    match r {
        Err(Error::InvalidArgument { reason, .. }) => {
            assert!(reason.contains("no per-call options for Send"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(calls(&path, "ncclSend"), sends);
    // The copy-engine path has no NCCL kernel to configure.
    c.set_copy_engine(true).unwrap();
    let mut w = c.register_window(c.alloc::<f32>(16).unwrap()).unwrap();
    let r = c.with_options(&options(), || c.all_to_all(&a, &mut w, &st));
    match r {
        Err(Error::InvalidArgument { reason, .. }) => {
            assert!(reason.contains("copy-engine path"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    c.set_copy_engine(false).unwrap();
    c.deregister_window(w).unwrap();
    // A value NCCL refuses is refused when the scope opens, before any call.
    let bad = CallOptions {
        max_ctas: Some(64),
        ..CallOptions::default()
    };
    let ran = std::cell::Cell::new(false);
    let r = c.with_options(&bad, || {
        ran.set(true);
        c.all_reduce_in_place(&mut a, ReduceOp::Sum, &st)
    });
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    assert!(!ran.get());
}

isolated! {
    /// One test for both cases on the 2.32 fake: its call counters are the process's.
    #[test]
    fn on_nccl_2_32() {
        the_scopes_options_reach_the_library_and_only_inside_it();
        what_cannot_carry_them_is_refused_before_the_library();
        a_launch_marker_reaches_the_library_outside_groups_only();
    }

    #[test]
    fn a_2_28_library_refuses_them_naming_2_32() {
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        let st = c.create_stream().unwrap();
        let mut a = c.alloc::<f32>(16).unwrap();
        let before = calls(&path, "ncclAllReduce");
        let r = c.with_options(&options(), || {
            c.all_reduce_in_place(&mut a, ReduceOp::Sum, &st)
        });
        match r {
            Err(Error::Unsupported { needs, .. }) => assert!(needs.contains("2.32"), "{needs}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            calls(&path, "ncclAllReduce"),
            before,
            "run without its options"
        );
    }
}
