//! NCCL's user-buffer-registration example in Rust: one thread per GPU, two 1 Mi-float
//! buffers from `alloc` (ncclMemAlloc), both registered, the send buffer filled with the
//! rank, one sum all-reduce, every element checked against n(n-1)/2.
//!
//! `cargo xtask run --vendor {auto,cuda,rocm,mock} [-- --ranks N]`

use std::time::Instant;

use anyhow::bail;
use unicomm::ReduceOp;

const COUNT: usize = 1 << 20;

mod common;

fn main() {
    common::main_with(run)
}

fn run() -> anyhow::Result<()> {
    let common::Args { vendor, ranks } = common::args()?;
    let resolved = common::choose(vendor)?;
    let comms = common::comms(resolved, ranks)?;
    let caps = comms[0].capabilities();
    println!(
        "{} of {} ranks in this process, {} {} at {}",
        comms.len(),
        comms[0].world_size(),
        caps.backend,
        caps.version,
        caps.library_path
    );
    let results = common::per_rank(&comms, |comm| {
        let rank = comm.rank();
        let stream = comm.create_stream()?;
        let mut send = comm.alloc::<f32>(COUNT)?;
        send.copy_from_host(&vec![rank as f32; COUNT], &stream)?;
        let send = comm.register(send)?;
        let mut recv = comm.register(comm.alloc::<f32>(COUNT)?)?;
        let t = Instant::now();
        comm.all_reduce(&send, &mut recv, ReduceOp::Sum, &stream)?;
        stream.synchronize()?;
        let us = t.elapsed().as_secs_f64() * 1e6;
        let host = recv.copy_to_host(&stream)?;
        let w = comm.world_size() as f32;
        let want = w * (w - 1.0) / 2.0;
        let wrong = host.iter().filter(|&&x| x != want).count();
        comm.deregister(send)?;
        comm.deregister(recv)?;
        if wrong > 0 {
            bail!("rank {rank}: {wrong} of {COUNT} elements differ from {want}");
        }
        Ok(format!(
            "rank {rank}: all_reduce of {COUNT} floats (registered) correct, {us:.1} us"
        ))
    });
    common::verdict("allreduce_ub", results, comms, &format!("on {resolved}"))
}
