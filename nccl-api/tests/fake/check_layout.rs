//! `UNICOMM_CHECK_COLLECTIVES=1` and the variable-size collectives, against the fake NCCL's
//! barrier worlds (three ranks on threads; its small uint64 all-reduces are real reductions
//! of the world's threads): the ranks compare their counts before anything is called, and
//! a rank that sends a peer another count than the peer receives fails every rank with
//! `Mismatch` naming both counts. In a process of its own (the variables).

use crate::common::{fake, flavors, on_ranks, Host};
use unicomm_core::Comm;
use unicomm_core::{packed_displs, Counts, Error};
use unicomm_nccl_api::ApiComm;

/// The fake's barrier world is one per process: one test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Three ranks with the check on, each running `f`; every rank's result must be `Mismatch`
/// on the count. The results, in rank order.
fn every_rank_mismatches<T: std::fmt::Debug + Send>(
    f: impl Fn(usize, Comm<ApiComm<Host>>) -> unicomm_core::Result<T> + Sync,
) -> Vec<unicomm_core::Result<T>> {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("FAKE_NCCL_BARRIER_WORLDS", "1");
    std::env::set_var("UNICOMM_CHECK_COLLECTIVES", "1");
    let path = fake("nccl228");
    let out = on_ranks(flavors(false, false), &path, 3, f);
    for (r, res) in out.iter().enumerate() {
        assert!(
            matches!(res, Err(Error::Mismatch { what: "count", .. })),
            "rank {r}: {res:?}"
        );
    }
    out
}

isolated! {
    #[test]
    fn ranks_that_disagree_on_all_to_all_v_counts_all_get_mismatch() {
        let out = every_rank_mismatches(|r, c| {
            let st = c.create_stream().unwrap();
            // Every rank sends 2 to each peer; rank 2 expects 3 from rank 0.
            let sc = vec![2usize; 3];
            let rc = if r == 2 { vec![3, 2, 2] } else { vec![2; 3] };
            let (sd, rd) = (packed_displs(&sc).unwrap(), packed_displs(&rc).unwrap());
            let send = c.alloc::<f32>(6).unwrap();
            let mut recv = c.alloc::<f32>(7).unwrap();
            let s = Counts {
                counts: &sc,
                displs: &sd,
            };
            let v = Counts {
                counts: &rc,
                displs: &rd,
            };
            c.all_to_all_v(&send, s, &mut recv, v, &st)
        });
        // Every rank names the pair and both counts, in the same words (each holds every
        // rank's counts), not only the rank that sees it.
        for res in &out {
            let Err(Error::Mismatch { detail, .. }) = res else {
                unreachable!()
            };
            assert_eq!(
                detail,
                "all_to_all_v: rank 0 sends 2 elements to rank 2, which receives 3 from it"
            );
        }
    }

    #[test]
    fn ranks_whose_all_gather_v_counts_differ_all_get_mismatch() {
        every_rank_mismatches(|r, c| {
            let st = c.create_stream().unwrap();
            let counts = if r == 1 { vec![1, 1, 2] } else { vec![1, 1, 1] };
            let displs = packed_displs(&counts).unwrap();
            let send = c.alloc::<f32>(counts[r]).unwrap();
            let mut recv = c.alloc::<f32>(4).unwrap();
            let layout = Counts {
                counts: &counts,
                displs: &displs,
            };
            c.all_gather_v(&send, &mut recv, layout, &st)
        });
    }
}
