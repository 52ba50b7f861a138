//! The copy-engine path between ranks joined with `init_rank` (one per thread here, as
//! they would be one per process), against the fake NCCL in its barrier-world mode and the
//! host runtime: each rank's window is exported, swapped over the real exchange (abstract
//! Unix sockets, SCM_RIGHTS), "mapped" by its peers, and the all-to-all and all-gather copy
//! straight into the peers' windows; deregistration unmaps every peer mapping. The fake's
//! one-element all-reduce is a real barrier of the world's threads (host streams are
//! synchronous), so the path's own barriers are what orders the ranks, as NCCL's do on the
//! device. In a process of its own (the variables and counters).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::common::{
    calls, fake, flavors, library_moves, Host, BY_WRITE, EXPORT, IMPORTS, MEM_OPS, ONE_WRITES,
    UNMAPS, WAITS, WORD_COPIES,
};
use unicomm_core::Comm;
use unicomm_nccl_api::{Api, ApiComm, CopyEngineSync};

/// What one rank saw: its all-to-all and all-gather output, the operations that took the
/// path, the mechanism agreed, and the library all-reduces issued during the operations.
type Out = (Vec<u32>, Vec<u32>, u64, Option<CopyEngineSync>, i32);

/// Three ranks on threads, each joined with `init_rank`: a window registered for the path,
/// one all-to-all and one all-gather into it, deregistration. `no_ops`: the rank whose
/// runtime lacks stream memory operations.
fn run(path: &std::path::Path, no_ops: Option<usize>) -> Vec<Out> {
    let api = Arc::new(Api::open(flavors(false, false), path).expect("load the fake"));
    let id = api.unique_id().unwrap();
    let (w, n) = (3usize, 257usize);
    let sync = std::sync::Barrier::new(w);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..w)
            .map(|r| {
                let (api, sync) = (api.clone(), &sync);
                s.spawn(move || -> Out {
                    MEM_OPS.with(|m| m.set(no_ops != Some(r)));
                    let c = Comm::from_backend(
                        ApiComm::init_rank(api, Arc::new(Host), id, r, w, 0).unwrap(),
                    );
                    c.set_copy_engine(true).unwrap();
                    let st = c.create_stream().unwrap();
                    let mut send = c.alloc::<u32>(w * n).unwrap();
                    let data: Vec<u32> = (0..w * n).map(|i| (r * 1_000_000 + i) as u32).collect();
                    send.copy_from_host(&data, &st).unwrap();
                    let mut recv = c.register_window(c.alloc::<u32>(w * n).unwrap()).unwrap();
                    // Every rank registered before the count is read, and after the
                    // operations of every rank: what the operations themselves called.
                    sync.wait();
                    let before = calls(path, "ncclAllReduce");
                    sync.wait();
                    c.all_to_all(&send, &mut recv, &st).unwrap();
                    let a = recv.copy_to_host(&st).unwrap();
                    c.all_gather(&send.slice(..n).unwrap(), &mut recv, &st)
                        .unwrap();
                    let g = recv.copy_to_host(&st).unwrap();
                    sync.wait();
                    let during = calls(path, "ncclAllReduce") - before;
                    let took = c.backend().copy_engine_calls();
                    let how = c.backend().copy_engine_sync();
                    c.deregister_window(recv).unwrap();
                    (a, g, took, how, during)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

fn check_data(out: &[Out]) {
    let (w, n) = (out.len(), out[0].0.len() / out.len());
    for (r, (a, g, took, _, _)) in out.iter().enumerate() {
        for p in 0..w {
            for i in 0..n {
                assert_eq!(
                    a[p * n + i],
                    (p * 1_000_000 + r * n + i) as u32,
                    "all_to_all: rank {r} from {p} at {i}"
                );
                assert_eq!(
                    g[p * n + i],
                    (p * 1_000_000 + i) as u32,
                    "all_gather: rank {r} from {p} at {i}"
                );
            }
        }
        assert_eq!(*took, 2, "rank {r}: both took the copy-engine path");
    }
}

isolated! {
    #[test]
    fn windows_swapped_between_ranks_carry_the_copy_engine_collectives() {
        std::env::set_var("FAKE_NCCL_BARRIER_WORLDS", "1");
        EXPORT.store(true, Ordering::SeqCst);
        let path = fake("nccl228");
        let moves = library_moves(&path);
        let w = 3;

        // 1. Every rank has stream memory operations: the ranks wait on each other's signals,
        //    and the operations call no library collective at all.
        let waits = WAITS.load(Ordering::SeqCst);
        let out = run(&path, None);
        check_data(&out);
        for (r, o) in out.iter().enumerate() {
            assert_eq!(o.3, Some(CopyEngineSync::Signals), "rank {r}");
            assert_eq!(
                o.4, 0,
                "rank {r}: library all-reduces during the operations"
            );
        }
        // Per rank: the probe, then two phases of two operations, one wait per peer each.
        assert_eq!(
            WAITS.load(Ordering::SeqCst) - waits,
            w * (1 + 2 * 2 * (w - 1))
        );
        // Every rank mapped each peer's window and signal block, and unmapped the window at
        // deregistration and the block when the communicator went.
        assert_eq!(IMPORTS.load(Ordering::SeqCst), 2 * w * (w - 1));
        assert_eq!(UNMAPS.load(Ordering::SeqCst), 2 * w * (w - 1));

        // 2. One rank without them: every rank falls back to the library barriers, two per
        //    operation (a rank alone on signals would wait forever).
        let out = run(&path, Some(1));
        check_data(&out);
        for (r, o) in out.iter().enumerate() {
            assert_eq!(o.3, Some(CopyEngineSync::Barrier), "rank {r}");
            assert_eq!(
                o.4,
                (w * 2 * 2) as i32,
                "rank {r}: all-reduces of the world"
            );
        }

        // 3. Barriers asked for (UNICOMM_CE_SYNC=barrier): the same.
        std::env::set_var("UNICOMM_CE_SYNC", "barrier");
        let out = run(&path, None);
        std::env::remove_var("UNICOMM_CE_SYNC");
        check_data(&out);
        assert!(out.iter().all(|o| o.3 == Some(CopyEngineSync::Barrier)));

        // 3b. Peers signalled by stream writes instead of copies (what CUDA does): the same
        //     waits, the same data, still no library collective during the operations; and
        //     UNICOMM_CE_SIGNAL=copy takes the copies back.
        for (env, expect_writes) in [(None, true), (Some("copy"), false)] {
            BY_WRITE.store(true, Ordering::SeqCst);
            if let Some(v) = env {
                std::env::set_var("UNICOMM_CE_SIGNAL", v);
            }
            let waits = WAITS.load(Ordering::SeqCst);
            let (copies, ones) = (
                WORD_COPIES.load(Ordering::SeqCst),
                ONE_WRITES.load(Ordering::SeqCst),
            );
            let out = run(&path, None);
            let copies = WORD_COPIES.load(Ordering::SeqCst) - copies;
            let ones = ONE_WRITES.load(Ordering::SeqCst) - ones;
            std::env::remove_var("UNICOMM_CE_SIGNAL");
            BY_WRITE.store(false, Ordering::SeqCst);
            check_data(&out);
            for (r, o) in out.iter().enumerate() {
                assert_eq!(o.3, Some(CopyEngineSync::Signals), "rank {r} ({env:?})");
                assert_eq!(o.4, 0, "rank {r} ({env:?}): library all-reduces");
            }
            assert_eq!(
                WAITS.load(Ordering::SeqCst) - waits,
                w * (1 + 2 * 2 * (w - 1)),
                "{env:?}"
            );
            // Per rank: one probe write, then one signal per peer, phase and operation.
            let signals = w * 2 * 2 * (w - 1);
            if expect_writes {
                assert_eq!(
                    (copies, ones),
                    (0, w + signals),
                    "{env:?}: signals by write"
                );
            } else {
                assert_eq!((copies, ones), (signals, w), "{env:?}: signals by copy");
            }
        }

        // 4. A misspelt choice is an error at the registration, on every rank, not a silent
        //    default.
        for (var, bad) in [("UNICOMM_CE_SYNC", "flags"), ("UNICOMM_CE_SIGNAL", "poke")] {
            std::env::set_var(var, bad);
            let api = Arc::new(Api::open(flavors(false, false), &path).unwrap());
            let id = api.unique_id().unwrap();
            let errs: Vec<String> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..w)
                    .map(|r| {
                        let api = api.clone();
                        s.spawn(move || {
                            let c = Comm::from_backend(
                                ApiComm::init_rank(api, Arc::new(Host), id, r, w, 0).unwrap(),
                            );
                            c.set_copy_engine(true).unwrap();
                            let e = c
                                .register_window(c.alloc::<u32>(8).unwrap())
                                .map(drop)
                                .expect_err("a bad setting registered");
                            e.to_string()
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            std::env::remove_var(var);
            for e in &errs {
                assert!(e.contains(var) && e.contains(bad), "{e}");
            }
        }

        assert_eq!(
            library_moves(&path),
            moves,
            "the library's all-to-all or all-gather ran"
        );
        assert_eq!(
            IMPORTS.load(Ordering::SeqCst),
            UNMAPS.load(Ordering::SeqCst),
            "every mapping unmapped"
        );
    }
}
