//! The mock standing for a target (an NCCL version on a compute capability, RCCL on MI300)
//! refuses what that target refuses, as `Unsupported` in the NCCL-API backends' words
//! (`Target`, the rules both share), and still runs everything the target runs.

use unicomm_core::{CommConfig, DeviceStream, Error, ReduceOp, Result, F8E4M3};
use unicomm_mock::{local_comms_with, MockComm, MockConfig, Target};

fn comms(world: usize, target: &str) -> Vec<unicomm_core::Comm<MockComm>> {
    let config = MockConfig {
        target: Target::parse(target).unwrap(),
        ..MockConfig::default()
    };
    local_comms_with(world, config).unwrap()
}

/// `what` and `needs` of an `Unsupported` (where it was found differs: the mock is not a file).
fn refusal(r: Result<()>) -> (String, String) {
    match r {
        Err(Error::Unsupported { what, needs, .. }) => (what, needs),
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

/// An fp8 all-reduce of `op` on a world of one rank, and an fp8 all-gather (moving bytes).
fn fp8_on_one_rank(target: &str, op: ReduceOp) -> (Result<()>, Result<()>) {
    let c = &comms(1, target)[0];
    let st = c.create_stream().unwrap();
    let x = [F8E4M3::from_f32(1.0), F8E4M3::from_f32(2.0)];
    let mut a = c.alloc::<F8E4M3>(2).unwrap();
    a.copy_from_host(&x, &st).unwrap();
    let mut b = c.alloc::<F8E4M3>(2).unwrap();
    let reduced = c.all_reduce(&a, &mut b, op, &st);
    let moved = c.all_gather(&a, &mut b, &st);
    st.synchronize().unwrap();
    assert_eq!(
        b.copy_to_host(&st).unwrap(),
        x,
        "moving fp8 works on every target"
    );
    (reduced, moved)
}

// NCCL added fp8 reductions in 2.24.3, on sm90 and newer; RCCL's MI300 fp8 is FNUZ.
#[test]
fn fp8_reductions_are_refused_where_the_target_refuses_them_and_moves_work() {
    let (ok, moved) = fp8_on_one_rank("nccl-2.28.9-sm90", ReduceOp::Sum);
    assert!(ok.is_ok() && moved.is_ok());
    for (target, words) in [
        ("nccl-2.23.4", "NCCL >= 2.24.3"),
        ("nccl-2.28.9-sm80", "compute capability 9.0"),
        ("rccl-2.22.3", "e4m3/e5m2"),
    ] {
        let (r, moved) = fp8_on_one_rank(target, ReduceOp::Max);
        assert!(moved.is_ok());
        let want = refusal(Target::parse(target).unwrap().fp8_reduce());
        let got = refusal(r);
        assert_eq!(got, want, "{target}: the NCCL-API backends' words");
        assert!(got.1.contains(words), "{target}: {got:?}");
    }
}

// NCCL 2.28.9's one-rank path has no pre-multiplied fp8 kernel (measured on 1x H200): the
// default target, the newest NCCL, refuses it on one rank and runs it on two.
#[test]
fn the_newest_nccl_refuses_an_fp8_average_on_one_rank_only() {
    let (r, _) = fp8_on_one_rank("nccl-2.28.9", ReduceOp::Avg);
    let (what, needs) = refusal(r);
    assert!(
        what.contains("on one rank") && needs.contains("two or more"),
        "{what}"
    );
    let comms = local_comms_with(2, MockConfig::default()).unwrap();
    unicomm_core::each_rank(&comms, |c| {
        let st = c.create_stream()?;
        let mut a = c.alloc::<F8E4M3>(2)?;
        a.copy_from_host(&[F8E4M3::from_f32(2.0); 2], &st)?;
        c.all_reduce_in_place(&mut a, ReduceOp::Avg, &st)?;
        assert_eq!(a.copy_to_host(&st)?, vec![F8E4M3::from_f32(2.0); 2]);
        Ok::<(), Error>(())
    })
    .unwrap();
}

// Symmetric windows came with NCCL 2.27, registration with 2.19.
#[test]
fn windows_and_registration_follow_the_targets_floors() {
    let comms = comms(2, "nccl-2.26.5");
    let caps = comms[0].capabilities();
    assert!(!caps.windows && caps.registration);
    let out = unicomm_core::each_rank(&comms, |c| {
        let buf = c.alloc::<f32>(8)?;
        let w = c.register_window(buf).map(drop).map_err(Error::from);
        let buf = c.alloc::<f32>(8)?;
        let r = c.register(buf).map(drop).map_err(Error::from);
        Ok::<_, Error>((w, r))
    })
    .unwrap();
    for (w, r) in out {
        let (what, needs) = refusal(w);
        assert!(what.contains("ncclCommWindowRegister") && needs == "NCCL >= 2.27.0");
        r.unwrap();
    }
    let old = &comms_one("nccl-2.18.3");
    let buf = old.alloc::<f32>(8).unwrap();
    let (_, needs) = refusal(old.register(buf).map(drop).map_err(Error::from));
    assert_eq!(needs, "NCCL >= 2.19.0");
}

fn comms_one(target: &str) -> unicomm_core::Comm<MockComm> {
    comms(1, target).remove(0)
}

// A configuration field the target's NCCL predates would be ignored by NCCL: refused, as the
// NCCL-API backends refuse it (ncclConfig_t's commName came with 2.27).
#[test]
fn a_configuration_field_the_target_predates_is_refused_at_split() {
    let old = comms(2, "nccl-2.26.5");
    let config = CommConfig {
        comm_name: Some("tp".into()),
        ..CommConfig::default()
    };
    let out = unicomm_core::each_rank(&old, |c| {
        Ok::<_, Error>(c.split_with(Some(0), 0, &config).map(drop))
    })
    .unwrap();
    for r in out {
        let (what, needs) = refusal(r);
        assert!(
            what.contains("commName") && needs.contains("2.27"),
            "{what}"
        );
    }
    // The field the newest NCCL has is taken.
    let newest = comms(2, "nccl-2.28.9");
    let out = unicomm_core::each_rank(&newest, |c| {
        Ok::<_, Error>(c.split_with(Some(0), 0, &config)?.is_some())
    })
    .unwrap();
    assert_eq!(out, vec![true, true]);
}

// The graph modes of NCCL 2.29 (graphUsageMode) and 2.30.5 (graphStreamOrdering): a mock
// standing for NCCL 2.28.9 (the GPU machine's) refuses them by name, one for 2.29 takes
// the first and refuses the second, as one for 2.30.3 does (NCCL resets the field for a
// config of an earlier 2.30), one for 2.30.5 takes both.
#[test]
fn the_graph_modes_follow_the_targets_release() {
    let usage = CommConfig {
        graph_usage_mode: Some(1),
        ..CommConfig::default()
    };
    let ordering = CommConfig {
        graph_stream_ordering: Some(1),
        ..usage.clone()
    };
    for (target, config, field) in [
        ("nccl-2.28.9", &usage, Some("graphUsageMode")),
        ("nccl-2.29.2", &usage, None),
        ("nccl-2.29.2", &ordering, Some("graphStreamOrdering")),
        ("nccl-2.30.3", &ordering, Some("graphStreamOrdering")),
        ("nccl-2.30.5", &ordering, None),
    ] {
        let world = comms(2, target);
        let out = unicomm_core::each_rank(&world, |c| {
            Ok::<_, Error>(c.split_with(Some(0), 0, config).map(drop))
        })
        .unwrap();
        for r in out {
            match field {
                Some(f) => assert!(refusal(r).0.contains(f), "{target}: {f}"),
                None => r.unwrap(),
            }
        }
    }
}

// NCCL 2.28.9's symmetric in-place all-gather corrupts chunks that are not a multiple of 4
// bytes (measured on 2x H200): the mock standing for it refuses it on every rank, at once.
#[test]
fn an_in_place_window_all_gather_of_odd_chunks_is_refused_on_every_rank_at_once() {
    let config = MockConfig {
        timeout: std::time::Duration::from_secs(20),
        ..MockConfig::default()
    };
    let comms = local_comms_with(2, config).unwrap();
    let t = std::time::Instant::now();
    let out = unicomm_core::each_rank(&comms, |c| {
        let st = c.create_stream()?;
        let buf = c.alloc::<unicomm_core::f16>(2)?;
        let mut w = c.register_window(buf)?;
        let r = c.all_gather_in_place(&mut w, &st);
        st.synchronize()?;
        c.deregister_window(w)?;
        Ok::<_, Error>(r)
    })
    .unwrap();
    for r in out {
        let (what, _) = refusal(r);
        assert!(what.contains("2-byte chunks"), "{what}");
    }
    assert!(
        t.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        t.elapsed()
    );
}

/// The same rule as the NCCL-API backends (one function), asked of what the call runs
/// through: an automatic registration's all-gather takes the registered path under the
/// built-in policy, as on NCCL-API, so the same odd chunks gather in place and out of place.
#[test]
fn an_automatic_registrations_all_gather_is_not_refused_as_its_window_is() {
    let comms = local_comms_with(2, MockConfig::default()).unwrap();
    let out = unicomm_core::each_rank(&comms, |c| {
        let st = c.create_stream()?;
        let mut a = c.register_auto(c.alloc::<unicomm_core::f16>(2)?)?;
        let mine = [unicomm_core::f16::from_f32(c.rank() as f32)];
        a.copy_from_host(&[mine[0], mine[0]], &st)?;
        let mut chunk = a.slice_mut(c.rank()..c.rank() + 1)?;
        chunk.copy_from_host(&mine, &st)?;
        c.all_gather_in_place(&mut a, &st)?;
        st.synchronize()?;
        let got = a.copy_to_host(&st)?;
        c.deregister_auto(a)?;
        Ok::<_, Error>(got)
    })
    .unwrap();
    for got in out {
        assert_eq!(got, [0.0f32, 1.0].map(unicomm_core::f16::from_f32));
    }
}
