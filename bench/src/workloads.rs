//! What a run measures: the size sweep of every collective asked for, or a preset's fixed
//! shapes (the diffusion model's sequence parallelism, a MoE layer's dispatch, a decode
//! step's tensor-parallel all-reduces).

use anyhow::bail;
use unicomm::DataType;

use crate::{run, Args, Coll, MoeShape, Preset, Work};

/// The workloads: the size sweep for every collective, or the preset's.
pub(crate) fn workloads(a: &Args, w: usize) -> anyhow::Result<Vec<Work>> {
    match a.preset {
        Some(Preset::Visualgen) => visualgen(w),
        Some(Preset::Decode) => Ok(DECODE
            .iter()
            .map(|&(hidden, batch, label)| Work {
                coll: Coll::AllReduce,
                bytes: batch * hidden * 2,
                dtype: DataType::Bf16,
                label,
                moe: None,
                hidden: Some(hidden),
            })
            .collect()),
        Some(Preset::Moe) => moe(a, w),
        None => sweep(a),
    }
}

/// Ulysses sequence parallelism of a diffusion model: the bf16 all_to_alls and all_gathers
/// of two attention shapes, and a (1, 512, 512) all_reduce.
fn visualgen(w: usize) -> anyhow::Result<Vec<Work>> {
    let b = |elems: usize| elems * 2;
    let mut v = Vec::new();
    for (s, h, label_a2a, label_ag) in [
        (
            4096usize,
            24usize,
            "a2a (1,4096/W,24,128)",
            "ag (1,4096/W,24,128)",
        ),
        (7680, 40, "a2a (1,7680/W,40,128)", "ag (1,7680/W,40,128)"),
    ] {
        if s % w != 0 || h % w != 0 {
            bail!("the visualgen preset needs a world size dividing {s} and {h} (got {w})");
        }
        // all_to_all: per rank (1, S/W, H, 128) re-split to (1, S, H/W, 128): the exchanged
        // buffer is S/W * H * 128 elements per rank.
        v.push(Work {
            coll: Coll::AllToAll,
            bytes: b(s / w * h * 128),
            dtype: DataType::Bf16,
            label: label_a2a,
            moe: None,
            hidden: None,
        });
        // all_gather of (1, S/W, H, 128) into (1, S, H, 128).
        v.push(Work {
            coll: Coll::AllGather,
            bytes: b(s * h * 128),
            dtype: DataType::Bf16,
            label: label_ag,
            moe: None,
            hidden: None,
        });
    }
    v.push(Work {
        coll: Coll::AllReduce,
        bytes: b(512 * 512),
        dtype: DataType::Bf16,
        label: "ar (1,512,512)",
        moe: None,
        hidden: None,
    });
    Ok(v)
}

/// The MoE dispatch: 4096 tokens per rank routed top-8 among 256 experts spread over the
/// ranks, one all_to_all_v.
fn moe(a: &Args, w: usize) -> anyhow::Result<Vec<Work>> {
    let moe = MoeShape {
        tokens: 4096,
        hidden: 7168,
        top_k: 8,
        experts: 256,
    };
    if !moe.experts.is_multiple_of(w) {
        bail!("the moe preset spreads 256 experts over the ranks: the world size must divide 256 (got {w})");
    }
    // nccl-tests' size: the mean of what a rank sends each peer, times the ranks.
    let per_peer = run::moe_mean_elems(&moe, w);
    Ok(vec![Work {
        coll: Coll::AllToAllV,
        bytes: per_peer * w * a.dtype.size(),
        dtype: a.dtype,
        label: "moe dispatch (4096 tok, top-8/256, 7168)",
        moe: Some(moe),
        hidden: None,
    }])
}

/// The size sweep: every collective from `-b` to `-e` by `-f`.
fn sweep(a: &Args) -> anyhow::Result<Vec<Work>> {
    if a.step_factor < 2 {
        bail!("-f must be at least 2");
    }
    let mut v = Vec::new();
    for &coll in &a.colls {
        let mut bytes = a.min_bytes.max(1);
        while bytes <= a.max_bytes {
            v.push(Work {
                coll,
                bytes,
                dtype: a.dtype,
                label: "",
                moe: None,
                hidden: None,
            });
            bytes = match bytes.checked_mul(a.step_factor) {
                Some(b) => b,
                None => break,
            };
        }
    }
    Ok(v)
}

/// The decode preset's all-reduces: (hidden, batch, label), bf16.
const DECODE: [(usize, usize, &str); 14] = [
    (4096, 1, "decode h4096 b1"),
    (4096, 2, "decode h4096 b2"),
    (4096, 4, "decode h4096 b4"),
    (4096, 8, "decode h4096 b8"),
    (4096, 16, "decode h4096 b16"),
    (4096, 32, "decode h4096 b32"),
    (4096, 64, "decode h4096 b64"),
    (8192, 1, "decode h8192 b1"),
    (8192, 2, "decode h8192 b2"),
    (8192, 4, "decode h8192 b4"),
    (8192, 8, "decode h8192 b8"),
    (8192, 16, "decode h8192 b16"),
    (8192, 32, "decode h8192 b32"),
    (8192, 64, "decode h8192 b64"),
];
