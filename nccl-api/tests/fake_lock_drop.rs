//! A communicator dropped while another thread's abort of it is stuck in the library (the
//! abort holds the communicator's lock) returns at twice the communicator's deadline,
//! leaving the communicator to that abort, instead of waiting for it to end: the stream's
//! wait aborts the communicator at its deadline, and the fake's abort is made to wait (as
//! NCCL 2.28's does for the device) until the test lets it go. Alone in its binary (the
//! fake's abort control and the host stream's hang are process-wide).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{calls, comm, fake, flavors, HANG};
use unicomm_core::{Error, ReduceOp};

/// While 1, the fake's ncclCommAbort waits (at most 20 s).
static ABORT_HELD: AtomicUsize = AtomicUsize::new(0);

#[test]
fn a_drop_behind_a_stuck_abort_returns_at_twice_the_deadline() {
    let path = fake("nccl228");
    let c = comm(flavors(false, false), &path);
    // SAFETY: the fake's test control, in the library the communicator loaded (kept loaded
    // by it); `ABORT_HELD` is a static.
    unsafe {
        let lib = libloading::Library::new(&path).unwrap();
        let f: libloading::Symbol<unsafe extern "C" fn(*const AtomicUsize)> =
            lib.get(b"unicommFakeAbortWaitsFor\0").unwrap();
        f(&ABORT_HELD);
    }
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
    // abort then waits for `ABORT_HELD`, with the communicator's lock held.
    let waiter = std::thread::spawn(move || st.synchronize());
    let t = Instant::now();
    while calls(&path, "ncclCommAbort") == aborts {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the stream never aborted"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let t = Instant::now();
    drop(b);
    drop(c);
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(200), "{waited:?}");
    assert!(
        waited < Duration::from_secs(3),
        "the drop waited for the abort: {waited:?}"
    );
    // The drop left the communicator to the abort: no finalize, no second abort (read
    // while the abort still holds the library loaded).
    assert_eq!(calls(&path, "ncclCommAbort") - aborts, 1);
    assert_eq!(calls(&path, "ncclCommFinalize") - finalizes, 0);
    // Let the abort end: the stream's wait reports its deadline.
    ABORT_HELD.store(0, Ordering::SeqCst);
    HANG.store(false, Ordering::SeqCst);
    let r = waiter.join().unwrap();
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
}
