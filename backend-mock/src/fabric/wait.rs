//! The exchange's waits as values: each blocking call of [`Exchange`](super::Exchange) is its
//! own part (deposit, count, withdraw), done at once, then a [`Wait`] checked under the
//! fabric's lock until it ends. A rank's thread blocks on the condition variable between
//! checks ([`LocalFabric::block`]); the hub checks every rank's open waits from one event
//! loop when the fabric changes ([`LocalFabric::check_all`]), so a thousand waiting ranks
//! hold no thread each.

use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use unicomm_core::{Error, Result};

use super::local::{list, missing, LocalFabric, State};
use super::types::{Desc, Done, Wait};

/// A wait whose deadline passed: the fabric is poisoned with a `Timeout` naming `what`.
fn timed_out(st: &mut State, what: String, after: Duration) -> Error {
    let e = Error::Timeout { what, after };
    st.poison = Some(e.clone());
    e
}

impl LocalFabric {
    /// One check of `w` at `now`: `Some` once it ended (then `w` is spent), `None` while it
    /// waits (`w` may have moved on: a failed send to its withdrawal). The order is the
    /// blocking calls': what was awaited counts even if the world was poisoned meanwhile (a
    /// rank that already has its result may fail and poison before this one looks; no
    /// memory is touched on that basis: `enter` refuses after a poison), then the poison, a
    /// peer that departed before the collective, the deadline.
    pub(crate) fn check(
        &self,
        st: &mut State,
        w: &mut Wait,
        deadline: Instant,
        now: Instant,
    ) -> Option<Result<Done>> {
        let late = now >= deadline;
        match w {
            Wait::Gather { seq, rank, kind } => self.gathered(st, *seq, *rank, kind, late),
            Wait::Phase { seq, rank, phase } => self.phased(st, *seq, *rank, *phase, late),
            Wait::Take {
                src,
                dst,
                one_sided,
            } => self.taken(st, *src, *dst, *one_sided, late),
            Wait::Sent { id, dst } => {
                let (id, dst) = (*id, *dst);
                if let Some(refused) = st.completed.remove(&id) {
                    return Some(refused.map_or(Ok(Done::Unit), Err));
                }
                let what =
                    |_: &State| format!("a send to rank {dst}: rank {dst} never received it");
                let Some(Err(e)) = self.not_yet(st, |_| None, late, what) else {
                    return None;
                };
                // The receiver may hold the message and be copying from the sender's buffer
                // right now: a message still queued is withdrawn so that no one reads it
                // later, and the wait goes on until no copy of it runs.
                for q in st.mail.values_mut() {
                    q.retain(|m| m.id != id);
                }
                *w = Wait::Unsend { id, e };
                self.check(st, w, deadline, now)
            }
            Wait::Unsend { id, e } => {
                if st.copying.contains(id) {
                    return None;
                }
                st.completed.remove(id);
                Some(Err(e.clone()))
            }
            Wait::Leave { seq } => self.leaving(st, *seq, late),
        }
    }

    /// Phase `phase` of collective `seq`'s check: every rank past it.
    fn phased(
        &self,
        st: &mut State,
        seq: u64,
        rank: usize,
        phase: u32,
        late: bool,
    ) -> Option<Result<Done>> {
        if st.slots.get(&seq).and_then(|s| s.phases.get(&phase)) == Some(&self.world) {
            return Some(Ok(Done::Unit));
        }
        self.not_yet(st, |_| None, late, |_| {
            format!("collective #{seq}: a peer never finished phase {phase} (rank {rank} gave up waiting)")
        })
    }

    /// A take's check: the next message of mailbox `(src, dst, one_sided)`.
    fn taken(
        &self,
        st: &mut State,
        src: usize,
        dst: usize,
        one_sided: bool,
        late: bool,
    ) -> Option<Result<Done>> {
        let q = st.mail.get_mut(&(src, dst, one_sided));
        if let Some(m) = q.and_then(|q| q.pop_front()) {
            if !one_sided {
                // A one-sided message is never completed: nothing to wait for.
                st.copying.insert(m.id);
            }
            return Some(Ok(Done::Msg(m)));
        }
        self.not_yet(
            st,
            |_| None,
            late,
            |_| match one_sided {
                false => format!("recv of rank {dst} from rank {src}: rank {src} never sent"),
                true => format!(
                    "a wait of rank {dst} for signals of rank {src}: rank {src} never signalled"
                ),
            },
        )
    }

