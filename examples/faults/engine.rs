//! What an engine team found, as scenes on the GPU: a cancelled `Completion` and ranks told
//! different world sizes by their launcher.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _};
use unicomm::{Error, ReduceOp, Vendor};

/// A pending completion handle dropped (a cancelled future) while its all-reduce waits for
/// rank 1, 2 s late: the drop returns at once (its work uses only unicomm's allocations,
/// whose frees wait for the device), the work goes on, and once rank 1 comes the result is
/// exact. The drop must not block the thread (an executor's worker) for the peer.
pub fn completion_drop(vendor: Vendor) -> anyhow::Result<()> {
    const LATE: Duration = Duration::from_secs(2);
    let n = 1 << 20;
    let (comm, st) = super::joined_and_connected(vendor, n)?;
    let (r, w) = (comm.rank(), comm.world_size());
    let x = comm.upload(&vec![(r + 1) as f32; n], &st)?;
    if r == 1 {
        std::thread::sleep(LATE);
    }
    let t = Instant::now();
    let h = unicomm::Completion::start(&st, |s| s.all_reduce_in_place(&comm, &x, ReduceOp::Sum))?;
    drop(h);
    let dropped = t.elapsed();
    st.synchronize()?;
    let waited = t.elapsed();
    let want = (w * (w + 1) / 2) as f32;
    let got = x.copy_to_host(&st)?;
    ensure!(
        got.iter().all(|&v| v == want),
        "rank {r}: the cancelled all-reduce gave {} where {want} was due",
        got[0]
    );
    if r == 0 {
        ensure!(
            dropped < Duration::from_millis(250),
            "rank 0: dropping the pending handle took {dropped:?} (rank 1 is {LATE:?} late)"
        );
        ensure!(
            waited >= LATE / 2 || vendor == Vendor::Mock,
            "rank 0: the stream drained after {waited:?}, before the late rank could come"
        );
    }
    println!(
        "faults completion-drop: rank {r}: the drop took {:.2} ms, the work ended {:.0} ms in; PASSED",
        dropped.as_secs_f64() * 1e3,
        waited.as_secs_f64() * 1e3
    );
    Ok(())
}

/// Ranks told different world sizes by their launcher (started by hand: rank 0 with
/// `WORLD_SIZE=2`, rank 1 with 3): every rank is refused at once, naming the sizes, never
/// `Ok` (a world that is not one) nor a `Timeout` at the deadline (rank 0 names both
/// sizes, rank 1 the refusal of its size); the verdict is each rank's own.
pub fn world_mismatch(vendor: Vendor) -> anyhow::Result<()> {
    let t = Instant::now();
    let r = unicomm::from_env(vendor);
    let took = t.elapsed();
    let rank = std::env::var("RANK").unwrap_or_default();
    match r {
        Ok(c) => anyhow::bail!(
            "rank {rank}: joined a world of {} though the ranks were told different sizes",
            c.world_size()
        ),
        Err(e @ Error::Timeout { .. }) => {
            anyhow::bail!("rank {rank}: {e} after {took:?}: the refusal came at the deadline")
        }
        Err(e) => {
            let text = e.to_string();
            ensure!(
                took < Duration::from_secs(10),
                "rank {rank}: refused only after {took:?}: {text}"
            );
            ensure!(
                text.contains("world"),
                "rank {rank}: the refusal does not name the world size: {text}"
            );
            println!(
                "faults world-mismatch: rank {rank}: refused after {:.2} s: {text}; PASSED",
                took.as_secs_f64()
            );
            Ok(())
        }
    }
}

/// A completion handle whose collective the ranks disagree on (rank 1 another count, with
/// `UNICOMM_CHECK_COLLECTIVES=1`): every rank's handle ends at once with `Mismatch` (at its
/// start on the GPUs, where the ranks compare before the library's call; at its wait on
/// the mock, whose stream compares), never `Timeout` at the deadline; an agreed all-reduce
/// after it is exact.
pub fn completion_mismatch(vendor: Vendor) -> anyhow::Result<()> {
    // Read when the communicator is made, before any thread of this process.
    std::env::set_var("UNICOMM_CHECK_COLLECTIVES", "1");
    let comm = unicomm::from_env(vendor).context("joining the job")?;
    let (r, w) = (comm.rank(), comm.world_size());
    ensure!(w >= 2, "needs at least 2 ranks");
    let _ = comm.set_timeout(Duration::from_secs(20));
    let st = comm.create_stream()?;
    let n = if r == 1 { 1 << 15 } else { 1 << 16 };
    let x = comm.upload(&vec![1.0f32; n], &st)?;
    let t = Instant::now();
    let res = unicomm::Completion::start(&st, |s| s.all_reduce_in_place(&comm, &x, ReduceOp::Sum))
        .and_then(|h| h.wait());
    let took = t.elapsed();
    match res {
        Err(Error::Mismatch { what, .. }) if took < Duration::from_secs(5) => println!(
            "faults completion-mismatch: rank {r}: Mismatch ({what}) after {:.1} ms",
            took.as_secs_f64() * 1e3
        ),
        other => anyhow::bail!("rank {r}: expected Mismatch at once, got {other:?} after {took:?}"),
    }
    // Where the backend keeps a stream's error (the mock), it stays for the stream's next
    // synchronize (`DeviceStream::query`'s rule): taken here, as an engine would.
    match st.synchronize() {
        Ok(()) | Err(Error::Mismatch { .. }) => {}
        Err(e) => anyhow::bail!("rank {r}: the stream after the mismatch: {e}"),
    }
    let mut y = comm.upload(&[1.0f32; 1024], &st)?;
    comm.all_reduce_in_place(&mut y, ReduceOp::Sum, &st)?;
    let got = y.copy_to_host(&st)?;
    ensure!(
        got.iter().all(|&v| v == w as f32),
        "rank {r}: an agreed all-reduce after the mismatch gave {}",
        got[0]
    );
    println!("faults completion-mismatch: rank {r}: the ranks still in step; PASSED");
    Ok(())
}
