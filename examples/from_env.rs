//! One rank per process: `unicomm::from_env` under torchrun, mpirun or srun (or by hand:
//! `RANK=r WORLD_SIZE=n LOCAL_RANK=r MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 from_env`),
//! then one sum all-reduce of registered buffers, checked on every rank.

#[expect(
    dead_code,
    reason = "one rank per process: the per-rank runner is not used here"
)]
mod common;

use anyhow::{bail, Context as _};
use unicomm::ReduceOp;

fn main() {
    common::main_with(run)
}

fn run() -> anyhow::Result<()> {
    let vendor = common::args()?.vendor;
    // Progress a launcher can time (a thousand processes joining the mock's hub): started,
    // joined, passed.
    println!("from_env: started");
    let comm = unicomm::from_env(vendor).context("joining the job")?;
    let (r, w) = (comm.rank(), comm.world_size());
    println!("from_env: rank {r} of {w} joined");
    let n = 1 << 20;
    let stream = comm.create_stream()?;
    let mut send = comm.alloc::<f32>(n)?;
    send.copy_from_host(&vec![r as f32 + 1.0; n], &stream)?;
    let send = comm.register(send)?;
    let mut recv = comm.register(comm.alloc::<f32>(n)?)?;
    comm.all_reduce(&send, &mut recv, ReduceOp::Sum, &stream)?;
    let host = recv.copy_to_host(&stream)?;
    let want = (w * (w + 1) / 2) as f32;
    if let Some(i) = host.iter().position(|&x| x != want) {
        bail!("rank {r}: element {i} is {}, want {want}", host[i]);
    }
    comm.deregister(send)?;
    comm.deregister(recv)?;
    comm.finalize()?;
    println!("from_env: rank {r} of {w} PASSED");
    Ok(())
}
