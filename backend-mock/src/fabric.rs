//! The rank-to-rank exchange of the mock.
//!
//! Ranks agree on each collective through a numbered slot: each deposits a [`Desc`] (what it
//! was asked to do, and where its buffers are), waits for the others, then reads peers'
//! buffers directly ("pull") in phases separated by barriers. Every wait has a deadline;
//! the first rank to miss one poisons the fabric, and every rank waiting then or later gets
//! the same error instead of hanging.
//!
//! [`Exchange`] is the cut between ranks: [`LocalFabric`] for ranks that are threads of one
//! process, and `procs::ProcFabric` for ranks in different processes (the same
//! `LocalFabric` in rank 0's process, reached over loopback; buffers in shared memory).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use unicomm_core::registry::RegKind;
use unicomm_core::{DataType, Error, ReduceOp, Result};

/// What the ranks must agree on for one collective. Equality is agreement: a pre-multiplied
/// sum's scalar is each rank's own and not compared (the same rule as `exec::agree`, which
/// decides whether peers' memory is touched).
#[derive(Debug, Clone)]
pub(crate) struct Signature {
    pub kind: &'static str,
    pub count: usize,
    pub dtype: Option<DataType>,
    pub op: Option<ReduceOp>,
    pub root: Option<usize>,
    pub send_reg: Option<RegKind>,
    pub recv_reg: Option<RegKind>,
}

impl PartialEq for Signature {
    fn eq(&self, o: &Self) -> bool {
        self.kind == o.kind
            && self.count == o.count
            && self.dtype == o.dtype
            && self.op.map(ReduceOp::shape) == o.op.map(ReduceOp::shape)
            && self.root == o.root
            && self.send_reg == o.send_reg
            && self.recv_reg == o.recv_reg
    }
}
impl Eq for Signature {}

/// One rank's part of one collective.
#[derive(Debug, Clone)]
pub(crate) struct Desc {
    pub sig: Signature,
    /// Address of the first send byte (meaningful only for the ops that send).
    pub send: usize,
    /// Address of the first receive byte.
    pub recv: usize,
    /// Where a peer process finds the send and receive bytes (ranks in different
    /// processes; `None` in one process, where the addresses are shared).
    pub send_at: Option<crate::shm::Remote>,
    pub recv_at: Option<crate::shm::Remote>,
}

/// A posted send, waiting for its receiver.
#[derive(Debug, Clone)]
pub(crate) struct Msg {
    pub id: u64,
    pub addr: usize,
    pub count: usize,
    pub dtype: DataType,
    /// Where a receiver in another process finds the bytes.
    pub at: Option<crate::shm::Remote>,
}

/// The exchange a mock rank needs from its peers.
pub(crate) trait Exchange: Send + Sync {
    /// Deposits `desc` for collective `seq` and returns every rank's, once all arrived.
    fn gather(&self, seq: u64, rank: usize, desc: Desc, deadline: Instant) -> Result<Vec<Desc>>;
    /// Barrier number `phase` of collective `seq`.
    fn phase(&self, seq: u64, rank: usize, phase: u32, deadline: Instant) -> Result<()>;
    /// Marks the start of an access to peers' memory in collective `seq`; fails when the
    /// fabric is poisoned (then no access may start).
    fn enter(&self, seq: u64) -> Result<()>;
    /// Marks the end of an access started by `enter`.
    fn exit(&self, seq: u64);
    /// This rank is done with collective `seq`. After an error, waits until no peer is still
    /// reading or writing memory under `seq`, until `deadline` (a copy does not block, but a
    /// peer's process can be stopped inside one); past it the fabric is poisoned.
    fn leave(&self, seq: u64, failed: bool, deadline: Instant);
    /// Posts a send from `src` to `dst`.
    fn post(&self, src: usize, dst: usize, msg: Msg) -> Result<()>;
    /// Takes the next send from `src` to `dst`.
    fn take(&self, src: usize, dst: usize, deadline: Instant, after: Duration) -> Result<Msg>;
    /// Marks a taken send as copied (`None`) or refused (`Some(error)`, given to the sender).
    fn complete(&self, id: u64, refused: Option<Error>);
    /// Waits until send `id` was copied by its receiver.
    fn wait_sent(&self, id: u64, dst: usize, deadline: Instant, after: Duration) -> Result<()>;
    /// Fails every present and future wait with `e`.
    fn poison(&self, e: Error);
    /// The poison, if any.
    fn poisoned(&self) -> Option<Error>;
    /// `rank` finalized (or dropped) its communicator after joining `joined` collectives: a
    /// peer waiting on a collective it will never join fails at once naming it, a peer not
    /// waiting on one is not disturbed; where peers already wait on such a collective, the
    /// error is this rank's too. Across processes rank 0 (whose process serves the exchange)
    /// then waits, at most `timeout`, until the others did.
    fn depart(&self, rank: usize, joined: u64, timeout: Duration) -> Result<()>;
}

