//! The copy-engine path's signal waits after an abort, against the fake NCCL and the host
//! runtime (synchronous streams: a signal wait holds the enqueuing thread, as it holds a
//! stream on the device). Two ranks joined with `init_rank` agree on signals; after one
//! all-to-all together, rank 1 stops issuing, so rank 0's next all-to-all waits for a
//! signal that never comes. Aborting rank 0 from another thread must release that wait at
//! once (not at the host runtime's 20 s deadline, which fails the test), its work must then
//! report `Aborted`, and a later copy-engine operation must be refused before it enqueues a
//! wait. The fake's abort here waits for the device as NCCL 2.28's does (for every signal
//! wait in progress to end): a release after the abort would never come, so the abort must
//! release the waits beside the library's teardown. In a process of its own (the variables and
//! counters).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{
    aborts_wait_while, fake, flavors, Host, EXPORT, IMPORTS, UNMAPS, WAITING, WAITS,
};
use unicomm_core::{Comm, Error};
use unicomm_nccl_api::{Api, ApiComm, CopyEngineSync};

isolated! {
    #[test]
    fn an_abort_releases_the_copy_engine_signal_waits() {
        std::env::set_var("FAKE_NCCL_BARRIER_WORLDS", "1");
        EXPORT.store(true, Ordering::SeqCst);
        let path = fake("nccl228");
        let api = Arc::new(Api::open(flavors(false, false), &path).expect("load the fake"));
        aborts_wait_while(&path, &WAITING);
        let id = api.unique_id().unwrap();
        let (w, n) = (2usize, 1024usize);
        let together = std::sync::Barrier::new(w);
        let finished = std::sync::Barrier::new(w);
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..w)
                .map(|r| {
                    let (api, together, finished) = (api.clone(), &together, &finished);
                    s.spawn(move || {
                        let c = Comm::from_backend(
                            ApiComm::init_rank(api, Arc::new(Host), id, r, w, 0).unwrap(),
                        );
                        c.set_copy_engine(true).unwrap();
                        let st = c.create_stream().unwrap();
                        let mut send = c.alloc::<u32>(w * n).unwrap();
                        send.copy_from_host(&vec![r as u32; w * n], &st).unwrap();
                        let mut recv = c.register_window(c.alloc::<u32>(w * n).unwrap()).unwrap();
                        assert_eq!(
                            c.backend().copy_engine_sync(),
                            Some(CopyEngineSync::Signals)
                        );
                        // Once together: both ranks signal, the data moves.
                        c.all_to_all(&send, &mut recv, &st).unwrap();
                        let got = recv.copy_to_host(&st).unwrap();
                        assert_eq!(got[..n], vec![0u32; n][..], "rank {r} from rank 0");
                        assert_eq!(got[n..], vec![1u32; n][..], "rank {r} from rank 1");
                        together.wait();
                        // Rank 0's checks may fail: rank 1 still gets to its end (no hang).
                        let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            if r == 0 {
                                // Rank 1 issues nothing more: this all-to-all's first wait holds
                                // (here: this thread) until the abort releases it.
                                let waits = WAITS.load(Ordering::SeqCst);
                                let start = Instant::now();
                                let (enqueued, aborted_in) = std::thread::scope(|s| {
                                    let aborter = s.spawn(|| {
                                        std::thread::sleep(Duration::from_millis(300));
                                        let t = Instant::now();
                                        c.abort().unwrap();
                                        t.elapsed()
                                    });
                                    let e = c.all_to_all(&send, &mut recv, &st);
                                    (e, aborter.join().unwrap())
                                });
                                let held = start.elapsed();
                                enqueued.expect("the released all-to-all enqueued");
                                assert!(
                                    held >= Duration::from_millis(250),
                                    "the all-to-all did not wait for its peer ({held:?})"
                                );
                                assert!(
                                    held < Duration::from_secs(5),
                                    "the wait was not released by the abort ({held:?})"
                                );
                                assert!(
                                    aborted_in < Duration::from_secs(5),
                                    "abort took {aborted_in:?}"
                                );
                                assert!(WAITS.load(Ordering::SeqCst) > waits, "no signal wait ran");
                                // The work after it reports the abort, not success.
                                let r = recv.copy_to_host(&st);
                                assert!(matches!(r, Err(Error::Aborted { .. })), "{r:?}");
                                // Refused before a wait is enqueued (else it would hold for good).
                                let waits = WAITS.load(Ordering::SeqCst);
                                let r = c.all_to_all(&send, &mut recv, &st);
                                assert!(matches!(r, Err(Error::Aborted { .. })), "{r:?}");
                                assert_eq!(WAITS.load(Ordering::SeqCst), waits);
                            }
                        }));
                        finished.wait();
                        if let Err(p) = checked {
                            std::panic::resume_unwind(p);
                        }
                        drop(recv);
                        drop(c);
                    })
                })
                .collect();
            for h in hs {
                h.join().expect("rank thread");
            }
        });
        // Every copy was seen complete at the drops: nothing left mapped.
        assert_eq!(
            IMPORTS.load(Ordering::SeqCst),
            UNMAPS.load(Ordering::SeqCst),
            "every mapping unmapped"
        );
    }
}
