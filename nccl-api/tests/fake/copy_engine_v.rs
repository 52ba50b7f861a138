//! The copy-engine path for all-to-all-v between ranks joined with `init_rank` (one per
//! thread here, as they would be one per process), against the fake NCCL in its
//! barrier-world mode and the host runtime: the ranks exchange their layouts, then each
//! copies what it sends a peer straight into the peer's window at the peer's own receive
//! displacement. Skewed counts (zeros included) and receive displacements in reverse order
//! with gaps, so a copy placed by this rank's layout instead of the peer's lands wrong. A
//! disagreement in counts or type is `Mismatch` on every rank; a rank whose output is not in
//! a window sends every rank down the library's path. In a process of its own (the variables
//! and counters).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::common::{calls, fake, flavors, Host, EXPORT};
use unicomm_core::{Comm, Counts, Error};
use unicomm_nccl_api::{Api, ApiComm};

const W: usize = 3;
/// The window every rank registers (the largest output below fits).
const WINDOW: usize = 64;
/// What a rank's output holds where nothing was received.
const UNTOUCHED: u32 = 0xdead;

/// Elements rank `s` sends rank `d` (rank 1 sends rank 2 nothing).
fn count(s: usize, d: usize) -> usize {
    [[3, 5, 7], [4, 0, 0], [1, 6, 2]][s][d]
}

/// Rank `s`'s element `i` for rank `d`.
fn val(s: usize, d: usize, i: usize) -> u32 {
    (s * 10_000 + d * 100 + i) as u32
}

/// Rank `r`'s receive displacements: peers in reverse order, a gap of 2 after each.
fn recv_displs(r: usize) -> Vec<usize> {
    let mut d = vec![0; W];
    let mut at = 1;
    for p in (0..W).rev() {
        d[p] = at;
        at += count(p, r) + 2;
    }
    d
}

/// How a rank calls: its send counts (as `count` says unless changed), whether its output
/// is a window, and whether it sends `i32` instead of `u32`.
#[derive(Clone, Copy)]
struct Call {
    extra_to: Option<usize>,
    window: bool,
    signed: bool,
}

const PLAIN: Call = Call {
    extra_to: None,
    window: true,
    signed: false,
};

/// What one rank got: the call's result, its output, and the operations that took the path.
type Out = (Result<(), Error>, Vec<u32>, u64);