#[derive(Default)]
struct Slot {
    descs: Vec<Option<Desc>>,
    arrived: usize,
    phases: HashMap<u32, usize>,
    active: usize,
    left: usize,
}

#[derive(Default)]
struct State {
    slots: HashMap<u64, Slot>,
    mail: HashMap<(usize, usize), VecDeque<Msg>>,
    copying: HashSet<u64>,
    completed: HashMap<u64, Option<Error>>,
    poison: Option<Error>,
    /// Per rank that finalized or dropped its communicator, the collectives it joined.
    departed: HashMap<usize, u64>,
}

/// The exchange for ranks that are threads of one process.
pub(crate) struct LocalFabric {
    world: usize,
    state: Mutex<State>,
    cv: Condvar,
    timeout: Duration,
}

impl LocalFabric {
    pub(crate) fn new(world: usize, timeout: Duration) -> Self {
        LocalFabric {
            world,
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            timeout,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slot<'s>(&self, st: &'s mut State, seq: u64) -> &'s mut Slot {
        let world = self.world;
        st.slots.entry(seq).or_insert_with(|| Slot {
            descs: vec![None; world],
            ..Slot::default()
        })
    }

    /// The first rank that departed before joining collective `seq` and has not arrived at
    /// it: it never will.
    fn never_joins(&self, st: &State, seq: u64) -> Option<Error> {
        let arrived = |q: usize| st.slots.get(&seq).is_some_and(|s| s.descs[q].is_some());
        let mut gone: Vec<(usize, u64)> = st
            .departed
            .iter()
            .filter(|&(&q, &k)| k <= seq && !arrived(q))
            .map(|(&q, &k)| (q, k))
            .collect();
        gone.sort_unstable();
        gone.first().map(|&(q, k)| short_of(q, k, seq))
    }

