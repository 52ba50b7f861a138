//! Expert groups run by NCCL EP, against the fake's NCCL EP (its entry points in the fake
//! NCCL of 2.30 and newer, named by `UNICOMM_NCCL_EP_LIBRARY`): the group's configuration
//! as nccl_ep.h lays it out, a dispatch and a combine reaching the library with the
//! layout's shapes, their results, each recorded once under the library's path, the
//! group destroyed once at drop; an NCCL older than NCCL EP's, a library not found, and a
//! type it does not take refused before any call. Each test in a process of its own (the
//! fake's counters, the variable).

use crate::common::{calls, comm, fake, flavors};
use unicomm_core::{bf16, Error, ExpertConfig, ExpertEngine, ExpertOptions, ExpertTokens};

const CFG: ExpertConfig = ExpertConfig {
    experts: 4,
    max_tokens: 3,
    hidden: 8,
    top_k: 2,
};

/// The fake's record of the last group: `[size, version, experts, max tokens, token
/// bytes, top-k]`.
fn ep_config(path: &std::path::Path) -> [u32; 6] {
    let mut out = [0u32; 6];
    // SAFETY: the fake's control, in the library the test loaded (kept loaded by it).
    unsafe {
        let lib = libloading::Library::new(path).unwrap();
        let f: libloading::Symbol<unsafe extern "C" fn(*mut [u32; 6])> =
            lib.get(b"unicommFakeEpConfig\0").unwrap();
        f(&mut out);
    }
    out
}

fn b(x: f32) -> bf16 {
    bf16::from_f32(x)
}

