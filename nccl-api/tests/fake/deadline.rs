//! Deadlines, asynchronous errors and non-blocking communicators against the fake NCCL
//! (alone in this binary: the tests share the fake's counters and the stuck-stream switch,
//! so they run one at a time).

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{calls, comm, fake, flavors, Host, HANG};
use unicomm_core::{Buffer, Comm, Error, ReduceOp};
use unicomm_nccl_api::{Api, ApiComm, ApiStream};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// One test at a time, each with non-blocking communicators (`UNICOMM_NONBLOCKING=1`)
/// unless it says otherwise.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    let g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("UNICOMM_NONBLOCKING", "1");
    g
}

/// Unsticks the host streams even when a test fails.
struct Unhang;
impl Drop for Unhang {
    fn drop(&mut self) {
        HANG.store(false, Ordering::SeqCst);
    }
}

type Fake = (std::path::PathBuf, libloading::Library);

fn loaded() -> Fake {
    let path = fake("nccl228");
    // SAFETY: the fake's initialisers do nothing; held so its counters live on.
    let keep = unsafe { libloading::Library::new(&path) }.unwrap();
    (path, keep)
}

fn set_async_error(f: &Fake, c: &Comm<ApiComm<Host>>, code: i32) {
    // SAFETY: the fake's test control; a live communicator of the fake.
    unsafe {
        let s: libloading::Symbol<unsafe extern "C" fn(*mut std::ffi::c_void, i32)> =
            f.1.get(b"unicommFakeSetAsyncError\0").unwrap();
        s(c.backend().raw_comm(), code)
    }
}

/// One of the fake's test controls that take only the communicator (`symbol`, NUL-ended).
fn control(f: &Fake, c: &Comm<ApiComm<Host>>, symbol: &[u8]) {
    // SAFETY: as above.
    unsafe {
        let s: libloading::Symbol<unsafe extern "C" fn(*mut std::ffi::c_void)> =
            f.1.get(symbol).unwrap();
        s(c.backend().raw_comm())
    }
}

/// A communicator of the fake, a stream and four floats: where most tests here start.
struct Fixture {
    c: Comm<ApiComm<Host>>,
    st: ApiStream<Host>,
    b: Buffer<f32, ApiComm<Host>>,
}

fn fixture(f: &Fake) -> Fixture {
    let c = comm(flavors(false, false), &f.0);
    let st = c.create_stream().unwrap();
    let b = c.alloc::<f32>(4).unwrap();
    Fixture { c, st, b }
}

fn stick(f: &Fake, c: &Comm<ApiComm<Host>>) {
    control(f, c, b"unicommFakeStickInProgress\0");
}

fn stuck_stream() {
    let f = loaded();
    let Fixture { c, st, mut b } = fixture(&f);
    c.set_timeout(Duration::from_millis(300)).unwrap();
    let aborts = calls(&f.0, "ncclCommAbort");
    let _u = Unhang;
    HANG.store(true, Ordering::SeqCst);
    c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
    let t = Instant::now();
    let r = st.synchronize();
    let waited = t.elapsed();
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    assert!(waited < Duration::from_millis(1500), "{waited:?}");
    assert_eq!(calls(&f.0, "ncclCommAbort") - aborts, 1);
    let r = c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st);
    assert!(matches!(r, Err(Error::Aborted { .. })), "{r:?}");
    // A copy to the host on the still-stuck stream ends at once: its communicator is
    // aborted.
    let t = Instant::now();
    let r = b.copy_to_host(&st);
    assert!(matches!(r, Err(Error::Aborted { .. })), "{r:?}");
    assert!(
        t.elapsed() < Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    // Unstuck (the aborted kernels exit), the stream drains. Its waits reported the abort
    // already (the `Timeout`): the next wait is not an error again.
    HANG.store(false, Ordering::SeqCst);
    st.synchronize().unwrap();
}

