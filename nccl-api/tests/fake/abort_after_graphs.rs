//! NCCL's abort returns only once every CUDA graph that captured the communicator's work is
//! destroyed (its teardown waits for the graphs' references; on 1x H200, NCCL 2.28.9, a
//! peer SIGKILLed during a graph's replays left the survivor's abort waiting while the graph
//! lived). An abort given up at the deadline therefore finishes after the last graph goes,
//! and that graph's drop (`graphs_released`) waits for it, at most the deadline, so that a
//! process exiting next does not exit under the library's teardown (one run in four ended
//! in a segmentation fault at exit). The fake's abort is held by the test in place of the
//! graphs. In a process of its own (the fake's abort control is process-wide).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::{aborts_wait_while, comm, fake, flavors, released_after};
use unicomm_core::{Collective, Error};

/// While 1, the fake's ncclCommAbort waits (at most 20 s).
static ABORT_HELD: AtomicUsize = AtomicUsize::new(0);

isolated! {
    #[test]
    fn the_last_graphs_release_waits_for_a_given_up_abort_within_the_deadline() {
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        aborts_wait_while(&path, &ABORT_HELD);
        c.set_timeout(Duration::from_millis(300)).unwrap();
        ABORT_HELD.store(1, Ordering::SeqCst);
        let r = c.abort();
        assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
        // The abort still held: the release waits its deadline, not longer.
        let t = Instant::now();
        c.backend().graphs_released();
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(250) && waited < Duration::from_secs(2),
            "the release did not wait for the abort, or not within the deadline: {waited:?}"
        );
        // The graphs gone 400 ms from now: the release returns once the abort has.
        c.set_timeout(Duration::from_secs(5)).unwrap();
        let waited = released_after(&ABORT_HELD, Duration::from_millis(400), || {
            c.backend().graphs_released()
        });
        assert!(
            waited >= Duration::from_millis(350) && waited < Duration::from_secs(3),
            "the release did not wait for the abort to return: {waited:?}"
        );
    }
}