    /// Leaving collective `seq`'s check: once no peer is inside a copy of it (past the
    /// deadline, a peer still inside poisons the world).
    fn leaving(&self, st: &mut State, seq: u64, late: bool) -> Option<Result<Done>> {
        let busy = st.slots.get(&seq).is_some_and(|s| s.active > 0);
        if busy && !late {
            return None;
        }
        if busy {
            // A peer's process stopped inside its copy: its peers' buffers can no longer be
            // trusted.
            let e = Error::aborted("a peer stayed inside a copy of a failed collective past the deadline (its process stopped?)");
            st.poison.get_or_insert(e);
        }
        self.left(st, seq);
        Some(Ok(Done::Unit))
    }

    /// Gather `seq`'s check: every rank's description, once all arrived.
    fn gathered(
        &self,
        st: &mut State,
        seq: u64,
        rank: usize,
        kind: &str,
        late: bool,
    ) -> Option<Result<Done>> {
        let world = self.world;
        if let Some(s) = st.slots.get_mut(&seq).filter(|s| s.arrived == world) {
            let all = match &s.all {
                Some(all) => all.clone(),
                None => {
                    let all: Arc<[Desc]> = s.descs.iter().flatten().cloned().collect();
                    s.all.insert(all).clone()
                }
            };
            return Some(Ok(Done::Descs(all)));
        }
        self.not_yet(st, |st| self.never_joins(st, seq), late, |st| {
            format!(
                "collective #{seq} ({kind}): rank(s) {} never arrived (rank {rank} gave up waiting)",
                list(&missing(st.slots.get(&seq), world))
            )
        })
    }

    /// A wait whose own condition does not hold yet, in the blocking calls' order: the
    /// poison, then `gone` (a peer that departed before the collective), then the deadline
    /// (`late`: the fabric is poisoned with a `Timeout` saying `what`); `None` while none is.
    fn not_yet(
        &self,
        st: &mut State,
        gone: impl FnOnce(&State) -> Option<Error>,
        late: bool,
        what: impl FnOnce(&State) -> String,
    ) -> Option<Result<Done>> {
        if let Some(e) = &st.poison {
            return Some(Err(e.clone()));
        }
        if let Some(e) = gone(st) {
            return Some(Err(e));
        }
        late.then(|| {
            let what = what(st);
            Err(timed_out(st, what, self.timeout))
        })
    }

    /// Blocks the calling thread until `w` ends (the condition variable between checks).
    pub(crate) fn block(&self, mut w: Wait, deadline: Instant) -> Result<Done> {
        let mut st = self.lock();
        loop {
            let was = st.poison.is_some();
            let now = Instant::now();
            if let Some(r) = self.check(&mut st, &mut w, deadline, now) {
                self.changed_if_poisoned(st, was);
                return r;
            }
            // A withdrawal has no deadline of its own: woken by the copy's end.
            let left = match w.has_deadline() {
                true => deadline.saturating_duration_since(now),
                false => Duration::from_secs(1),
            };
            st = self
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Checks every open wait of `waits` (`(wait, deadline)` with a key of the caller's) at
    /// once, under one lock: the ended ones are removed and returned with their result.
    pub(crate) fn check_all<K>(
        &self,
        waits: &mut Vec<(K, Wait, Instant)>,
        now: Instant,
    ) -> Vec<(K, Result<Done>)> {
        let mut ended = Vec::new();
        let mut st = self.lock();
        let was = st.poison.is_some();
        let mut i = 0;
        while i < waits.len() {
            let (_, w, deadline) = &mut waits[i];
            match self.check(&mut st, w, *deadline, now) {
                Some(r) => {
                    let (k, _, _) = waits.swap_remove(i);
                    ended.push((k, r));
                }
                None => i += 1,
            }
        }
        self.changed_if_poisoned(st, was);
        ended
    }

    /// Releases the lock; a check that poisoned the fabric (`was`: poisoned before it) tells
    /// every waiter.
    fn changed_if_poisoned(&self, st: MutexGuard<'_, State>, was: bool) {
        let poisoned = !was && st.poison.is_some();
        drop(st);
        if poisoned {
            self.changed();
        }
    }
}
