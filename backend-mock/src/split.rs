//! `split` on the mock: the parent's ranks exchange (color, key) in one blocking all-gather,
//! each group gets a fabric of its own, and the child is a communicator of the same
//! "device" (its streams and memory serve parent and child alike).
//!
//! Ranks in one process find their group's fabric in a table keyed by the parent's world,
//! the split's sequence number and the color (whoever arrives first creates it). Ranks in
//! different processes get a hub of their own, started by the group's rank 0, whose address
//! and secret travel in a second all-gather over the parent.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use unicomm_core::{CommConfig, DataType, Kind, Result};

use crate::comm::{MockComm, NEXT_WORLD};
use crate::exec::{self, Span, Spec};
use crate::fabric::{Exchange, LocalFabric, Signature};
use crate::memory::MockMemory;
use crate::procs;

/// A group's fabric until every member took it: (fabric, world id, members still to come).
type Pending = (Arc<dyn Exchange>, u64, usize);

/// The groups of splits in progress, by (parent world, split sequence number, color).
type Groups = HashMap<(u64, u64, u32), Pending>;

static GROUPS: Mutex<Option<Groups>> = Mutex::new(None);

/// One rank's part of a split: its color (`-1`: none) and key.
const RECORD: usize = 16;

impl MockComm {
    /// Every rank's `mine` (each `mine.len()` bytes), through the fabric: a collective the
    /// host waits for, checked like any other (every rank must call it with the same size).
    pub(crate) fn host_all_gather(&self, kind: &'static str, mine: &[u8]) -> Result<Vec<u8>> {
        self.live()?;
        let (w, timeout) = (self.ctx.world, self.ctx.timeout);
        let send = MockMemory::new(mine.len(), self.owner(), self.shared)?;
        let recv = MockMemory::new(mine.len() * w, self.owner(), self.shared)?;
        send.inner.fill(mine, timeout)?;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let sig = Signature {
            kind,
            count: mine.len(),
            dtype: Some(DataType::U8),
            op: None,
            root: None,
            send_reg: None,
            recv_reg: None,
        };
        let spec = Spec {
            kind: Kind::AllGather,
            count: mine.len(),
            dtype: DataType::U8,
        };
        let span = |m: &MockMemory, write| Span {
            alloc: m.inner.clone(),
            offset: 0,
            write,
        };
        {
            let _s = send.inner.read_lock(timeout)?;
            let _r = recv.inner.write_lock(timeout)?;
            exec::run_coll(
                &self.ctx,
                seq,
                &sig,
                spec,
                Some(&span(&send, false)),
                Some(&span(&recv, true)),
            )?;
        }
        recv.inner.to_vec(timeout)
    }

    /// `ncclCommSplit` (see `Collective::split`).
    pub(crate) fn split_comm(
        &self,
        color: Option<u32>,
        key: i32,
        config: &CommConfig,
    ) -> Result<Option<MockComm>> {
        config.check_values()?;
        let mut rec = [0u8; RECORD];
        rec[..8].copy_from_slice(&color.map_or(-1i64, i64::from).to_le_bytes());
        rec[8..12].copy_from_slice(&key.to_le_bytes());
        let split_seq = self.seq.load(Ordering::Relaxed);
        let all = self.host_all_gather("CommSplit", &rec)?;
        let parse = |r: usize| {
            let b = &all[r * RECORD..][..RECORD];
            let c = i64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8]));
            let k = i32::from_le_bytes(b[8..12].try_into().unwrap_or([0; 4]));
            (c, k)
        };
        // Members of this rank's color, ranked by (key, parent rank): NCCL's order.
        let mut members: Vec<(i32, usize)> = (0..self.ctx.world)
            .filter(|&r| color.is_some() && parse(r).0 == color.map_or(-1, i64::from))
            .map(|r| (parse(r).1, r))
            .collect();
        members.sort();
        let me = members.iter().position(|&(_, r)| r == self.ctx.rank);
        let (k, child_rank) = (members.len(), me.unwrap_or(0));
        let fabric = if self.shared {
            self.proc_fabric(me.is_some() && child_rank == 0, &members, k, child_rank)?
        } else {
            match (color, me) {
                (Some(c), Some(_)) => Some(self.local_fabric(split_seq, c, k)),
                _ => None,
            }
        };
        let (Some((fabric, world_id)), Some(_)) = (fabric, me) else {
            return Ok(None);
        };
        let ranks: Vec<usize> = members.iter().map(|&(_, r)| r).collect();
        Ok(Some(self.derived(
            child_rank,
            k,
            fabric,
            world_id,
            &format!("split{split_seq}.c{}", color.unwrap_or(0)),
            &ranks,
        )))
    }

    /// The fabric of group `color` of this split, created by its first member to arrive.
    fn local_fabric(&self, split_seq: u64, color: u32, k: usize) -> (Arc<dyn Exchange>, u64) {
        let key = (self.world_id, split_seq, color);
        let mut g = GROUPS.lock().unwrap_or_else(|e| e.into_inner());
        let table = g.get_or_insert_with(HashMap::new);
        let entry = table.entry(key).or_insert_with(|| {
            let f: Arc<dyn Exchange> = Arc::new(LocalFabric::new(k, self.ctx.timeout));
            (f, NEXT_WORLD.fetch_add(1, Ordering::Relaxed), k)
        });
        entry.2 -= 1;
        let out = (entry.0.clone(), entry.1);
        if entry.2 == 0 {
            table.remove(&key);
        }
        out
    }

    /// Across processes: the group's rank 0 starts a hub; every parent rank takes part in
    /// the all-gather of the hubs' ids; members connect to theirs.
    fn proc_fabric(
        &self,
        root: bool,
        members: &[(i32, usize)],
        k: usize,
        child_rank: usize,
    ) -> Result<Option<(Arc<dyn Exchange>, u64)>> {
        let hub = if root {
            Some(procs::Hub::start(k, self.ctx.timeout)?)
        } else {
            None
        };
        let mine = hub.as_ref().map_or([0u8; 128], |(_, id)| id.to_bytes());
        let ids = self.host_all_gather("CommSplitHub", &mine)?;
        let world_id = NEXT_WORLD.fetch_add(1, Ordering::Relaxed);
        if let Some((hub, _)) = hub {
            return Ok(Some((Arc::new(procs::ProcFabric::hub(hub)), world_id)));
        }
        let Some(&(_, root_rank)) = members.first() else {
            return Ok(None);
        };
        if !members.iter().any(|&(_, r)| r == self.ctx.rank) {
            return Ok(None);
        }
        let mut b = [0u8; 128];
        b.copy_from_slice(&ids[root_rank * 128..][..128]);
        let id = procs::HubId::parse(&b)?;
        let client = procs::Client::connect(&id, child_rank, k, self.ctx.timeout)?;
        Ok(Some((
            Arc::new(procs::ProcFabric::client(client)),
            world_id,
        )))
    }
}
