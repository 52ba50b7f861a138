//! `UNICOMM_CHECK_COLLECTIVES=1` against the fake NCCL in its barrier-world mode (three
//! ranks on threads, joined with `init_rank`; the fake's small uint64 all-reduces are real
//! reductions of the world's threads): before every collective the ranks compare what they
//! are about to call; where they differ every rank gets `Mismatch` naming the field and the
//! call does not run (mismatched NCCL calls hang or corrupt data); where they agree the call
//! runs, exact. Off (the default), no exchange is made. In a process of its own (the variables
//! and counters).

use crate::common::{calls, fake, flavors, on_ranks};
use unicomm_core::{Collective, Error, ReduceOp};

/// One call of a rank: in-place all-reduce of the first `count` of 4 uint64, or an
/// all-gather (which the barrier world cannot run: only the check can stop it).
#[derive(Clone, Copy)]
enum Call {
    AllReduce(usize, ReduceOp),
    /// The same on 4 uint32 (another data type).
    AllReduceU32,
    Broadcast(usize),
    AllGather,
}

/// What each rank's calls returned (the buffer after the call, or the field of a mismatch
/// and the buffer after it).
type Seen = Vec<Result<Vec<u64>, (&'static str, Vec<u64>)>>;

/// Three ranks; `calls(rank)`: the calls each makes, in order.
fn run(path: &std::path::Path, rccl: bool, calls_of: fn(usize) -> Vec<Call>) -> Vec<Seen> {
    on_ranks(flavors(false, rccl), path, 3, |r, c| -> Seen {
        let st = c.create_stream().unwrap();
        let mut b = c.alloc::<u64>(4).unwrap();
        let mut g = c.alloc::<u64>(4 * c.world_size()).unwrap();
        let mut h = c.alloc::<u32>(4).unwrap();
        let mut seen = Vec::new();
        for call in calls_of(r) {
            b.copy_from_host(&[r as u64 + 1, 10, 100, 1000], &st)
                .unwrap();
            let res = match call {
                Call::AllReduce(n, op) => {
                    c.all_reduce_in_place(&mut b.slice_mut(..n).unwrap(), op, &st)
                }
                Call::AllReduceU32 => c.all_reduce_in_place(&mut h, ReduceOp::Sum, &st),
                Call::Broadcast(root) => c.broadcast_in_place(&mut b, root, &st),
                Call::AllGather => c.all_gather(&b, &mut g, &st),
            };
            seen.push(match res {
                Ok(()) => Ok(b.copy_to_host(&st).unwrap()),
                Err(Error::Mismatch { what, .. }) => Err((what, b.copy_to_host(&st).unwrap())),
                Err(e) => panic!("rank {r}: {e}"),
            });
        }
        seen
    })
}

isolated! {
    #[test]
    fn ranks_that_differ_get_mismatch_and_the_call_does_not_run() {
        std::env::set_var("FAKE_NCCL_BARRIER_WORLDS", "1");
        let path = fake("nccl228");
        // SAFETY: the fake's initialisers do nothing; held so its counters outlive the comms.
        let _keep = unsafe { libloading::Library::new(&path) }.unwrap();
        // Ranks' first elements are 1, 2, 3: a sum over the world is 6; the others 3x theirs.
        let summed = vec![6, 30, 300, 1000];
        let untouched = |r: u64| vec![r + 1, 10, 100, 1000];

        std::env::set_var("UNICOMM_CHECK_COLLECTIVES", "1");
        // NCCL's flavour, then RCCL's (the same code over the other vendor's names).
        for rccl in [false, true] {
            let before = calls(&path, "ncclAllReduce");
            let out = run(&path, rccl, |r| {
                vec![
                    // Agreed: runs, exact.
                    Call::AllReduce(3, ReduceOp::Sum),
                    // Rank 2 with another count, reduction, operation, data type, root.
                    Call::AllReduce(if r == 2 { 2 } else { 3 }, ReduceOp::Sum),
                    Call::AllReduce(3, if r == 2 { ReduceOp::Max } else { ReduceOp::Sum }),
                    if r == 2 {
                        Call::AllGather
                    } else {
                        Call::AllReduce(3, ReduceOp::Sum)
                    },
                    if r == 2 {
                        Call::AllReduceU32
                    } else {
                        Call::AllReduce(4, ReduceOp::Sum)
                    },
                    Call::Broadcast(if r == 2 { 1 } else { 0 }),
                    // The ranks are still in step: agreed again, exact.
                    Call::AllReduce(3, ReduceOp::Sum),
                ]
            });
            for (r, seen) in out.iter().enumerate() {
                assert_eq!(seen[0], Ok(summed.clone()), "rank {r}");
                // Refused on every rank, the buffer as it was written (the call did not run).
                let mine = untouched(r as u64);
                assert_eq!(seen[1], Err(("count", mine.clone())), "rank {r}");
                assert_eq!(seen[2], Err(("reduction", mine.clone())), "rank {r}");
                assert_eq!(seen[3], Err(("operation", mine.clone())), "rank {r}");
                assert_eq!(seen[4], Err(("data type", mine.clone())), "rank {r}");
                assert_eq!(seen[5], Err(("root", mine)), "rank {r}");
                assert_eq!(seen[6], Ok(summed.clone()), "rank {r}");
            }
            // Each rank: one exchange per call, and the two agreed calls themselves.
            assert_eq!(calls(&path, "ncclAllReduce") - before, 3 * (7 + 2));
        }

        // A rank whose call is refused before it reaches the library (here: its buffer only
        // partly registered for the automatic policy) still takes part in the comparison: it
        // returns its own error, its peers `Mismatch` on the path, at once (without it they
        // would wait in the comparison for a rank that left).
        std::env::set_var("UNICOMM_AUTO_COPY_ENGINE", "0");
        let t = std::time::Instant::now();
        let out = on_ranks(flavors(false, false), &path, 3, |r, c| {
            let st = c.create_stream().unwrap();
            let mut b = c.alloc::<u64>(4).unwrap();
            b.copy_from_host(&[1, 2, 3, 4], &st).unwrap();
            let bytes = if r == 2 { 16 } else { 32 };
            let h = Collective::register_auto(c.backend(), b.memory(), 0, bytes).unwrap();
            let res = c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st);
            Collective::deregister_auto(c.backend(), h).unwrap();
            res
        });
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            t.elapsed()
        );
        for (r, res) in out.iter().enumerate() {
            match (r, res) {
                (2, Err(Error::InvalidArgument { argument, .. })) => assert_eq!(*argument, "buffer"),
                (0 | 1, Err(Error::Mismatch { what, .. })) => assert_eq!(*what, "path"),
                other => panic!("rank {r}: {other:?}"),
            }
        }

        // Off (the default): no exchange; a mismatch reaches the library (here the fake's
        // barrier world refuses the all-gather; NCCL would hang or corrupt data).
        std::env::set_var("UNICOMM_CHECK_COLLECTIVES", "0");
        let before = calls(&path, "ncclAllReduce");
        let out = run(&path, false, |_| vec![Call::AllReduce(3, ReduceOp::Sum)]);
        for (r, seen) in out.iter().enumerate() {
            assert_eq!(seen[0], Ok(summed.clone()), "rank {r}");
        }
        assert_eq!(calls(&path, "ncclAllReduce") - before, 3);
    }
}
