//! An expert-parallel mixture-of-experts layer over unicomm's dispatch and combine
//! ([`ExpertParallelMoe`]): a router's top-k over every expert, this rank's experts (linear,
//! `y = x W^T`), the tokens sent to the ranks holding their experts and the outputs summed
//! back by the router's weights. [`moe_reference`] is the same layer unsharded, which the
//! sharded one equals. f32 tensors staged through the host; on the mock, or on NCCL over
//! unicomm's GPU expert kernels (not yet run on a GPU); elsewhere `Unsupported`.

use candle_core::{DType, Device, Result, Tensor, D};
use parking_lot::Mutex;
use unicomm::{ExpertConfig, ExpertMode, ExpertOptions, ExpertTokens, RankMask};

use crate::comm::{wrap, Communicator};

/// What errors name.
const NAME: &str = "expert_parallel_moe";

/// A mixture-of-experts layer with its experts spread over the ranks (`experts / world` a
/// rank, rank `r` holding experts `r * local ..`), its expert group made once (collectively,
/// as [`Communicator::expert_parallel_moe`]) for up to `max_tokens` tokens a call.
pub struct ExpertParallelMoe<'c> {
    comm: &'c Communicator,
    group: Mutex<unicomm::ExpertGroup<'c, f32>>,
    router: Tensor,
    experts: Vec<Tensor>,
    top_k: usize,
}

impl std::fmt::Debug for ExpertParallelMoe<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ExpertParallelMoe({} local experts, top-{} on {:?})",
            self.experts.len(),
            self.top_k,
            self.comm
        )
    }
}

impl Communicator {
    /// The layer of `router` (`[experts, hidden]`) and `experts` (every expert's `[hidden,
    /// hidden]` weight, the same on every rank: this rank keeps its own), choosing `top_k`
    /// experts a token, for up to `max_tokens` tokens a call. Collective.
    pub fn expert_parallel_moe(
        &self,
        router: &Tensor,
        experts: &[Tensor],
        top_k: usize,
        max_tokens: usize,
    ) -> Result<ExpertParallelMoe<'_>> {
        let mask = RankMask::none(self.world_size());
        self.expert_parallel_moe_masked(router, experts, top_k, max_tokens, mask)
    }

    /// [`expert_parallel_moe`](Self::expert_parallel_moe) on the survivors of a layout whose
    /// masked ranks are gone (this communicator: the layout's unmasked ranks in order, as a
    /// shrink leaves them): each rank keeps its layout place's experts, and a token's
    /// experts on a masked rank contribute nothing (the router's weights are not
    /// renormalised: NCCL EP's and DeepEP's masked combine). Collective.
    pub fn expert_parallel_moe_masked(
        &self,
        router: &Tensor,
        experts: &[Tensor],
        top_k: usize,
        max_tokens: usize,
        mask: RankMask,
    ) -> Result<ExpertParallelMoe<'_>> {
        let options = ExpertOptions {
            mask: Some(mask),
            ..ExpertOptions::default()
        };
        self.expert_parallel_moe_with(router, experts, top_k, max_tokens, options)
    }

    /// [`expert_parallel_moe`](Self::expert_parallel_moe) with its group made as `options`
    /// say: a prefill's high-throughput mode (`ExpertMode::HighThroughput { max_recv }`:
    /// the received tokens packed, at most `max_recv` a rank), the survivors' mask.
    /// Collective.
    pub fn expert_parallel_moe_with(
        &self,
        router: &Tensor,
        experts: &[Tensor],
        top_k: usize,
        max_tokens: usize,
        options: ExpertOptions,
    ) -> Result<ExpertParallelMoe<'_>> {
        let mask = options.mask.unwrap_or(RankMask::none(self.world_size()));
        let (e, hidden) = router.dims2()?;
        if experts.len() != e {
            candle_core::bail!(
                "unicomm-candle {NAME}: {} expert weights for a router of {e}",
                experts.len()
            );
        }
        let config = ExpertConfig {
            experts: e,
            max_tokens,
            hidden,
            top_k,
        };
        let group = self
            .comm()
            .expert_group_with::<f32>(config, options)
            .map_err(|x| wrap(NAME, x))?;
        let local = group.local_experts();
        let at = mask.layout_rank(self.rank()) * local;
        let mine = experts[at..at + local].to_vec();
        Ok(ExpertParallelMoe {
            comm: self,
            group: Mutex::new(group),
            router: router.to_dtype(DType::F32)?,
            experts: mine,
            top_k,
        })
    }
}

/// Each token's `top_k` experts (the router's largest probabilities, the lower index first
/// among equals) and their weights (those probabilities renormalised), as `[n][top_k]`.
fn route(x: &Tensor, router: &Tensor, top_k: usize) -> Result<(Vec<i32>, Vec<f32>)> {
    if x.dim(0)? == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    // The softmax from the row's largest logit down, so that no exponential overflows.
    let logits = x.matmul(&router.t()?)?;
    let probs = logits
        .broadcast_sub(&logits.max_keepdim(D::Minus1)?)?
        .exp()?;
    let probs = probs
        .broadcast_div(&probs.sum_keepdim(D::Minus1)?)?
        .to_vec2::<f32>()?;
    let (mut ids, mut weights) = (Vec::new(), Vec::new());
    for row in probs {
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        let top = &order[..top_k.min(row.len())];
        let total: f32 = top.iter().map(|&i| row[i]).sum();
        for &i in top {
            ids.push(i as i32);
            weights.push(row[i] / total);
        }
    }
    Ok((ids, weights))
}

