//! While a live graph holds a communicator, NCCL's abort does not return until the graph is
//! destroyed, so waiting the whole deadline for it only delays the error: on 1x H200, NCCL
//! 2.32.3, 2 ranks in multi-rank mode, a peer SIGKILLed during the replays, the survivor's
//! stream wait timed out at its 20 s deadline and then waited 20 s more in the abort. The
//! abort is given a short grace instead, and the rest finishes when the last graph goes.
//! In a process of its own (the fake's abort control is process-wide).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::{aborts_wait_while, comm, fake, flavors, released_after};
use unicomm_core::{Collective, Error};

/// While 1, the fake's ncclCommAbort waits (at most 20 s).
static ABORT_HELD: AtomicUsize = AtomicUsize::new(0);

isolated! {
    #[test]
    fn an_abort_held_by_live_graphs_is_given_a_grace_not_the_deadline() {
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        aborts_wait_while(&path, &ABORT_HELD);
        c.set_timeout(Duration::from_secs(10)).unwrap();
        c.backend().graphs_held();
        ABORT_HELD.store(1, Ordering::SeqCst);
        let t = Instant::now();
        let r = c.abort();
        let waited = t.elapsed();
        assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
        assert!(
            waited >= Duration::from_millis(900) && waited < Duration::from_secs(3),
            "the abort under live graphs waited {waited:?} (a 1 s grace was due, not the 10 s deadline)"
        );
        // The graphs gone: the release waits for the abort to return, then the abort is done.
        let waited = released_after(&ABORT_HELD, Duration::from_millis(300), || {
            c.backend().graphs_released()
        });
        assert!(
            waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
            "the release did not wait for the abort to return: {waited:?}"
        );
    }
}
