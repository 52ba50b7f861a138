//! The thread's NCCL group (`ncclGroupStart`/`ncclGroupEnd` nest per thread): how deep it
//! is, and which communicators its calls used, so that the outermost end settles them
//! (non-blocking mode: NCCL's rule is that a group's communicators are settled before the
//! caller waits on a stream). What cannot be deferred to the group's end (copies,
//! collective registrations, the ranks' agreement) asks [`in_group`] and stays out.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use crate::watch::Watched;

thread_local! {
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    static MEMBERS: RefCell<Vec<Arc<dyn Watched>>> = const { RefCell::new(Vec::new()) };
}

/// Whether this thread is inside a group.
#[inline]
pub(crate) fn in_group() -> bool {
    DEPTH.with(|d| d.get()) > 0
}

/// `ncclGroupStart` succeeded: one level deeper.
pub(crate) fn enter() {
    DEPTH.with(|d| d.set(d.get() + 1));
}

/// `ncclGroupEnd` is being called: one level up. The members to settle when this was the
/// outermost end, else none.
pub(crate) fn leave() -> Option<Vec<Arc<dyn Watched>>> {
    let depth = DEPTH.with(|d| {
        d.set(d.get().saturating_sub(1));
        d.get()
    });
    (depth == 0).then(|| MEMBERS.with(|m| std::mem::take(&mut *m.borrow_mut())))
}

/// Remembers `member` as used by the thread's open group (once).
pub(crate) fn join(member: Arc<dyn Watched>) {
    MEMBERS.with(|m| {
        let mut m = m.borrow_mut();
        if !m.iter().any(|x| Arc::ptr_eq(x, &member)) {
            m.push(member);
        }
    });
}
