//! Blocking communicators (the default): NCCL's blocking `ncclCommInitRank` and
//! `ncclCommFinalize` wait for the peers on the host with no deadline of their own; unicomm
//! runs them on a thread of their own under the communicator's deadline. Against the fake,
//! whose calls are made slow on purpose. In a process of its own (the variable, the counters).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{calls, fake, flavors, Host};
use unicomm_core::{Comm, Error};
use unicomm_nccl_api::{Api, ApiComm};

fn delay(path: &std::path::Path, ms: [u64; 4]) {
    // SAFETY: the fake, loaded by the test; unicommFakeDelay takes four integers (init, finalize, window, split).
    unsafe {
        let lib = libloading::Library::new(path).unwrap();
        let f: libloading::Symbol<unsafe extern "C" fn(u64, u64, u64, u64)> =
            lib.get(b"unicommFakeDelay\0").unwrap();
        f(ms[0], ms[1], ms[2], ms[3]);
    }
}

/// Runs `f`, which must fail with `Timeout` well before the slowed call returns (1.5 s):
/// at the 0.3 s deadline.
fn times_out<T>(f: impl FnOnce() -> Result<T, Error>) {
    let t = Instant::now();
    let e = f().map(|_| ()).expect_err("a timeout");
    assert!(
        t.elapsed() < Duration::from_millis(1200),
        "{:?}",
        t.elapsed()
    );
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
}

isolated! {
    #[test]
    fn blocking_init_and_finalize_end_at_the_deadline_and_what_they_made_is_freed_later() {
        std::env::set_var("UNICOMM_TIMEOUT_MS", "300");
        std::env::remove_var("UNICOMM_NONBLOCKING");
        let path = fake("nccl228");
        let api = Arc::new(Api::open(flavors(false, false), &path).expect("load the fake"));
        let wait_for = |name: &str, want: i32| {
            let t = Instant::now();
            while calls(&path, name) < want && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
            assert_eq!(calls(&path, name), want, "{name}");
        };

        // 1. init_rank: a peer that never comes (the call takes 1.5 s, the deadline is 0.3 s).
        delay(&path, [1500, 0, 0, 0]);
        let aborts = calls(&path, "ncclCommAbort");
        let id = api.unique_id().unwrap();
        times_out(|| ApiComm::init_rank(api.clone(), Arc::new(Host), id, 0, 1, 0));
        // When the late call returns, the communicator it made is aborted (nobody owns it).
        wait_for("ncclCommAbort", aborts + 1);

        // 2. The same for ranks created together in one process.
        times_out(|| ApiComm::init_local(api.clone(), Arc::new(Host), &[0]));
        wait_for("ncclCommAbort", aborts + 2);

        // 3. finalize: a peer that never finishes; the caller gets Timeout at the deadline, the
        // communicator is destroyed by the thread when the call returns, and never twice.
        delay(&path, [0, 1500, 0, 0]);
        let c =
            Comm::from_backend(ApiComm::init_rank(api.clone(), Arc::new(Host), id, 0, 1, 0).unwrap());
        let destroys = calls(&path, "ncclCommDestroy");
        times_out(|| c.finalize());
        wait_for("ncclCommDestroy", destroys + 1);
        assert_eq!(
            calls(&path, "ncclCommAbort"),
            aborts + 2,
            "no abort of a finalized communicator"
        );

        // 4. In time, the same calls succeed as before.
        delay(&path, [100, 100, 100, 100]);
        let c =
            Comm::from_backend(ApiComm::init_rank(api.clone(), Arc::new(Host), id, 0, 1, 0).unwrap());
        c.finalize().unwrap();
        wait_for("ncclCommDestroy", destroys + 2);

        // 5. A collective host call (window registration, the split of automatic registration)
        // whose peers never come: Timeout at the deadline, the communicator given up (Aborted
        // from then on, never called again); a late split's communicator is aborted.
        delay(&path, [0, 0, 1500, 0]);
        let c =
            Comm::from_backend(ApiComm::init_rank(api.clone(), Arc::new(Host), id, 0, 1, 0).unwrap());
        times_out(|| {
            c.register_window(c.alloc::<f32>(64).unwrap())
                .map(|_| ())
                .map_err(|e| e.error)
        });
        let st = c.create_stream().unwrap();
        let mut b = c.alloc::<f32>(4).unwrap();
        let e = c
            .all_reduce_in_place(&mut b, unicomm_core::ReduceOp::Sum, &st)
            .expect_err("given up");
        assert!(matches!(e, Error::Aborted { .. }), "{e}");
        drop((b, c));
        let c =
            Comm::from_backend(ApiComm::init_rank(api.clone(), Arc::new(Host), id, 0, 1, 0).unwrap());
        delay(&path, [0, 0, 0, 1500]);
        let aborts = calls(&path, "ncclCommAbort");
        times_out(|| {
            c.register_auto(c.alloc::<f32>(64).unwrap())
                .map(|_| ())
                .map_err(|e| e.error)
        });
        wait_for("ncclCommAbort", aborts + 1);
        delay(&path, [0; 4]);
    }
}
