//! The all-reduce op's cost per call: unicomm-candle's `AllReduce` against candle's own op
//! over cudarc's NCCL (the op of candle's multi-process Llama example, which mistral.rs,
//! candle-vllm and vllm.rs copy), on one GPU (world 1), the same bf16 tensor, candle's
//! stream, in one run. Trials alternate between the two ops (and which goes first); printed:
//! the median over the trials of the time per call with the GPU's work included, and of the
//! host time per call before the synchronisation; then the median of the paired differences
//! (each trial's unicomm run against candle's beside it, which cancels the host's drift
//! between trials, as the `overhead` benchmark of unicomm-nccl does) with their quartiles.
//!
//! `allreduce_cost` on a GPU machine (built with `--features bench-candle-nccl`, which the
//! GPU bundle does).

use std::time::Instant;

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::{CudaStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};
use cudarc::nccl::{Comm, Id, ReduceOp};
use unicomm_candle::{AllReduce, Communicator, Reduce};

const TRIALS: usize = 21;

/// candle's op as its multi-process Llama example writes it: cudarc's NCCL communicator,
/// an uninitialised output, bf16 only, contiguous input from offset 0 only.
struct CandleAllReduce {
    comm: Comm,
}

impl CustomOp1 for CandleAllReduce {
    fn name(&self) -> &'static str {
        "candle-allreduce"
    }
    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, Shape)> {
        candle_core::bail!("candle's op never runs on the CPU")
    }
    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let n = l.shape().elem_count();
        let dev = s.device().clone();
        let src = s.as_cuda_slice::<unicomm::bf16>()?;
        match l.contiguous_offsets() {
            Some((0, e)) if e == src.len() => {}
            _ => candle_core::bail!("input has to be contiguous"),
        }
        // SAFETY: NCCL writes every element before anything reads it (candle's stream).
        let mut dst = unsafe { dev.alloc::<unicomm::bf16>(n) }?;
        self.comm
            .all_reduce(src, &mut dst, &ReduceOp::Sum)
            .map_err(candle_core::Error::debug)?;
        Ok((CudaStorage::wrap_cuda_slice(dst, dev), l.shape().clone()))
    }
}

fn median(v: Vec<f64>) -> f64 {
    quantile(v, 0.5)
}

fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn main() -> anyhow::Result<()> {
    let dev = Device::new_cuda(0)?;
    let cdev = match &dev {
        Device::Cuda(c) => c.clone(),
        _ => anyhow::bail!("no CUDA device"),
    };
    let ours = Communicator::new(unicomm::local_comms_n(unicomm::Vendor::Cuda, Some(1))?.remove(0));
    let theirs = CandleAllReduce {
        comm: Comm::from_rank(
            cdev.cuda_stream(),
            0,
            1,
            Id::new().map_err(|e| anyhow::anyhow!("{e:?}"))?,
        )
        .map_err(|e| anyhow::anyhow!("{e:?}"))?,
    };
    let caps = ours.comm().capabilities();
    println!(
        "# world 1, bf16, NCCL {} at {}",
        caps.version, caps.library_path
    );
    println!(
        "# {:>8} {:>12} {:>12} {:>9} {:>12} {:>14} {:>10} {:>14}",
        "bytes",
        "unicomm_us",
        "candle_us",
        "delta_us",
        "uni_host_us",
        "candle_host_us",
        "paired_us",
        "paired_q1..q3"
    );
    for (bytes, iters) in [(8usize << 10, 2000usize), (1 << 20, 500)] {
        let x = Tensor::ones(bytes / 2, DType::BF16, &dev)?;
        let op = AllReduce::new(ours.clone(), Reduce::Sum);
        // Both results are checked once: every element is 1 (a world of one).
        for y in [x.apply_op1_no_bwd(&op)?, x.apply_op1_no_bwd(&theirs)?] {
            let sum = y.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()?;
            anyhow::ensure!(sum == (bytes / 2) as f32, "a wrong sum: {sum}");
        }
        let trial = |uni: bool| -> anyhow::Result<(f64, f64)> {
            let t = Instant::now();
            for _ in 0..iters {
                let y = if uni {
                    x.apply_op1_no_bwd(&op)?
                } else {
                    x.apply_op1_no_bwd(&theirs)?
                };
                drop(y);
            }
            let host = t.elapsed().as_secs_f64();
            cdev.synchronize()?;
            let per = |s: f64| s * 1e6 / iters as f64;
            Ok((per(t.elapsed().as_secs_f64()), per(host)))
        };
        trial(true)?;
        trial(false)?;
        let (mut u, mut c, mut uh, mut ch) = (vec![], vec![], vec![], vec![]);
        for t in 0..TRIALS {
            for uni in [t % 2 == 0, t % 2 == 1] {
                let (all, host) = trial(uni)?;
                if uni {
                    u.push(all);
                    uh.push(host);
                } else {
                    c.push(all);
                    ch.push(host);
                }
            }
        }
        let paired: Vec<f64> = u.iter().zip(&c).map(|(a, b)| a - b).collect();
        let (q1, q2, q3) = (
            quantile(paired.clone(), 0.25),
            quantile(paired.clone(), 0.5),
            quantile(paired, 0.75),
        );
        let (u, c) = (median(u), median(c));
        println!(
            "  {bytes:>8} {u:>12.2} {c:>12.2} {:>9.3} {:>12.2} {:>14.2} {q2:>10.3} {:>14}",
            u - c,
            median(uh),
            median(ch),
            format!("{q1:.3}..{q3:.3}")
        );
    }
    Ok(())
}
