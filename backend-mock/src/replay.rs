//! Work a captured graph replays: an operation enqueued while its stream captures is kept,
//! and each launch enqueues it again as a new operation (a collective takes the next
//! sequence number, so the ranks meet in a fresh fabric slot, as an eager call would).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use unicomm_core::Result;

use crate::exec::batch::run_batch;
use crate::exec::{Task, Work};

impl Work {
    /// The same work as a new operation (a graph's replay): a collective takes the next
    /// sequence number of `seq`.
    pub(crate) fn again(&self, seq: &AtomicU64) -> Work {
        let mut w = self.clone();
        if let Work::Coll { seq: s, .. } = &mut w {
            *s = seq.fetch_add(1, Ordering::Relaxed);
        }
        w
    }
}

impl Task {
    /// The same operation again, as a graph's replay enqueues it.
    fn again(&self) -> Task {
        let (seq, issued) = &self.counters;
        Task {
            ctx: self.ctx.clone(),
            index: match self.index {
                u64::MAX => u64::MAX,
                _ => issued.fetch_add(1, Ordering::Relaxed),
            },
            work: self.work.again(seq),
            counters: self.counters.clone(),
        }
    }
}

/// Enqueues `tasks` (one operation, or a group's for one stream) on `stream`: run once, or
/// recorded for a graph's replays while the stream captures.
pub(crate) fn enqueue_batch(stream: &crate::stream::Inner, tasks: Vec<Task>) -> Result<()> {
    if !stream.capturing() {
        return stream.push(Box::new(move || run_batch(tasks)));
    }
    let tasks = Arc::new(tasks);
    stream.push_replayable(Arc::new(move || {
        let again: Vec<Task> = tasks.iter().map(Task::again).collect();
        Box::new(move || run_batch(again))
    }))
}