fn run(path: &std::path::Path, call: impl Fn(usize) -> Call + Sync) -> Vec<Out> {
    let api = Arc::new(Api::open(flavors(false, false), path).expect("load the fake"));
    let id = api.unique_id().unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..W)
            .map(|r| {
                let (api, how) = (api.clone(), call(r));
                s.spawn(move || -> Out {
                    let c = Comm::from_backend(
                        ApiComm::init_rank(api, Arc::new(Host), id, r, W, 0).unwrap(),
                    );
                    c.set_copy_engine(true).unwrap();
                    let st = c.create_stream().unwrap();
                    let mut sc: Vec<usize> = (0..W).map(|d| count(r, d)).collect();
                    if let Some(d) = how.extra_to {
                        sc[d] += 1;
                    }
                    // Sent in reverse peer order too, so send displacements matter.
                    let mut sd = vec![0; W];
                    let mut at = 0;
                    for d in (0..W).rev() {
                        sd[d] = at;
                        at += sc[d];
                    }
                    let mut data = vec![0u32; at];
                    for d in 0..W {
                        for i in 0..sc[d] {
                            data[sd[d] + i] = val(r, d, i);
                        }
                    }
                    let mut send = c.alloc::<u32>(at.max(1)).unwrap();
                    send.copy_from_host(&data, &st).unwrap();
                    let rc: Vec<usize> = (0..W).map(|p| count(p, r)).collect();
                    let rd = recv_displs(r);
                    let mut out = c.alloc::<u32>(WINDOW).unwrap();
                    out.copy_from_host(&[UNTOUCHED; WINDOW], &st).unwrap();
                    let (scs, rcs) = (
                        Counts {
                            counts: &sc,
                            displs: &sd,
                        },
                        Counts {
                            counts: &rc,
                            displs: &rd,
                        },
                    );
                    let (res, got) = if how.signed {
                        // The same sizes, another element type.
                        let send = c.alloc::<i32>(at.max(1)).unwrap();
                        let mut win = c.register_window(c.alloc::<i32>(WINDOW).unwrap()).unwrap();
                        let res = c.all_to_all_v(&send, scs, &mut win, rcs, &st);
                        c.deregister_window(win).unwrap();
                        (res, Vec::new())
                    } else if how.window {
                        let mut win = c.register_window(out).unwrap();
                        let res = c.all_to_all_v(&send, scs, &mut win, rcs, &st);
                        let got = win.copy_to_host(&st).unwrap_or_default();
                        c.deregister_window(win).unwrap();
                        (res, got)
                    } else {
                        // Registering is collective: this rank registers a window too, but
                        // its output lies elsewhere.
                        let win = c.register_window(c.alloc::<u32>(WINDOW).unwrap()).unwrap();
                        let res = c.all_to_all_v(&send, scs, &mut out, rcs, &st);
                        c.deregister_window(win).unwrap();
                        (res, out.copy_to_host(&st).unwrap_or_default())
                    };
                    (res, got, c.backend().copy_engine_calls())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

isolated! {
    #[test]
    fn all_to_all_v_into_windows_lands_at_each_peers_own_displacements() {
        std::env::set_var("FAKE_NCCL_BARRIER_WORLDS", "1");
        EXPORT.store(true, Ordering::SeqCst);
        let path = fake("nccl228");
        // Held for the whole test: the counters live as long as the library stays loaded, and
        // each run's communicators unload it when they go.
        // SAFETY: the fake, loaded by the runs anyway; nothing is called through this handle.
        let _held = unsafe { libloading::Library::new(&path) }.unwrap();
        let p2p = || calls(&path, "ncclSend") + calls(&path, "ncclRecv");

        // 1. Every rank's output in a window: the copy engines, exact data, the gaps untouched,
        //    no library send or receive.
        let before = p2p();
        let out = run(&path, |_| PLAIN);
        assert_eq!(p2p(), before, "the library's send/recv ran");
        for (r, (res, got, took)) in out.iter().enumerate() {
            res.as_ref().unwrap_or_else(|e| panic!("rank {r}: {e}"));
            assert_eq!(*took, 1, "rank {r}: the copy-engine path");
            let mut want = vec![UNTOUCHED; WINDOW];
            for (p, &d) in recv_displs(r).iter().enumerate() {
                for i in 0..count(p, r) {
                    want[d + i] = val(p, r, i);
                }
            }
            assert_eq!(got, &want, "rank {r}'s output");
        }

        // 2. Rank 0 sends rank 1 one element more than rank 1 receives: every rank is told,
        //    naming both counts, and no rank's window was written.
        let out = run(&path, |r| Call {
            extra_to: (r == 0).then_some(1),
            ..PLAIN
        });
        for (r, (res, got, took)) in out.iter().enumerate() {
            match res {
                Err(Error::Mismatch { what, detail }) => {
                    assert_eq!(*what, "count");
                    assert!(
                        detail.contains("rank 0 sends 6 elements to rank 1, which receives 5"),
                        "{detail}"
                    );
                }
                other => panic!("rank {r}: {other:?}"),
            }
            assert_eq!(*took, 0, "rank {r}");
            assert!(got.iter().all(|&x| x == UNTOUCHED), "rank {r} was written");
        }

        // 2b. Rank 1 exchanges i32 with peers exchanging u32: every rank is told (a peer of
        //     another element size would place its copies at other byte offsets).
        let out = run(&path, |r| Call {
            signed: r == 1,
            ..PLAIN
        });
        for (r, (res, _, took)) in out.iter().enumerate() {
            assert!(
                matches!(
                    res,
                    Err(Error::Mismatch {
                        what: "data type",
                        ..
                    })
                ),
                "rank {r}: {res:?}"
            );
            assert_eq!(*took, 0, "rank {r}");
        }

        // 3. One rank's output is not in a window: no rank takes the copy engines (the fake's
        //    barrier world then refuses the library's send/recv to a peer, on every rank,
        //    instead of one rank copying into windows the others do not wait on).
        let before = p2p();
        let out = run(&path, |r| Call {
            window: r != 2,
            ..PLAIN
        });
        for (r, (res, _, took)) in out.iter().enumerate() {
            assert_eq!(*took, 0, "rank {r}: the copy-engine path");
            assert!(
                res.is_err(),
                "rank {r}: the fake's barrier world has no send/recv"
            );
        }
        let after = p2p();
        assert!(
            after - before >= W as i32,
            "every rank took the library's path: {before} -> {after}"
        );
    }
}
