//! The ranks of one world created in one process (`ApiComm::init_local`): where their
//! window registrations meet to swap addresses, with a deadline.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use unicomm_core::{Error, Result};

/// One rank's part of a window as this rank sees it: the device it lives on, its address
/// in this process (mapped here where the rank is another process), and its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerPart {
    pub dev: usize,
    pub addr: usize,
    pub bytes: usize,
}

/// One window as every rank sees it: each rank's part.
pub(crate) type Peers = Arc<Vec<PeerPart>>;

/// A child's world being handed to its members: the world and the members still to take it.
type Forming = (Arc<LocalWorld>, usize);

/// The ranks of one world created in one process: a table where window registrations meet.
#[derive(Debug)]
pub(crate) struct LocalWorld {
    world: usize,
    slots: Mutex<HashMap<u64, Slot>>,
    cv: Condvar,
    /// The worlds of this world's children being made, by (split, color).
    children: Mutex<HashMap<(u64, u32), Forming>>,
}

#[derive(Debug, Default)]
struct Slot {
    entries: Vec<Option<PeerPart>>,
    taken: usize,
}

/// How long a rank waits for its peers at a window registration.
const EXCHANGE_DEADLINE: Duration = Duration::from_secs(60);

impl LocalWorld {
    /// The world of the child of split `split` with `color` and `members` ranks: made by the
    /// first member that asks, handed to the others, forgotten once all took it.
    pub(crate) fn child(&self, split: u64, color: u32, members: usize) -> Arc<LocalWorld> {
        let mut c = self.children.lock().unwrap_or_else(|e| e.into_inner());
        let entry = c
            .entry((split, color))
            .or_insert_with(|| (Arc::new(LocalWorld::new(members)), members));
        entry.1 = entry.1.saturating_sub(1);
        let w = entry.0.clone();
        if entry.1 == 0 {
            c.remove(&(split, color));
        }
        w
    }

    pub(crate) fn new(world: usize) -> Self {
        LocalWorld {
            world,
            slots: Mutex::new(HashMap::new()),
            cv: Condvar::new(),
            children: Mutex::new(HashMap::new()),
        }
    }

    /// Deposits this rank's entry for registration number `seq` and returns every rank's,
    /// once all arrived (`Timeout` naming the missing ranks after the deadline).
    pub(crate) fn exchange(&self, seq: u64, rank: usize, entry: PeerPart) -> Result<Peers> {
        let deadline = Instant::now() + EXCHANGE_DEADLINE;
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let world = self.world;
        let slot = slots.entry(seq).or_insert_with(|| Slot {
            entries: vec![None; world],
            taken: 0,
        });
        slot.entries[rank] = Some(entry);
        self.cv.notify_all();
        let complete = |s: &HashMap<u64, Slot>| {
            s.get(&seq)
                .is_some_and(|s| s.entries.iter().all(Option::is_some))
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let (mut slots, _) = self
            .cv
            .wait_timeout_while(slots, left, |s| !complete(s))
            .unwrap_or_else(|e| e.into_inner());
        if !complete(&slots) {
            let missing: Vec<String> = slots
                .get(&seq)
                .map(|s| {
                    (0..world)
                        .filter(|&r| s.entries[r].is_none())
                        .map(|r| r.to_string())
                        .collect()
                })
                .unwrap_or_default();
            return Err(Error::Timeout {
                what: format!(
                    "window registration #{seq}: rank(s) {} never registered theirs",
                    missing.join(", ")
                ),
                after: EXCHANGE_DEADLINE,
            });
        }
        let slot = slots
            .get_mut(&seq)
            .ok_or_else(|| Error::invalid("window", "exchange slot vanished"))?;
        let all: Vec<PeerPart> = slot.entries.iter().flatten().copied().collect();
        slot.taken += 1;
        if slot.taken == world {
            slots.remove(&seq);
        }
        Ok(Arc::new(all))
    }
}

/// Memory swapped between processes: every rank's (device, address here, bytes), and the
/// peers' allocations mapped into this process for it, (address, size).
pub(crate) type Swapped = (Vec<PeerPart>, Vec<(usize, usize)>);
