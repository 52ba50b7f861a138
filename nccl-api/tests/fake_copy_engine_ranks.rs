//! The copy-engine path between ranks joined with `init_rank` (one per thread here, as
//! they would be one per process), against the fake NCCL in its barrier-world mode and the
//! host runtime: each rank's window is exported, swapped over the real exchange (abstract
//! Unix sockets, SCM_RIGHTS), "mapped" by its peers, and the all-to-all and all-gather copy
//! straight into the peers' windows; deregistration unmaps every peer mapping. The fake's
//! one-element all-reduce is a real barrier of the world's threads (host streams are
//! synchronous), so the path's own barriers are what orders the ranks, as NCCL's do on the
//! device. Alone in its binary (the variables and counters).

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::{fake, flavors, library_moves, Host, EXPORT, IMPORTS, UNMAPS};
use unicomm_core::Comm;
use unicomm_nccl_api::{Api, ApiComm};

#[test]
fn windows_swapped_between_ranks_carry_the_copy_engine_collectives() {
    std::env::set_var("FAKE_NCCL_BARRIER_WORLDS", "1");
    EXPORT.store(true, Ordering::SeqCst);
    let path = fake("nccl228");
    let api = Arc::new(Api::open(flavors(false, false), &path).expect("load the fake"));
    let id = api.unique_id().unwrap();
    let (w, n) = (3usize, 257usize);
    let moves = library_moves(&path);
    type Out = (Vec<u32>, Vec<u32>, u64);
    let out: Vec<Out> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..w)
            .map(|r| {
                let api = api.clone();
                s.spawn(move || -> Out {
                    let c = Comm::from_backend(
                        ApiComm::init_rank(api, Arc::new(Host), id, r, w, 0).unwrap(),
                    );
                    c.set_copy_engine(true).unwrap();
                    let st = c.create_stream().unwrap();
                    let mut send = c.alloc::<u32>(w * n).unwrap();
                    let data: Vec<u32> = (0..w * n).map(|i| (r * 1_000_000 + i) as u32).collect();
                    send.copy_from_host(&data, &st).unwrap();
                    let mut recv = c.register_window(c.alloc::<u32>(w * n).unwrap()).unwrap();
                    c.all_to_all(&send, &mut recv, &st).unwrap();
                    let a = recv.copy_to_host(&st).unwrap();
                    c.all_gather(&send.slice(..n).unwrap(), &mut recv, &st)
                        .unwrap();
                    let g = recv.copy_to_host(&st).unwrap();
                    let took = c.backend().copy_engine_calls();
                    c.deregister_window(recv).unwrap();
                    (a, g, took)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    });
    for (r, (a, g, took)) in out.iter().enumerate() {
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
    assert_eq!(
        library_moves(&path),
        moves,
        "the library's all-to-all or all-gather ran"
    );
    // Every rank mapped each peer's window once and unmapped it at deregistration.
    assert_eq!(IMPORTS.load(Ordering::SeqCst), w * (w - 1));
    assert_eq!(UNMAPS.load(Ordering::SeqCst), w * (w - 1));
}