/// Each token's weighted sum of its experts' outputs, in `k` order (f32).
fn weighted(outs: &[Vec<f32>], weights: &[f32], n: usize, top_k: usize, hidden: usize) -> Vec<f32> {
    let mut y = vec![0f32; n * hidden];
    for t in 0..n {
        for (j, v) in y[t * hidden..(t + 1) * hidden].iter_mut().enumerate() {
            for q in 0..top_k {
                *v += weights[t * top_k + q] * outs[t * top_k + q][j];
            }
        }
    }
    y
}

/// The layer unsharded: every token through its `top_k` experts of `experts`, the outputs
/// summed by the router's weights in `k` order. What [`ExpertParallelMoe::forward`] equals.
pub fn moe_reference(
    x: &Tensor,
    router: &Tensor,
    experts: &[Tensor],
    top_k: usize,
) -> Result<Tensor> {
    moe_reference_masked(x, router, experts, top_k, RankMask::none(1))
}

/// [`moe_reference`] where the experts of `mask`'s masked ranks (`experts.len() /
/// mask.world()` a rank) contribute nothing: what
/// [`Communicator::expert_parallel_moe_masked`] equals.
pub fn moe_reference_masked(
    x: &Tensor,
    router: &Tensor,
    experts: &[Tensor],
    top_k: usize,
    mask: RankMask,
) -> Result<Tensor> {
    let (n, hidden) = x.dims2()?;
    let (ids, weights) = route(x, router, top_k)?;
    let local = (experts.len() / mask.world().max(1)).max(1);
    let mut outs = Vec::with_capacity(n * top_k);
    for (i, &e) in ids.iter().enumerate() {
        if mask.is_masked(e as usize / local) {
            outs.push(vec![0f32; hidden]);
            continue;
        }
        let row = x.narrow(0, i / top_k, 1)?;
        outs.push(
            row.matmul(&experts[e as usize].t()?)?
                .flatten_all()?
                .to_vec1::<f32>()?,
        );
    }
    Tensor::from_vec(
        weighted(&outs, &weights, n, top_k, hidden),
        (n, hidden),
        x.device(),
    )
}

impl ExpertParallelMoe<'_> {
    /// The layer on this rank's tokens `x` (`[n, hidden]`, f32, at most `max_tokens`).
    /// Collective: every rank calls it once per step, each with its own tokens.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (n, hidden) = x.dims2()?;
        let x = x.to_dtype(DType::F32)?.contiguous()?;
        let (ids, weights) = route(&x, &self.router, self.top_k)?;
        let mut streams = self.comm.locked(NAME)?;
        let st = streams.host(self.comm.comm())?;
        let g = self.group.lock();
        let c = self.comm.comm();
        let e = |err| wrap(NAME, err);
        let tokens = c
            .upload(&x.flatten_all()?.to_vec1::<f32>()?, st)
            .map_err(e)?;
        let (ids_d, weights_d) = (
            c.upload(&ids, st).map_err(e)?,
            c.upload(&weights, st).map_err(e)?,
        );
        let mut got = c.alloc::<f32>(g.received_len()).map_err(e)?;
        let mut counts = c.alloc::<i32>(g.counts_len()).map_err(e)?;
        let o = ExpertTokens {
            tokens: &mut got,
            counts: &mut counts,
        };
        g.dispatch(&tokens, &ids_d, o, st).map_err(e)?;
        // This rank's experts on the tokens they received.
        let (counts, mut rows) = (
            counts.copy_to_host(st).map_err(e)?,
            got.copy_to_host(st).map_err(e)?,
        );
        // Local expert l's rows: from l's share of the slots (low latency), or from the row
        // the packed layout's counts give.
        let (local, per) = (
            g.local_experts(),
            g.received_len() / g.local_experts().max(1),
        );
        for (l, w) in self.experts.iter().enumerate() {
            let m = counts[l] as usize;
            if m == 0 {
                continue;
            }
            let at = match g.mode() {
                ExpertMode::LowLatency => l * per,
                _ => counts[local + l] as usize * hidden,
            };
            let mine = Tensor::from_slice(&rows[at..at + m * hidden], (m, hidden), &Device::Cpu)?;
            let y = mine.matmul(&w.t()?)?.flatten_all()?.to_vec1::<f32>()?;
            rows[at..at + m * hidden].copy_from_slice(&y);
        }
        let expert_out = c.upload(&rows, st).map_err(e)?;
        let mut out = c.alloc::<f32>(n * hidden).map_err(e)?;
        g.combine(&expert_out, &ids_d, &weights_d, &mut out, st)
            .map_err(e)?;
        let y = out.copy_to_host(st).map_err(e)?;
        Tensor::from_vec(y, (n, hidden), x.device())
    }
}
