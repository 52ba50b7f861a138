//! Capture and replay ([`unicomm_core::graph`]): one step of every collective captured once
//! and replayed, data exact after each replay, on every backend that captures.

use unicomm_core::graph::Graph;
use unicomm_core::{each_rank, Collective, Comm, DeviceStream, Error, ReduceOp, Result};

const N: usize = 6;

/// `[f(0), f(1), .., f(n - 1)]`.
fn each(f: &dyn Fn(usize) -> i64, n: usize) -> Vec<i64> {
    (0..n).map(f).collect()
}

fn check(what: &str, replay: u64, got: Vec<i64>, want: Vec<i64>) -> Result<()> {
    if got == want {
        return Ok(());
    }
    Err(Error::invalid(
        "graph",
        format!("{what} after replay {replay}: got {got:?}, want {want:?}"),
    ))
}

/// Every collective of a captured step runs at each launch and only then: after the capture
/// the outputs are as they were (the capture pass runs nothing, the warm-up pass ran on
/// scratch memory); after each of `replays` launches they hold the collectives' results,
/// and an in-place all-reduce compounds once per launch. With `register`, the in-place
/// buffer is a registered one (NCCL captures its registered kernels).
pub fn captured_step_replays<C: Collective>(
    comms: &[Comm<C>],
    replays: u64,
    register: bool,
) -> Result<()> {
    each_rank(comms, |c| {
        let (r, w) = (c.rank(), c.world_size());
        let st = c.create_stream()?;
        let x: Vec<i64> = (0..N).map(|i| (10 * r + i) as i64).collect();
        let big: Vec<i64> = (0..N * w).map(|i| (100 * r + i) as i64).collect();
        let (xs, bigs) = (c.upload(&x, &st)?, c.upload(&big, &st)?);
        let zeros = |n: usize| c.upload(&vec![0i64; n], &st);
        let (ar, bc, rd, cp) = (zeros(N)?, zeros(N)?, zeros(N)?, zeros(N)?);
        let (ag, rs, a2a, ring) = (zeros(N * w)?, zeros(N)?, zeros(N * w)?, zeros(N)?);
        let ip = c.upload(&[1i64; N], &st)?;
        let reg = match register {
            true => Some(
                c.register(c.upload(&[1i64; N], &st)?)
                    .map_err(|e| e.error)?,
            ),
            false => None,
        };
        let graph = Graph::capture(&st, |g| {
            g.all_reduce(c, &xs, &ar, ReduceOp::Sum)?;
            g.broadcast(c, &xs, &bc, w - 1)?;
            g.reduce(c, &xs, &rd, ReduceOp::Max, 0)?;
            g.all_gather(c, &xs, &ag)?;
            g.reduce_scatter(c, &bigs, &rs, ReduceOp::Sum)?;
            g.all_to_all(c, &bigs, &a2a)?;
            g.group(c, || {
                g.send(c, &xs, (r + 1) % w)?;
                g.recv(c, &ring, (r + w - 1) % w)
            })?;
            g.copy(c, &xs, &cp)?;
            g.all_reduce_in_place(c, &ip, ReduceOp::Sum)?;
            match &reg {
                Some(b) => g.all_reduce_in_place(c, b, ReduceOp::Sum),
                None => Ok(()),
            }
        })?;
        st.synchronize()?;
        check(
            "an all-reduce before any launch",
            0,
            ar.copy_to_host(&st)?,
            vec![0; N],
        )?;
        check(
            "in place before any launch",
            0,
            ip.copy_to_host(&st)?,
            vec![1; N],
        )?;
        let sum = |i: usize| (0..w).map(|q| (10 * q + i) as i64).sum::<i64>();
        for k in 1..=replays {
            graph.launch(&st)?;
            st.synchronize()?;
            check("all_reduce", k, ar.copy_to_host(&st)?, each(&sum, N))?;
            let root = each(&|i| (10 * (w - 1) + i) as i64, N);
            check("broadcast", k, bc.copy_to_host(&st)?, root.clone())?;
            if r == 0 {
                check("reduce (max)", k, rd.copy_to_host(&st)?, root)?;
            }
            let gathered = each(&|i| (10 * (i / N) + i % N) as i64, N * w);
            check("all_gather", k, ag.copy_to_host(&st)?, gathered)?;
            let scattered = each(&|i| (0..w).map(|q| (100 * q + r * N + i) as i64).sum(), N);
            check("reduce_scatter", k, rs.copy_to_host(&st)?, scattered)?;
            let exchanged = each(&|i| (100 * (i / N) + r * N + i % N) as i64, N * w);
            check("all_to_all", k, a2a.copy_to_host(&st)?, exchanged)?;
            let left = (r + w - 1) % w;
            let from_left = each(&|i| (10 * left + i) as i64, N);
            check("send/recv", k, ring.copy_to_host(&st)?, from_left)?;
            check("copy", k, cp.copy_to_host(&st)?, x.clone())?;
            let compounded = vec![(w as i64).wrapping_pow(k as u32); N];
            check("in place", k, ip.copy_to_host(&st)?, compounded.clone())?;
            if let Some(b) = &reg {
                check("in place, registered", k, b.copy_to_host(&st)?, compounded)?;
            }
        }
        if graph.replays() != replays {
            return Err(Error::invalid("graph", "the replay count is off"));
        }
        drop(graph);
        if let Some(b) = reg {
            c.deregister(b)?;
        }
        Ok(())
    })
    .map(drop)
}