    /// Waits on the condvar until `done` holds, the fabric is poisoned, collective `seq`
    /// (where given) lost a rank that departed before it, or the deadline passes (then
    /// poisons it with a `Timeout` naming `what`).
    fn wait_until<'a>(
        &self,
        mut st: MutexGuard<'a, State>,
        (deadline, seq): (Instant, Option<u64>),
        mut done: impl FnMut(&mut State) -> bool,
        what: impl Fn(&State) -> String,
    ) -> Result<MutexGuard<'a, State>> {
        loop {
            // What was awaited counts even if the world was poisoned meanwhile (a rank that
            // already has its result, a Mismatch say, may fail and poison before this one
            // wakes); no memory is touched on that basis: `enter` refuses after a poison.
            if done(&mut st) {
                return Ok(st);
            }
            if let Some(e) = &st.poison {
                return Err(e.clone());
            }
            if let Some(e) = seq.and_then(|seq| self.never_joins(&st, seq)) {
                return Err(e);
            }
            let now = Instant::now();
            if now >= deadline {
                let e = Error::Timeout {
                    what: what(&st),
                    after: self.timeout,
                };
                st.poison = Some(e.clone());
                drop(st);
                self.cv.notify_all();
                return Err(e);
            }
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// A rank that departed after `joined` collectives, while a peer waits on collective `seq`
/// (counted from 0): the ranks disagree on how many collectives they make.
fn short_of(rank: usize, joined: u64, seq: u64) -> Error {
    Error::Mismatch {
        what: "the number of collectives",
        detail: format!(
            "rank {rank} finalized (or dropped) its communicator after {joined} collective(s), and will never join collective {} that its peers called",
            seq + 1
        ),
    }
}

/// Ranks as a user reads them: "1, 3".
fn list(ranks: &[usize]) -> String {
    ranks
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn missing(slot: Option<&Slot>, world: usize) -> Vec<usize> {
    match slot {
        Some(s) => (0..world).filter(|&r| s.descs[r].is_none()).collect(),
        None => (0..world).collect(),
    }
}

impl Exchange for LocalFabric {
    fn gather(&self, seq: u64, rank: usize, desc: Desc, deadline: Instant) -> Result<Vec<Desc>> {
        let kind = desc.sig.kind;
        let mut st = self.lock();
        if let Some(e) = &st.poison {
            return Err(e.clone());
        }
        let slot = self.slot(&mut st, seq);
        slot.descs[rank] = Some(desc);
        slot.arrived += 1;
        let world = self.world;
        drop(st);
        self.cv.notify_all();
        let st = self.wait_until(
            self.lock(),
            (deadline, Some(seq)),
            |st| st.slots.get(&seq).is_some_and(|s| s.arrived == world),
            |st| {
                format!(
                    "collective #{seq} ({kind}): rank(s) {} never arrived (rank {rank} gave up waiting)",
                    list(&missing(st.slots.get(&seq), world))
                )
            },
        )?;
        Ok(st.slots[&seq].descs.iter().flatten().cloned().collect())
    }

    fn phase(&self, seq: u64, rank: usize, phase: u32, deadline: Instant) -> Result<()> {
        let mut st = self.lock();
        *self.slot(&mut st, seq).phases.entry(phase).or_insert(0) += 1;
        drop(st);
        self.cv.notify_all();
        let world = self.world;
        self.wait_until(
            self.lock(),
            (deadline, None),
            |st| st.slots.get(&seq).and_then(|s| s.phases.get(&phase)) == Some(&world),
            |_| format!("collective #{seq}: a peer never finished phase {phase} (rank {rank} gave up waiting)"),
        )
        .map(drop)
    }

    fn enter(&self, seq: u64) -> Result<()> {
        let mut st = self.lock();
        if let Some(e) = &st.poison {
            return Err(e.clone());
        }
        self.slot(&mut st, seq).active += 1;
        Ok(())
    }

    fn exit(&self, seq: u64) {
        let mut st = self.lock();
        if let Some(s) = st.slots.get_mut(&seq) {
            s.active -= 1;
        }
        drop(st);
        self.cv.notify_all();
    }

    fn leave(&self, seq: u64, failed: bool, deadline: Instant) {
        let mut st = self.lock();
        if failed {
            // Peers may be inside a copy that touches this rank's buffers: waited for, until
            // the deadline (a copy does not block, but its process can be stopped in it). No
            // new access starts: the fabric is poisoned or the op failed identically on every
            // rank. Past the deadline the world is poisoned (its peers' buffers can no longer
            // be trusted) and this rank goes on.
            while st.slots.get(&seq).is_some_and(|s| s.active > 0) {
                let now = Instant::now();
                if now >= deadline {
                    let e = Error::aborted("a peer stayed inside a copy of a failed collective past the deadline (its process stopped?)");
                    st.poison.get_or_insert(e);
                    break;
                }
                st = self
                    .cv
                    .wait_timeout(st, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        let world = self.world;
        if let Some(s) = st.slots.get_mut(&seq) {
            s.left += 1;
            if s.left == world {
                st.slots.remove(&seq);
            }
        }
    }

    fn post(&self, src: usize, dst: usize, msg: Msg) -> Result<()> {
        let mut st = self.lock();
        if let Some(e) = &st.poison {
            return Err(e.clone());
        }
        st.mail.entry((src, dst)).or_default().push_back(msg);
        drop(st);
        self.cv.notify_all();
        Ok(())
    }

    fn take(&self, src: usize, dst: usize, deadline: Instant, _after: Duration) -> Result<Msg> {
        let mut taken = None;
        let _st = self.wait_until(
            self.lock(),
            (deadline, None),
            |st| {
                taken = st.mail.get_mut(&(src, dst)).and_then(|q| q.pop_front());
                if let Some(m) = &taken {
                    st.copying.insert(m.id);
                }
                taken.is_some()
            },
            |_| format!("recv of rank {dst} from rank {src}: rank {src} never sent"),
        )?;
        taken.ok_or_else(|| Error::aborted("mailbox emptied while waiting"))
    }

    fn complete(&self, id: u64, refused: Option<Error>) {
        let mut st = self.lock();
        st.copying.remove(&id);
        st.completed.insert(id, refused);
        drop(st);
        self.cv.notify_all();
    }

    fn wait_sent(&self, id: u64, dst: usize, deadline: Instant, _after: Duration) -> Result<()> {
        let mut refused = None;
        let r = self.wait_until(
            self.lock(),
            (deadline, None),
            |st| match st.completed.remove(&id) {
                Some(e) => {
                    refused = e;
                    true
                }
                None => false,
            },
            |_| format!("a send to rank {dst}: rank {dst} never received it"),
        );
        match r {
            Ok(_) => refused.map_or(Ok(()), Err),
            Err(e) => {
                // The receiver may hold the message and be copying from our buffer right now:
                // wait until it is no longer queued-or-copying. A message still queued is
                // withdrawn so that no one reads it later.
                let mut st = self.lock();
                for q in st.mail.values_mut() {
                    q.retain(|m| m.id != id);
                }
                // A copy in progress cannot block, so this wait needs no deadline.
                while st.copying.contains(&id) {
                    st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                st.completed.remove(&id);
                Err(e)
            }
        }
    }

    fn poison(&self, e: Error) {
        let mut st = self.lock();
        st.poison.get_or_insert(e);
        drop(st);
        self.cv.notify_all();
    }

    fn depart(&self, rank: usize, joined: u64, _timeout: Duration) -> Result<()> {
        let mut st = self.lock();
        st.departed.insert(rank, joined);
        // Peers already waiting on a collective this rank never joined: named here too.
        let ahead = st
            .slots
            .iter()
            .filter(|&(&seq, s)| seq >= joined && s.arrived > 0 && s.descs[rank].is_none())
            .map(|(&seq, _)| seq)
            .min();
        drop(st);
        self.cv.notify_all();
        ahead.map_or(Ok(()), |seq| Err(short_of(rank, joined, seq)))
    }

    fn poisoned(&self) -> Option<Error> {
        self.lock().poison.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer whose process stopped inside a copy never ends its access: a rank leaving a
    /// failed collective waits for it only until the deadline, and the world is poisoned
    /// (seen on the mock across processes: the survivors could not exit for as long as the
    /// peer was stopped).
    #[test]
    fn leaving_a_failed_collective_waits_for_a_stuck_peer_only_until_the_deadline() {
        let f = std::sync::Arc::new(LocalFabric::new(2, Duration::from_secs(60)));
        f.enter(7).unwrap(); // the stopped peer, inside its copy for good
        let (tx, rx) = std::sync::mpsc::channel();
        let g = f.clone();
        std::thread::spawn(move || {
            g.leave(7, true, Instant::now() + Duration::from_millis(100));
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(Duration::from_secs(5)).is_ok(),
            "leave waited past its deadline"
        );
        assert!(matches!(f.poisoned(), Some(Error::Aborted { .. })));
    }
}
