//! [`LocalFabric`]: the exchange for ranks that are threads of one process (and, in rank 0's
//! process, the hub's): the slots, mailboxes and poison under one lock, and each blocking
//! call's own part; the waits are `wait.rs`'s.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use unicomm_core::{Error, Result};

use super::types::{Desc, Done, Exchange, Msg, Wait};

#[derive(Default)]
pub(super) struct Slot {
    pub(super) descs: Vec<Option<Desc>>,
    pub(super) arrived: usize,
    /// Every rank's description once all arrived, made once for every rank that reads it
    /// (at a thousand ranks a million descriptions otherwise).
    pub(super) all: Option<std::sync::Arc<[Desc]>>,
    pub(super) phases: HashMap<u32, usize>,
    pub(super) active: usize,
    pub(super) left: usize,
}

#[derive(Default)]
pub(crate) struct State {
    pub(super) slots: HashMap<u64, Slot>,
    pub(super) mail: HashMap<(usize, usize, bool), VecDeque<Msg>>,
    pub(super) copying: HashSet<u64>,
    pub(super) completed: HashMap<u64, Option<Error>>,
    pub(super) poison: Option<Error>,
    /// Per rank that finalized or dropped its communicator, the collectives it joined.
    departed: HashMap<usize, u64>,
}

/// The exchange for ranks that are threads of one process.
pub(crate) struct LocalFabric {
    pub(super) world: usize,
    state: Mutex<State>,
    pub(super) cv: Condvar,
    pub(super) timeout: Duration,
    /// Told of every change after the waiting threads are (the hub's event loop, which
    /// checks its ranks' waits then).
    on_change: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl LocalFabric {
    pub(crate) fn new(world: usize, timeout: Duration) -> Self {
        LocalFabric {
            world,
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            timeout,
            on_change: OnceLock::new(),
        }
    }

    /// `f` is called after every change of the exchange's state, from the thread that made
    /// it (set once: the hub's wake-up).
    pub(crate) fn on_change(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_change.set(f);
    }

    /// The state changed: the waiting threads check again, and the hub.
    pub(super) fn changed(&self) {
        self.cv.notify_all();
        if let Some(f) = self.on_change.get() {
            f();
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
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
    pub(super) fn never_joins(&self, st: &State, seq: u64) -> Option<Error> {
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
pub(super) fn list(ranks: &[usize]) -> String {
    ranks
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn missing(slot: Option<&Slot>, world: usize) -> Vec<usize> {
    match slot {
        Some(s) => (0..world).filter(|&r| s.descs[r].is_none()).collect(),
        None => (0..world).collect(),
    }
}

/// The calls' own parts, done at once; each returns the [`Wait`] that completes it.
impl LocalFabric {
    /// Deposits `desc` for collective `seq`.
    pub(crate) fn start_gather(&self, seq: u64, rank: usize, desc: Desc) -> Result<Wait> {
        let kind = desc.sig.kind;
        let mut st = self.lock();
        if let Some(e) = &st.poison {
            return Err(e.clone());
        }
        let slot = self.slot(&mut st, seq);
        slot.descs[rank] = Some(desc);
        slot.arrived += 1;
        drop(st);
        self.changed();
        Ok(Wait::Gather { seq, rank, kind })
    }

    /// Counts `rank` past barrier `phase` of collective `seq`.
    pub(crate) fn start_phase(&self, seq: u64, rank: usize, phase: u32) -> Wait {
        let mut st = self.lock();
        *self.slot(&mut st, seq).phases.entry(phase).or_insert(0) += 1;
        drop(st);
        self.changed();
        Wait::Phase { seq, rank, phase }
    }

    /// Leaves collective `seq`: at once after a success, else (peers may be inside a copy
    /// that touches this rank's buffers) the wait for them.
    pub(crate) fn start_leave(&self, seq: u64, failed: bool) -> Option<Wait> {
        if failed {
            return Some(Wait::Leave { seq });
        }
        self.left(&mut self.lock(), seq);
        None
    }

    /// One more rank left collective `seq`; the last one frees its slot.
    pub(super) fn left(&self, st: &mut State, seq: u64) {
        let world = self.world;
        if let Some(s) = st.slots.get_mut(&seq) {
            s.left += 1;
            if s.left == world {
                st.slots.remove(&seq);
            }
        }
    }

    fn wait(&self, w: Wait, deadline: Instant) -> Result<()> {
        self.block(w, deadline).map(drop)
    }
}

impl LocalFabric {
    /// The next message of mailbox `(src, dst, one_sided)`, until `deadline`.
    fn take_from(&self, src: usize, dst: usize, one_sided: bool, deadline: Instant) -> Result<Msg> {
        let wait = Wait::Take {
            src,
            dst,
            one_sided,
        };
        match self.block(wait, deadline)? {
            Done::Msg(m) => Ok(m),
            _ => Err(Error::aborted("mailbox emptied while waiting")),
        }
    }
}

impl Exchange for LocalFabric {
    fn gather(&self, seq: u64, rank: usize, desc: Desc, deadline: Instant) -> Result<Vec<Desc>> {
        match self.block(self.start_gather(seq, rank, desc)?, deadline)? {
            Done::Descs(all) => Ok(all.to_vec()),
            _ => Err(Error::aborted("the exchange gave no descriptions")),
        }
    }

    fn phase(&self, seq: u64, rank: usize, phase: u32, deadline: Instant) -> Result<()> {
        self.wait(self.start_phase(seq, rank, phase), deadline)
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
        self.changed();
    }

    fn leave(&self, seq: u64, failed: bool, deadline: Instant) {
        if let Some(w) = self.start_leave(seq, failed) {
            let _ = self.block(w, deadline);
        }
    }

    fn post(&self, src: usize, dst: usize, msg: Msg) -> Result<()> {
        let mut st = self.lock();
        if let Some(e) = &st.poison {
            return Err(e.clone());
        }
        let one_sided = msg.load.is_some();
        st.mail
            .entry((src, dst, one_sided))
            .or_default()
            .push_back(msg);
        drop(st);
        self.changed();
        Ok(())
    }

    fn take(&self, src: usize, dst: usize, deadline: Instant, _after: Duration) -> Result<Msg> {
        self.take_from(src, dst, false, deadline)
    }

    fn take_one_sided(&self, src: usize, dst: usize, deadline: Instant) -> Result<Msg> {
        self.take_from(src, dst, true, deadline)
    }

    fn complete(&self, id: u64, refused: Option<Error>) {
        let mut st = self.lock();
        st.copying.remove(&id);
        st.completed.insert(id, refused);
        drop(st);
        self.changed();
    }

    fn wait_sent(&self, id: u64, dst: usize, deadline: Instant, _after: Duration) -> Result<()> {
        self.wait(Wait::Sent { id, dst }, deadline)
    }

    fn poison(&self, e: Error) {
        let mut st = self.lock();
        st.poison.get_or_insert(e);
        drop(st);
        self.changed();
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
        self.changed();
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
