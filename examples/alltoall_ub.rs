//! Ulysses sequence parallelism's all-to-all, with registered buffers, on the shapes of the
//! diffusion-model benchmark that motivated unicomm: per rank, bf16 tensors
//! (1, 4096/W, 24, 128) and (1, 7680/W, 40, 128) are re-split from sequence-sharded to
//! head-sharded, i.e. to (1, 4096, 24/W, 128) and (1, 7680, 40/W, 128); every element is
//! checked against a host reference.
//!
//! `cargo xtask run --example alltoall_ub --vendor {auto,cuda,rocm,mock}`

use std::time::Instant;

use anyhow::bail;
use unicomm::bf16;

/// (sequence, heads, head_dim) of the two attention inputs.
const SHAPES: [(usize, usize, usize); 2] = [(4096, 24, 128), (7680, 40, 128)];

/// The value of global element (s, h, d): exact in bf16 (an integer below 256).
fn value(s: usize, h: usize, d: usize) -> bf16 {
    bf16::from_f32(((s * 7 + h * 3 + d) % 251) as f32)
}

mod common;

fn main() {
    common::main_with(run)
}

fn run() -> anyhow::Result<()> {
    let common::Args { vendor, ranks } = common::args()?;
    let resolved = common::choose(vendor)?;
    let comms = common::comms(resolved, ranks)?;
    let w = comms[0].world_size();
    for (seq, heads, _) in SHAPES {
        if seq % w != 0 || heads % w != 0 {
            bail!("world size {w} does not divide sequence {seq} and heads {heads}");
        }
    }
    let results = common::per_rank(&comms, |comm| {
        let r = comm.rank();
        let stream = comm.create_stream()?;
        let mut lines = Vec::new();
        for (seq, heads, dim) in SHAPES {
            let (sl, hl) = (seq / w, heads / w);
            // Input, sequence-sharded, laid out [peer][s_local][h_local][d] so that
            // chunk p holds the heads peer p will own.
            let mut host = Vec::with_capacity(sl * heads * dim);
            for p in 0..w {
                for sloc in 0..sl {
                    for hloc in 0..hl {
                        for d in 0..dim {
                            host.push(value(r * sl + sloc, p * hl + hloc, d));
                        }
                    }
                }
            }
            let mut send = comm.alloc::<bf16>(host.len())?;
            send.copy_from_host(&host, &stream)?;
            let send = comm.register(send)?;
            let mut recv = comm.register(comm.alloc::<bf16>(host.len())?)?;
            let t = Instant::now();
            comm.all_to_all(&send, &mut recv, &stream)?;
            stream.synchronize()?;
            let us = t.elapsed().as_secs_f64() * 1e6;
            // Output chunk q came from rank q: its sequence shard, our heads.
            let out = recv.copy_to_host(&stream)?;
            let mut i = 0;
            for q in 0..w {
                for sloc in 0..sl {
                    for hloc in 0..hl {
                        for d in 0..dim {
                            let want = value(q * sl + sloc, r * hl + hloc, d);
                            if out[i] != want {
                                bail!("rank {r}, shape ({seq},{heads},{dim}): element {i} is {}, want {want}", out[i]);
                            }
                            i += 1;
                        }
                    }
                }
            }
            comm.deregister(send)?;
            comm.deregister(recv)?;
            lines.push(format!(
                "rank {r}: (1,{sl},{heads},{dim}) -> (1,{seq},{hl},{dim}) bf16 correct, {us:.1} us"
            ));
        }
        Ok(lines.join("\n"))
    });
    common::verdict(
        "alltoall_ub",
        results,
        comms,
        &format!("on {resolved} with {w} ranks"),
    )
}
