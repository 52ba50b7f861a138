//! unicomm's symmetric memory and kernels on the GPU (the PTX of backend-nccl/kernels):
//! every algorithm exact over f32, f16, bf16 by sum, max and min, eagerly and over 10,000
//! graph replays with new data before each; the fused all-reduce + residual add + RMSNorm
//! against the host's unfused sequence; misuse refused before any launch; the abort word
//! ending a kernel that waits. One communicator per GPU here; two processes on one GPU run
//! the same functions through `rank_conformance` (NCCL's multi-rank mode).
#![cfg(any(feature = "nccl", feature = "rccl"))]

use unicomm_core::symmetric::{SymmetricAlgorithm, SymmetricOptions};
use unicomm_core::{bf16, f16, Error, ReduceOp, Result};
use unicomm_gpu_tests::{self as t, GPU};

/// Exact at the GPUs' world on small integers, eagerly and over 10,000 replays (f32),
/// fewer for the 16-bit types; never `Unsupported` on CUDA.
#[test]
fn every_algorithm_is_exact_eagerly_and_over_ten_thousand_replays() -> Result<()> {
    let cs = GPU.comms(t::world()?)?;
    // The cost of one replay's round (a host write, the launch, a host read) first, printed:
    // 10,000 of them must fit the test's time.
    let t0 = std::time::Instant::now();
    let seen = unicomm_conformance::symmetric_all_reduce::<f32, _>(&cs, 4099, 100)?;
    assert!(
        seen.iter().all(|&s| s),
        "symmetric memory refused: {seen:?}"
    );
    println!(
        "symmetric all-reduce: 3 x (6 eager + 100 replayed) rounds in {:.1} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
    let seen = unicomm_conformance::symmetric_all_reduce::<f32, _>(&cs, 4099, 10_000)?;
    assert!(
        seen.iter().all(|&s| s),
        "symmetric memory refused: {seen:?}"
    );
    let seen = unicomm_conformance::symmetric_all_reduce::<bf16, _>(&cs, 1024, 200)?;
    assert!(seen.iter().all(|&s| s), "{seen:?}");
    let seen = unicomm_conformance::symmetric_all_reduce::<f16, _>(&cs, 7, 200)?;
    assert!(seen.iter().all(|&s| s), "{seen:?}");
    Ok(())
}

/// The fused norm against the host's unfused sequence, eagerly and over 10,000 graph replays
/// of each algorithm in f32 (20 in bf16): the residual exact, the output within 1e-5
/// relative in f32 (the block's sum of squares is in another order than the host's) and one
/// 16-bit rounding step in bf16.
#[test]
fn the_fused_norm_matches_the_unfused_sequence() -> Result<()> {
    let cs = GPU.comms(t::world()?)?;
    let seen = unicomm_conformance::symmetric_rms_norm::<f32, _>(&cs, 4096, 3, 1e-5, 10_000)?;
    assert!(seen.iter().all(|&s| s), "{seen:?}");
    let seen = unicomm_conformance::symmetric_rms_norm::<bf16, _>(&cs, 1024, 2, 1.0 / 128.0, 20)?;
    assert!(seen.iter().all(|&s| s), "{seen:?}");
    Ok(())
}

/// What no kernel may be launched for: a count past the allocation, Lamport without its
/// workspace, a type the kernels lack, a call inside a group.
#[test]
fn misuse_is_refused_before_any_launch() -> Result<()> {
    let cs = GPU.comms(1)?;
    let c = &cs[0];
    let st = c.create_stream()?;
    let sym = c.alloc_symmetric::<f32>(64)?;
    let mut out = c.alloc::<f32>(128)?;
    let r = c.all_reduce_symmetric(
        &sym,
        65,
        &mut out,
        SymmetricOptions::new(ReduceOp::Sum, SymmetricAlgorithm::OneShot),
        &st,
    );
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    let r = c.all_reduce_symmetric(
        &sym,
        8,
        &mut out,
        SymmetricOptions::new(ReduceOp::Sum, SymmetricAlgorithm::Lamport),
        &st,
    );
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    let ints = c.alloc_symmetric::<i32>(8)?;
    let mut iout = c.alloc::<i32>(8)?;
    let r = c.all_reduce_symmetric(
        &ints,
        8,
        &mut iout,
        SymmetricOptions::new(ReduceOp::Sum, SymmetricAlgorithm::OneShot),
        &st,
    );
    assert!(matches!(r, Err(Error::Unsupported { .. })), "{r:?}");
    let r = c.group(|| {
        c.all_reduce_symmetric(
            &sym,
            8,
            &mut out,
            SymmetricOptions::new(ReduceOp::Sum, SymmetricAlgorithm::OneShot),
            &st,
        )
    });
    assert!(r.is_err(), "a symmetric kernel inside a group: {r:?}");
    st.synchronize()
}

/// After an abort no kernel is launched on the communicator's symmetric memory: `Aborted`
/// (a kernel waiting for a peer ended by the abort word runs in the multi-rank faults).
#[test]
fn after_an_abort_no_kernel_is_launched() -> Result<()> {
    let cs = GPU.comms(1)?;
    let c = &cs[0];
    let st = c.create_stream()?;
    let sym = c.alloc_symmetric::<f32>(256)?;
    let mut out = c.alloc::<f32>(256)?;
    let sum = SymmetricOptions::new(ReduceOp::Sum, SymmetricAlgorithm::OneShot);
    c.all_reduce_symmetric(&sym, 256, &mut out, sum, &st)?;
    st.synchronize()?;
    c.abort()?;
    let r = c.all_reduce_symmetric(&sym, 256, &mut out, sum, &st);
    assert!(matches!(r, Err(Error::Aborted { .. })), "{r:?}");
    Ok(())
}

/// The median cost of each phase of a replay's round, printed and bounded: a host write of
/// 16 KiB, a host read, a symmetric kernel eagerly and from a graph, NCCL's all-reduce, each
/// to an idle stream. The 10,000-replay test above is three of these rounds per replay, so a
/// phase of milliseconds (an H100 took about 13 ms a round) makes it miss its time.
#[test]
fn each_phase_of_a_replay_s_round_costs_under_two_milliseconds() -> Result<()> {
    use unicomm_core::graph::Graph;
    let cs = GPU.comms(1)?;
    let c = &cs[0];
    let st = c.create_stream()?;
    let n = 4099;
    let sym = c.alloc_symmetric::<f32>(n)?;
    let mut out = c.alloc::<f32>(n)?;
    let mut plain = c.alloc::<f32>(n)?;
    let replayed = c.alloc::<f32>(n)?;
    let host = vec![1.0f32; n];
    let sum = SymmetricOptions::new(ReduceOp::Sum, SymmetricAlgorithm::OneShot);
    let graph = Graph::capture(&st, |g| g.all_reduce_symmetric(c, &sym, n, &replayed, sum))?;
    fn median(mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        let mut ts = Vec::with_capacity(100);
        for _ in 0..100 {
            let t = std::time::Instant::now();
            f()?;
            ts.push(t.elapsed().as_secs_f64() * 1e6);
        }
        ts.sort_by(f64::total_cmp);
        Ok(ts[50])
    }
    let phases = [
        ("host write", median(|| sym.write_from_host(&host, &st))?),
        ("host read", median(|| out.copy_to_host(&st).map(drop))?),
        (
            "symmetric eager + sync",
            median(|| {
                c.all_reduce_symmetric(&sym, n, &mut out, sum, &st)?;
                st.synchronize()
            })?,
        ),
        (
            "graph launch + sync",
            median(|| {
                graph.launch(&st)?;
                st.synchronize()
            })?,
        ),
        (
            "NCCL all_reduce + sync",
            median(|| {
                c.all_reduce_in_place(&mut plain, ReduceOp::Sum, &st)?;
                st.synchronize()
            })?,
        ),
    ];
    for (what, us) in phases {
        println!("a replay round's phase: {what}: median {us:.1} us");
    }
    for (what, us) in phases {
        assert!(us < 2000.0, "{what}: median {us:.0} us");
    }
    drop(graph);
    Ok(())
}
