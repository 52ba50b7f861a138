//! Per-call options (NCCL 2.32's `ncclCollConfig_t`): where the library has them, the
//! collectives of a scope run with them and stay exact (all-reduce, all-gather, reduce-
//! scatter, broadcast), and a call NCCL has no per-call options for is refused, not run
//! without them; where it predates them, `Unsupported` naming 2.32.

use unicomm_core::{
    each_rank, Algorithm, Algorithms, CallOptions, Collective, Comm, CtaPolicy, DeviceStream,
    Error, ReduceOp, Result,
};

/// Options every library that has them takes on any machine: ring (every topology has it,
/// also one rank), at most 2 CTAs, the efficiency policy, a profiler tag.
pub fn portable_options() -> CallOptions {
    CallOptions {
        max_ctas: Some(2),
        algorithms: Some(Algorithms::Only(vec![Algorithm::Ring])),
        force_algorithms: Some(false),
        cta_policy: Some(CtaPolicy::Efficiency),
        profiler_tag: Some(0x5eed),
        ..CallOptions::default()
    }
}

/// What each rank saw: whether the library took the options (exact results checked).
pub fn call_options<C: Collective>(comms: &[Comm<C>]) -> Result<Vec<bool>> {
    each_rank(comms, |c| -> Result<bool> {
        let (r, w) = (c.rank(), c.world_size());
        let st = c.create_stream()?;
        let n = 1024;
        let mut a = c.upload(&vec![(r + 1) as f32; n], &st)?;
        let mut g = c.alloc::<f32>(n * w)?;
        let mut s = c.alloc::<f32>(n)?;
        let ran = c.with_options(&portable_options(), || {
            c.all_reduce_in_place(&mut a, ReduceOp::Sum, &st)?;
            c.all_gather(&a, &mut g, &st)?;
            c.reduce_scatter(&g, &mut s, ReduceOp::Sum, &st)?;
            c.broadcast_in_place(&mut a, 0, &st)
        });
        match ran {
            Ok(()) => {}
            // Before NCCL 2.32, or a library of its version that lacks the entry points:
            // refused before the library, so the world is still in step.
            Err(Error::Unsupported { what, needs, .. })
                if needs.contains("2.32") || what.contains("Config") =>
            {
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
        st.synchronize()?;
        let sum = (w * (w + 1) / 2) as f32;
        if a.copy_to_host(&st)?.iter().any(|&v| v != sum) {
            return Err(wrong(
                "an all-reduce or broadcast with options is not exact",
            ));
        }
        if s.copy_to_host(&st)?.iter().any(|&v| v != sum * w as f32) {
            return Err(wrong(
                "an all-gather or reduce-scatter with options is not exact",
            ));
        }
        match c.with_options(&portable_options(), || c.barrier(&st)) {
            Err(Error::InvalidArgument { reason, .. })
                if reason.contains("no per-call options") => {}
            other => return Err(wrong(&format!("a barrier with options: {other:?}"))),
        }
        launch_marked(c, &st, &mut a)?;
        Ok(true)
    })
}

fn wrong(what: &str) -> Error {
    Error::invalid("call options", what)
}

/// An all-reduce with a launch marker: another stream waiting on the marker runs once the
/// all-reduce launched, and the marker is reached by the time the all-reduce ended.
fn launch_marked<C: Collective>(
    c: &Comm<C>,
    st: &C::Stream,
    a: &mut unicomm_core::Buffer<f32, C>,
) -> Result<()> {
    let m = unicomm_core::LaunchMarker::new(st)?;
    let o = unicomm_core::CallOptions {
        launch_marker: Some(m.clone()),
        ..portable_options()
    };
    let other = c.create_stream()?;
    c.with_options(&o, || c.all_reduce_in_place(a, ReduceOp::Max, st))?;
    other.wait(m.marker())?;
    other.synchronize()?;
    st.synchronize()?;
    match m.marker().inner().reached() {
        Some(false) => Err(wrong("a launch marker not reached after its call ended")),
        _ => Ok(()),
    }
}
