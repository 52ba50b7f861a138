//! `shrink` on the mock: the survivors re-form (the mock has no library to shrink in
//! place). They meet without the old fabric, through the communicator's [`Rejoin`]: in one
//! process the first survivor makes a fabric and posts its number, across processes it
//! starts a hub and hands its address over the job's rendezvous. The new communicator is
//! one of the same "device" (streams and memory still serve it), as a split child is.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use unicomm_core::{CommConfig, Error, Result, ShrinkMode};

use crate::comm::{MockComm, NEXT_WORLD};
use crate::fabric::{Exchange, LocalFabric};
use crate::procs;

/// Fabrics made for re-formed worlds in this process, by number, until every survivor took
/// theirs: (fabric, survivors still to take it).
type Made = HashMap<u64, (Arc<dyn Exchange>, usize)>;

static MADE: Mutex<Option<Made>> = Mutex::new(None);

/// The number of the re-formed world's joining barrier: never one of its collectives'.
const JOIN: u64 = u64::MAX;

impl MockComm {
    /// `ncclCommShrink` (see `Comm::shrink`), always by re-forming.
    pub(crate) fn shrink_comm(
        &self,
        exclude: &[usize],
        mode: ShrinkMode,
        config: &CommConfig,
    ) -> Result<MockComm> {
        config.check_values()?;
        let survivors: Vec<usize> = (0..self.ctx.world)
            .filter(|r| exclude.binary_search(r).is_err())
            .collect();
        let k = survivors.len();
        let me = survivors
            .iter()
            .position(|&r| r == self.ctx.rank)
            .ok_or_else(|| Error::invalid("exclude", "this rank is excluded"))?;
        if mode != ShrinkMode::Default {
            // NCCL's abort mode ends the work in flight; a re-form leaves the old world.
            self.abort_comm();
        }
        // The number of re-forms that succeeded: an attempt that failed is retried under
        // the same number, so survivors whose first attempts failed at different times
        // still meet (counting attempts, a survivor one failure ahead never met the other).
        let round = self.shrinks.load(Ordering::Relaxed);
        tracing::info!(
            rank = self.ctx.rank,
            ?exclude,
            ?mode,
            "re-forming the mock's world"
        );
        let (fabric, world_id) = match self.shared {
            true => (
                self.reformed_hub_fabric(round, &survivors, me)?,
                NEXT_WORLD.fetch_add(1, Ordering::Relaxed),
            ),
            false => self.reformed_local_fabric(round, &survivors)?,
        };
        let timeout = self.ctx.timeout;
        // Every survivor joins before any goes on, as `ncclCommInitRank` waits for every
        // rank: the re-form completes for all of them or fails for all (a survivor lost
        // during it, or one with another view of who is left, ends the others' wait at the
        // deadline instead of leaving them a world it never joins).
        let deadline = std::time::Instant::now() + timeout;
        fabric.phase(JOIN, me, 0, deadline)?;
        fabric.leave(JOIN, false, deadline);
        self.shrinks.fetch_max(round + 1, Ordering::Relaxed);
        Ok(self.derived(
            me,
            k,
            fabric,
            world_id,
            &format!("shrink{round}"),
            &survivors,
        ))
    }
}

impl MockComm {
    /// The re-formed world's exchange across processes: the first survivor starts a hub
    /// and hands its id to the others through the rejoin channel; they connect to it.
    fn reformed_hub_fabric(
        &self,
        round: u64,
        survivors: &[usize],
        me: usize,
    ) -> Result<Arc<dyn Exchange>> {
        let (k, timeout) = (survivors.len(), self.ctx.timeout);
        let mut hub = None;
        let id = self.rejoin.exchange(
            round,
            survivors,
            self.ctx.rank,
            || {
                let (h, id) = procs::Hub::start(k, timeout)?;
                hub = Some(h);
                Ok(id.to_bytes())
            },
            timeout,
        )?;
        Ok(match hub {
            Some(h) => Arc::new(procs::ProcFabric::hub(h)),
            None => Arc::new(procs::ProcFabric::client(procs::Client::connect(
                &procs::HubId::parse(&id)?,
                me,
                k,
                timeout,
            )?)),
        })
    }

    /// The re-formed world's exchange in one process, and its number: the first survivor's
    /// (made by it, shared through the rejoin channel), so that the survivors' later splits
    /// (grouped by world, split and color) find each other.
    fn reformed_local_fabric(
        &self,
        round: u64,
        survivors: &[usize],
    ) -> Result<(Arc<dyn Exchange>, u64)> {
        let (k, timeout) = (survivors.len(), self.ctx.timeout);
        let world_id = NEXT_WORLD.fetch_add(1, Ordering::Relaxed);
        let id = self.rejoin.exchange(
            round,
            survivors,
            self.ctx.rank,
            || {
                let f: Arc<dyn Exchange> = Arc::new(LocalFabric::new(k, timeout));
                let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
                made.get_or_insert_with(HashMap::new)
                    .insert(world_id, (f, k));
                let mut b = [0u8; 128];
                b[..8].copy_from_slice(&world_id.to_le_bytes());
                Ok(b)
            },
            timeout,
        )?;
        let n = u64::from_le_bytes(id[..8].try_into().unwrap_or([0; 8]));
        let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
        let table = made.get_or_insert_with(HashMap::new);
        let Some((f, left)) = table.get_mut(&n) else {
            return Err(Error::Bootstrap {
                reason: format!("the re-formed world {n} is not in this process"),
            });
        };
        let f = f.clone();
        *left -= 1;
        if *left == 0 {
            table.remove(&n);
        }
        Ok((f, n))
    }
}