isolated! {
    /// Created non-blocking (ncclCommInitRankConfig), every call that reports ncclInProgress is
    /// settled before it returns, and the data are right.
    #[test]
    fn nonblocking_communicators_settle_every_call() {
        let _s = serial();
        let f = loaded();
        let (cfg, polls, inprog) = (
            calls(&f.0, "ncclCommInitRankConfig"),
            calls(&f.0, "ncclCommGetAsyncError"),
            calls(&f.0, "inProgress"),
        );
        let c = comm(flavors(false, false), &f.0);
        assert_eq!(calls(&f.0, "ncclCommInitRankConfig") - cfg, 1);
        let st = c.create_stream().unwrap();
        let mut src = c.alloc::<f32>(3).unwrap();
        src.copy_from_host(&[1.0, 2.0, 3.0], &st).unwrap();
        let mut dst = c.alloc::<f32>(3).unwrap();
        c.all_reduce(&src, &mut dst, ReduceOp::Sum, &st).unwrap();
        st.synchronize().unwrap();
        assert_eq!(dst.copy_to_host(&st).unwrap(), vec![1.0, 2.0, 3.0]);
        // Init and the all-reduce each reported ncclInProgress and were polled to the end
        // (3 polls each in the fake) before the next call.
        assert!(calls(&f.0, "inProgress") - inprog >= 2);
        assert!(calls(&f.0, "ncclCommGetAsyncError") - polls >= 8);
        c.finalize().unwrap();
    }

    /// NCCL's non-blocking rule: only a call that answered ncclInProgress must be polled; one
    /// that answered ncclSuccess is enqueued. A connected non-blocking communicator answers
    /// ncclSuccess, so its collectives cost no ncclCommGetAsyncError each (the hot path).
    #[test]
    fn nonblocking_calls_answered_success_are_not_polled() {
        let _s = serial();
        let f = loaded();
        let c = comm(flavors(false, false), &f.0);
        let st = c.create_stream().unwrap();
        let mut b = c.alloc::<f32>(3).unwrap();
        b.copy_from_host(&[1.0, 2.0, 3.0], &st).unwrap();
        control(&f, &c, b"unicommFakeAnswerSuccess\0");
        let polls = calls(&f.0, "ncclCommGetAsyncError");
        for _ in 0..10 {
            c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
        }
        assert_eq!(calls(&f.0, "ncclCommGetAsyncError"), polls);
        assert_eq!(b.copy_to_host(&st).unwrap(), vec![1.0, 2.0, 3.0]);
        c.finalize().unwrap();
    }

    /// `UNICOMM_NONBLOCKING=0` (the default) keeps ncclCommInitRank; bad values and a bad
    /// `UNICOMM_TIMEOUT_MS` are refused, naming the variable.
    #[test]
    fn the_mode_and_deadline_variables_are_validated() {
        let _s = serial();
        let f = loaded();
        let api = || Arc::new(Api::open(flavors(false, false), &f.0).unwrap());
        std::env::remove_var("UNICOMM_NONBLOCKING");
        let before = calls(&f.0, "ncclCommInitRank");
        let c = ApiComm::init_local(api(), Arc::new(Host), &[0]).unwrap();
        assert_eq!(calls(&f.0, "ncclCommInitRank") - before, 1);
        drop(c);
        std::env::set_var("UNICOMM_NONBLOCKING", "0");
        let c = ApiComm::init_local(api(), Arc::new(Host), &[0]).unwrap();
        assert_eq!(calls(&f.0, "ncclCommInitRank") - before, 2);
        drop(c);
        for (var, bad) in [
            ("UNICOMM_NONBLOCKING", "yes"),
            ("UNICOMM_TIMEOUT_MS", "0"),
            ("UNICOMM_TIMEOUT_MS", "86400001"),
            ("UNICOMM_TIMEOUT_MS", "10s"),
        ] {
            std::env::set_var(var, bad);
            let e = ApiComm::init_local(api(), Arc::new(Host), &[0]).unwrap_err();
            assert!(
                matches!(&e, Error::InvalidArgument { argument, .. } if *argument == var),
                "{var}={bad}: {e}"
            );
            std::env::remove_var(var);
        }
        std::env::set_var("UNICOMM_TIMEOUT_MS", "1234");
        let c = comm(flavors(false, false), &f.0);
        assert_eq!(c.timeout(), Some(Duration::from_millis(1234)));
        std::env::remove_var("UNICOMM_TIMEOUT_MS");
        assert!(c.set_timeout(Duration::ZERO).is_err());
        assert!(c.set_timeout(Duration::from_secs(90_000)).is_err());
        c.set_timeout(Duration::from_millis(5)).unwrap();
        assert_eq!(c.timeout(), Some(Duration::from_millis(5)));
    }

    /// Work that never finishes (a peer that never arrives): synchronize returns `Timeout`
    /// at the deadline, not later, and aborts the communicator.
    #[test]
    fn a_stuck_stream_times_out_and_aborts() {
        let _s = serial();
        stuck_stream();
    }

    /// The same with a blocking communicator (the default): the deadline is the stream wait's.
    #[test]
    fn a_stuck_stream_times_out_and_aborts_blocking() {
        let _s = serial();
        std::env::set_var("UNICOMM_NONBLOCKING", "0");
        stuck_stream();
    }

    /// An asynchronous error (a dead peer, as NCCL reports it) is returned by
    /// `poll_async_error`, and ends a stream wait at once with that error, aborting.
    #[test]
    fn an_asynchronous_error_ends_the_wait_early() {
        let _s = serial();
        let f = loaded();
        let Fixture { c, st, mut b } = fixture(&f);
        c.poll_async_error().unwrap();
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
        let _u = Unhang;
        HANG.store(true, Ordering::SeqCst);
        set_async_error(&f, &c, 6); // ncclRemoteError
        let r = c.poll_async_error();
        assert!(matches!(r, Err(Error::Library { code: 6, .. })), "{r:?}");
        let aborts = calls(&f.0, "ncclCommAbort");
        let t = Instant::now();
        let r = st.synchronize();
        assert!(matches!(r, Err(Error::Library { code: 6, .. })), "{r:?}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(calls(&f.0, "ncclCommAbort") - aborts, 1);
    }

    /// `abort` from another thread ends a wait blocked on the stream, and the wait reports it
    /// even when the stream then drains (an abort ends NCCL's kernels: the work did not finish).
    #[test]
    fn abort_from_another_thread_ends_a_blocked_wait() {
        let _s = serial();
        let f = loaded();
        let Fixture { c, st, mut b } = fixture(&f);
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
        let _u = Unhang;
        HANG.store(true, Ordering::SeqCst);
        let r = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(100));
                c.abort().unwrap();
                HANG.store(false, Ordering::SeqCst); // the aborted kernels exit
            });
            st.synchronize()
        });
        assert!(matches!(r, Err(Error::Aborted { .. })), "{r:?}");
        // Reported once: the stream is usable again for other work.
        st.synchronize().unwrap();
    }

    /// The same with the stream still stuck after the abort.
    #[test]
    fn abort_from_another_thread_ends_a_stuck_wait() {
        let _s = serial();
        let f = loaded();
        let Fixture { c, st, mut b } = fixture(&f);
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
        let _u = Unhang;
        HANG.store(true, Ordering::SeqCst);
        let t = Instant::now();
        let r = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(100));
                c.abort().unwrap();
            });
            st.synchronize()
        });
        assert!(matches!(r, Err(Error::Aborted { .. })), "{r:?}");
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    }

    /// A non-blocking call that never settles times out (and aborts); an abort from another
    /// thread interrupts one that is settling.
    #[test]
    fn a_call_stuck_in_progress_times_out_or_is_aborted() {
        let _s = serial();
        let f = loaded();
        let Fixture { c, st, mut b } = fixture(&f);
        c.set_timeout(Duration::from_millis(200)).unwrap();
        stick(&f, &c);
        let t = Instant::now();
        let r = c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st);
        assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
        assert!(t.elapsed() < Duration::from_millis(1500));
        let r = c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st);
        assert!(matches!(r, Err(Error::Aborted { .. })), "{r:?}");

        let Fixture { c, st, mut b } = fixture(&f);
        c.set_timeout(Duration::from_secs(60)).unwrap();
        stick(&f, &c);
        let t = Instant::now();
        let r = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(100));
                c.abort().unwrap();
            });
            c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)
        });
        assert!(matches!(r, Err(Error::Aborted { .. })), "{r:?}");
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    }

    /// An owned allocation is freed only once the device's work is done with it (the device
    /// synchronized first, `cudaFree`'s rule; `ncclMemFree` unmaps without waiting): dropping
    /// a buffer while the "device" is stuck (a collective still writing it, of a completion
    /// handle that was forgotten) waits for the device, and only then frees.
    #[test]
    fn an_owned_buffer_is_freed_only_after_the_device_is_done_with_it() {
        let _g = serial();
        let _u = Unhang;
        let f = loaded();
        let c = comm(flavors(false, false), &f.0);
        let buf = c.alloc::<f32>(1024).unwrap();
        // The frees of earlier tests' buffers, left to their helpers while those tests' device
        // was stuck, finish first (while one is late, a drop does not wait at all).
        std::thread::sleep(Duration::from_millis(200));
        let before = common::DEVICE_SYNCS.load(Ordering::SeqCst);
        HANG.store(true, Ordering::SeqCst);
        let dropped = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                drop(buf);
                dropped.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(Duration::from_millis(200));
            assert!(
                !dropped.load(Ordering::SeqCst),
                "the buffer was freed while the device still ran"
            );
            HANG.store(false, Ordering::SeqCst);
        });
        assert!(dropped.load(Ordering::SeqCst));
        assert_eq!(common::DEVICE_SYNCS.load(Ordering::SeqCst), before + 1);
    }
}
