//! One-sided operations, the same on every backend (NCCL 2.29.2's `ncclPutSignal`,
//! `ncclSignal`, `ncclWaitSignal`): around a ring, each rank puts its block into its right
//! neighbour's window and signals it, then waits for its left neighbour's two signals and
//! finds exactly that block in its window and zeros elsewhere; a second round finds the new
//! block (signals are consumed, not counted twice). A source outside a window is refused by
//! NCCL's rule; where the library predates the calls, `Unsupported` naming the release.

use unicomm_core::{each_rank, Collective, Comm, DeviceStream, Error, Result, SignalWait};

/// Elements each rank puts.
const N: usize = 4;

/// What each rank saw: whether the library has the one-sided operations (and, at world 2
/// or more, moved the blocks exactly); `false` where it predates them (`Unsupported` naming
/// 2.29.2) or where the communicator lacks NCCL's host RMA (`Unsupported` naming it).
pub fn one_sided_put_signal<C: Collective>(comms: &[Comm<C>]) -> Result<Vec<bool>> {
    each_rank(comms, |c| -> Result<bool> {
        let (r, w) = (c.rank(), c.world_size());
        let st = c.create_stream()?;
        let dst = c.register_window(c.upload(&vec![0u32; w * N], &st)?)?;
        let mut src = c.register_window(c.upload(&block(r, 0), &st)?)?;
        let plain = c.upload(&block(r, 0), &st)?;
        match c.put_signal(&plain, (r + 1) % w, &dst, 0, &st) {
            Err(Error::InvalidArgument { reason, .. }) if reason.contains("symmetric window") => {}
            Err(Error::Unsupported { needs, .. }) if needs.contains("2.29.2") => return Ok(false),
            other => return Err(wrong(format!("a put from outside a window: {other:?}"))),
        }
        if w == 1 {
            return Ok(true);
        }
        let (right, left) = ((r + 1) % w, (r + w - 1) % w);
        for round in 0..2 {
            if round == 1 {
                src.copy_from_host(&block(r, 1), &st)?;
            }
            match c.put_signal(&src, right, &dst, r * N, &st) {
                // NCCL's host RMA is missing on this communicator (no symmetric memory in one
                // NVLink domain, no GIN proxy): said so by the caller, not passed.
                Err(Error::Unsupported { needs, .. }) if needs.contains("host RMA") => {
                    return Ok(false)
                }
                other => other?,
            }
            c.signal(right, &st)?;
            c.wait_signal(&[SignalWait::new(left, 2)], &st)?;
            st.synchronize()?;
            let got = dst.copy_to_host(&st)?;
            for (k, chunk) in got.chunks(N).enumerate() {
                let want = if k == left {
                    block(left, round)
                } else {
                    vec![0; N]
                };
                if chunk != want.as_slice() {
                    return Err(wrong(format!(
                        "round {round}: rank {r}'s slot {k} holds {chunk:?}, {want:?} was due"
                    )));
                }
            }
            // Every rank has read its window before the next round writes into it.
            c.barrier(&st)?;
            st.synchronize()?;
        }
        Ok(true)
    })
}

/// Rank `r`'s block in round `round`.
fn block(r: usize, round: usize) -> Vec<u32> {
    (0..N)
        .map(|k| (1000 * round + 10 * r + k + 1) as u32)
        .collect()
}

fn wrong(what: String) -> Error {
    Error::invalid("one-sided", what)
}

/// The ring of [`one_sided_put_signal`] captured in a graph (NCCL >= 2.30.3) and replayed
/// `replays` times. Each replay clears this rank's window (a copy of zeros), meets the
/// others (an all-reduce, so that no put lands before a clear), puts and waits: after every
/// replay the window holds exactly the left neighbour's block and zeros elsewhere, so a
/// replay that moved nothing is seen. The capture itself wrote nothing there (its warm-up
/// pass signals without putting). What each rank saw: `true`, or `false` where the library
/// refuses captured one-sided operations (`Unsupported` naming 2.30.3 or 2.29.2, or the
/// host RMA it lacks).
pub fn one_sided_in_graph<C: Collective>(comms: &[Comm<C>], replays: usize) -> Result<Vec<bool>> {
    each_rank(comms, |c| -> Result<bool> {
        let (r, w) = (c.rank(), c.world_size());
        let st = c.create_stream()?;
        let dst = c.register_window(c.upload(&vec![7u32; w * N], &st)?)?;
        let src = c.register_window(c.upload(&block(r, 0), &st)?)?;
        let zeros = c.upload(&vec![0u32; w * N], &st)?;
        let meet = c.upload(&[1u32], &st)?;
        let (right, left) = ((r + 1) % w, (r + w - 1) % w);
        let captured = unicomm_core::graph::Graph::capture(&st, |g| {
            g.copy(c, &zeros, &dst)?;
            g.all_reduce_in_place(c, &meet, unicomm_core::ReduceOp::Max)?;
            g.put_signal(c, &src, right, &dst, r * N)?;
            g.wait_signal(c, &[SignalWait::new(left, 1)])
        });
        let graph = match captured {
            Err(Error::Unsupported { needs, .. })
                if ["2.30.3", "2.29.2", "host RMA"]
                    .iter()
                    .any(|n| needs.contains(n)) =>
            {
                return Ok(false)
            }
            other => other?,
        };
        st.synchronize()?;
        if dst.copy_to_host(&st)?.iter().any(|&x| x != 7) {
            return Err(wrong(format!(
                "rank {r}: the capture wrote into the window"
            )));
        }
        for k in 1..=replays {
            graph.launch(&st)?;
            st.synchronize()?;
            let got = dst.copy_to_host(&st)?;
            for (slot, chunk) in got.chunks(N).enumerate() {
                let want = if slot == left {
                    block(left, 0)
                } else {
                    vec![0; N]
                };
                if chunk != want.as_slice() {
                    return Err(wrong(format!(
                        "replay {k}: rank {r}'s slot {slot} holds {chunk:?}, {want:?} was due"
                    )));
                }
            }
        }
        Ok(true)
    })
}
