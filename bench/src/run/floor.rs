//! `--floor`: the floors one GPU has, timed as the kernels are timed (`iters` operations
//! captured into one CUDA graph, launched once to upload it, then `launches` times back to
//! back between device events, per operation): an empty kernel node of the module unicomm's
//! symmetric kernels live in (what a launch costs before it does anything) and a
//! device-to-device copy of each size (the bytes a world-1 all-reduce must read and write).
//! The CUDA backend only.

use anyhow::{bail, Context};
use cudarc::driver::{CudaGraph, CudaStream};
use std::sync::Arc;
use unicomm::AnyStream;

use super::drive::cuda_stream;
use super::modes::{captured, copy_graph};

/// The floors at one size.
#[derive(Debug, Clone, Copy)]
pub struct Floor {
    /// Bytes of the operation.
    pub bytes: usize,
    /// An empty kernel node, per launch (us).
    pub empty_us: f64,
    /// A device-to-device copy of `bytes`, per copy (us).
    pub copy_us: f64,
}

/// Per operation of `g` (`iters` of them): the median over `launches` launches (us).
fn timed(
    cs: &Arc<CudaStream>,
    g: &CudaGraph,
    iters: usize,
    launches: usize,
) -> anyhow::Result<f64> {
    let err = |what: &'static str| move |e| anyhow::anyhow!("{what}: {e:?}");
    g.launch().map_err(err("cuGraphLaunch"))?;
    // Events that time (cudarc's default event has timing off).
    let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut marks = vec![cs.record_event(timing).map_err(err("cuEventRecord"))?];
    for _ in 0..launches {
        g.launch().map_err(err("cuGraphLaunch"))?;
        marks.push(cs.record_event(timing).map_err(err("cuEventRecord"))?);
    }
    cs.synchronize().map_err(err("cuStreamSynchronize"))?;
    let mut per: Vec<f64> = marks
        .windows(2)
        .map(|p| {
            p[0].elapsed_ms(&p[1])
                .map(|ms| f64::from(ms) * 1e3 / iters as f64)
        })
        .collect::<Result<_, _>>()
        .map_err(err("cuEventElapsedTime"))?;
    per.sort_by(f64::total_cmp);
    Ok(per[per.len() / 2])
}

/// The floors at each of `sizes` on `st`, a stream of device `dev` of the CUDA backend.
pub(crate) fn floors(
    st: &AnyStream,
    dev: usize,
    sizes: &[usize],
    iters: usize,
    launches: usize,
) -> anyhow::Result<Vec<Floor>> {
    let AnyStream::Nccl(s) = st else {
        bail!("--floor needs the CUDA backend");
    };
    let cs = cuda_stream(st)?;
    let rt = unicomm::nccl::cuda()?;
    let (iters, launches) = (iters.max(1), launches.max(1));
    let empty = captured(&cs, iters, || Ok(rt.launch_empty(dev, s.inner())?))
        .context("capturing the empty kernel")?;
    let empty_us = timed(&cs, &empty, iters, launches)?;
    let most = sizes.iter().copied().max().unwrap_or(0).max(1);
    let src = cs
        .alloc_zeros::<u8>(most)
        .map_err(|e| anyhow::anyhow!("cuMemAlloc: {e:?}"))?;
    let mut dst = cs
        .alloc_zeros::<u8>(most)
        .map_err(|e| anyhow::anyhow!("cuMemAlloc: {e:?}"))?;
    let mut out = Vec::new();
    for &bytes in sizes {
        let g = copy_graph(&cs, iters, &src, &mut dst, bytes)
            .context("capturing the device-to-device copy")?;
        out.push(Floor {
            bytes,
            empty_us,
            copy_us: timed(&cs, &g, iters, launches)?,
        });
    }
    Ok(out)
}