isolated! {
    #[test]
    fn a_dispatch_and_a_combine_reach_nccl_ep_with_the_layouts_shapes() {
        let path = fake("nccl232");
        std::env::set_var("UNICOMM_NCCL_EP_LIBRARY", &path);
        let c = comm(flavors(false, false), &path);
        let st = c.create_stream().unwrap();
        let g = c.expert_group_with::<bf16>(CFG, ExpertOptions { engine: ExpertEngine::Library, ..Default::default() }).unwrap();
        assert_eq!(g.engine(), ExpertEngine::Library);
        // The V2 structure, the capacities, a token's bytes of bf16.
        assert_eq!(ep_config(&path), [112, 2, 4, 3, 16, 2]);
        assert_eq!(calls(&path, "ncclEpInitHandle"), 1);
        // Three tokens: token 1 routed to expert 3 twice, token 2's second entry none.
        let tokens: Vec<bf16> = (0..24).map(|i| b(i as f32)).collect();
        let ids = [0i32, 3, 3, 3, 1, -1];
        let (tokens, ids) = (c.upload(&tokens, &st).unwrap(), c.upload(&ids, &st).unwrap());
        let mut out = c.alloc::<bf16>(g.received_len()).unwrap();
        let mut counts = c.alloc::<i32>(4).unwrap();
        let outs = ExpertTokens { tokens: &mut out, counts: &mut counts };
        g.dispatch(&tokens, &ids, outs, &st).unwrap();
        assert_eq!(counts.copy_to_host(&st).unwrap(), [1, 1, 0, 3]);
        let got = out.copy_to_host(&st).unwrap();
        let row = |e: usize, s: usize| got[(e * 3 + s) * 8].to_f32();
        // Expert 3's rows in (token, k) order: token 0, token 1 twice.
        assert_eq!([row(0, 0), row(1, 0), row(3, 0), row(3, 1), row(3, 2)], [0., 16., 0., 8., 8.]);
        // Each expert's output: its received rows doubled; the combine weights them.
        let doubled: Vec<bf16> = got.iter().map(|x| b(2.0 * x.to_f32())).collect();
        let expert_out = c.upload(&doubled, &st).unwrap();
        let w = c.upload(&[0.5f32, 0.25, 1.0, 1.0, 0.75, 9.0], &st).unwrap();
        let mut combined = c.alloc::<bf16>(24).unwrap();
        g.combine(&expert_out, &ids, &w, &mut combined, &st).unwrap();
        let y = combined.copy_to_host(&st).unwrap();
        // Token 0: 0.5 * 2x + 0.25 * 2x = 1.5x; token 1: 4x; token 2: 1.5x (the -1 adds 0).
        for (t, f) in [(0usize, 1.5f32), (1, 4.0), (2, 1.5)] {
            assert_eq!(y[t * 8 + 1].to_f32(), f * (t * 8 + 1) as f32, "token {t}");
        }
        let json = c.flight_record("test").unwrap();
        assert_eq!(json.matches("\"path\":\"expert-library\"").count(), 2, "{json}");
        assert_eq!(calls(&path, "ncclEpDispatch"), 1);
        assert_eq!(calls(&path, "ncclEpCombine"), 1);
        drop(g);
        assert_eq!(calls(&path, "ncclEpHandleDestroy"), 1);
        assert_eq!(calls(&path, "ncclEpGroupDestroy"), 1);
    }

    /// The engine case the mock's kernels pass (each expert's tokens as a set, the combine
    /// bit-exact) holds the fake's NCCL EP too, eagerly (the host runtime captures no
    /// graph).
    #[test]
    fn the_engine_case_holds_nccl_ep_to_the_kernels_results() {
        use unicomm_conformance::{expert_engine_matches_the_kernels as engine_case, EngineRun};
        let path = fake("nccl232");
        std::env::set_var("UNICOMM_NCCL_EP_LIBRARY", &path);
        let c = comm(flavors(false, false), &path);
        let cfg = ExpertConfig { experts: 6, max_tokens: 8, hidden: 16, top_k: 4 };
        let seen = engine_case(std::slice::from_ref(&c), ExpertEngine::Library, cfg, 8, 0);
        assert_eq!(seen.unwrap(), [EngineRun::Matched]);
        assert_eq!(calls(&path, "ncclEpDispatch"), 8);
    }

    #[test]
    fn an_nccl_older_than_nccl_eps_is_refused_naming_its_floor() {
        let path = fake("nccl228");
        std::env::set_var("UNICOMM_NCCL_EP_LIBRARY", &path);
        let c = comm(flavors(false, false), &path);
        match c.expert_group_with::<bf16>(CFG, ExpertOptions { engine: ExpertEngine::Library, ..Default::default() }) {
            Err(Error::Unsupported { needs, found, .. }) => {
                assert!(needs.contains("2.30.7") && found.contains("2.28"), "{needs} / {found}")
            }
            other => panic!("{:?}", other.map(|_| ())),
        };
    }

    #[test]
    fn a_missing_library_is_not_found_and_other_types_are_refused_before_it_is_looked_for() {
        let path = fake("nccl232");
        std::env::set_var("UNICOMM_NCCL_EP_LIBRARY", "/nonexistent/libnccl_ep.so");
        let c = comm(flavors(false, false), &path);
        match c.expert_group_with::<f32>(CFG, ExpertOptions { engine: ExpertEngine::Library, ..Default::default() }) {
            Err(Error::Unsupported { needs, .. }) => assert!(needs.contains("bf16"), "{needs}"),
            other => panic!("{:?}", other.map(|_| ())),
        };
        match c.expert_group_with::<bf16>(CFG, ExpertOptions { engine: ExpertEngine::Library, ..Default::default() }) {
            Err(Error::LibraryNotFound { library, tried }) => {
                assert_eq!(library, "NCCL EP");
                assert!(tried[0].contains("UNICOMM_NCCL_EP_LIBRARY"), "{tried:?}");
            }
            other => panic!("{:?}", other.map(|_| ())),
        };
        let packed = ExpertOptions {
            engine: ExpertEngine::Library,
            mode: unicomm_core::ExpertMode::HighThroughput { max_recv: 64 },
            ..Default::default()
        };
        match c.expert_group_with::<bf16>(CFG, packed) {
            Err(Error::Unsupported { needs, .. }) => assert!(needs.contains("low latency"), "{needs}"),
            other => panic!("{:?}", other.map(|_| ())),
        };
        assert_eq!(calls(&path, "ncclEpCreateGroup"), 0);
    }
}
