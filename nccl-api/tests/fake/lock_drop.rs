//! A library abort that never returns (NCCL 2.28.9's, with a peer SIGKILLed during a CUDA
//! graph's replays, on 1x H200) is left to its thread at the communicator's deadline: the
//! stream's wait that aborted the communicator reports its `Timeout`, and the communicator
//! is dropped at once, without a second abort or a finalize. The fake's abort is made to
//! wait until the test lets it go. In a process of its own (the fake's abort control and the
//! host stream's hang are process-wide).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::{aborts_wait_while, calls, comm, fake, flavors, HANG};
use unicomm_core::{Error, ReduceOp};

/// While 1, the fake's ncclCommAbort waits (at most 20 s).
static ABORT_HELD: AtomicUsize = AtomicUsize::new(0);

isolated! {
    #[test]
    fn a_stuck_library_abort_is_left_at_the_deadline_and_nothing_waits_for_it() {
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        aborts_wait_while(&path, &ABORT_HELD);
        let st = c.create_stream().unwrap();
        let mut b = c.alloc::<f32>(4).unwrap();
        c.set_timeout(Duration::from_millis(100)).unwrap();
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
        let (aborts, finalizes) = (
            calls(&path, "ncclCommAbort"),
            calls(&path, "ncclCommFinalize"),
        );
        ABORT_HELD.store(1, Ordering::SeqCst);
        HANG.store(true, Ordering::SeqCst);
        // The stream's wait passes its deadline and aborts the communicator, whose library
        // abort then waits for `ABORT_HELD` (20 s at most): the wait ends one deadline later.
        let t = Instant::now();
        let r = std::thread::spawn(move || st.synchronize()).join().unwrap();
        let waited = t.elapsed();
        assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
        assert!(
            waited < Duration::from_secs(3),
            "the stream's wait waited for the library's abort: {waited:?}"
        );
        assert_eq!(calls(&path, "ncclCommAbort") - aborts, 1);
        let t = Instant::now();
        drop(b);
        drop(c);
        let waited = t.elapsed();
        assert!(
            waited < Duration::from_secs(1),
            "the drop waited for the abort: {waited:?}"
        );
        // The drop left the communicator to the abort: no finalize, no second abort (read
        // while the abort still holds the library loaded).
        assert_eq!(calls(&path, "ncclCommAbort") - aborts, 1);
        assert_eq!(calls(&path, "ncclCommFinalize") - finalizes, 0);
        ABORT_HELD.store(0, Ordering::SeqCst);
        HANG.store(false, Ordering::SeqCst);
    }
}
