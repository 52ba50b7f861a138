//! Automatic registration against the fake NCCL (a one-rank world in this process): one
//! second communicator (ncclCommSplit), each call on the path the built-in policy picks for
//! its size (small all_reduce: this communicator's window; large all_reduce and small
//! all_to_all: the second communicator; large all_to_all: the copy engines), exact data.
//! In a process of its own (as every test here) so the fake's counters see no other test.

use crate::common::{calls, comm, fake, flavors};
use unicomm_core::ReduceOp;

isolated! {
    #[test]
    fn each_call_takes_the_path_the_policy_picks() {
        let path = fake("nccl228");
        // SAFETY: the fake's initialisers do nothing; held so its counters outlive the comm.
        let _keep = unsafe { libloading::Library::new(&path) }.unwrap();
        let c = comm(flavors(false, false), &path);
        let st = c.create_stream().unwrap();
        let n = 4 << 20; // 16 MiB of f32: above every built-in threshold
        let mut a = c.register_auto(c.alloc::<f32>(n).unwrap()).unwrap();
        let mut b = c.register_auto(c.alloc::<f32>(n).unwrap()).unwrap();
        assert_eq!(calls(&path, "ncclCommSplit"), 1, "one second communicator");
        let input: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
        a.copy_from_host(&input, &st).unwrap();

        let count = |name: &str| calls(&path, name);
        let (ar, ar_split) = (count("ncclAllReduce"), count("ncclAllReduce:split"));
        // 8 bytes: the window of this communicator.
        crate::sum_two!(c, a, b, &st)
        .unwrap();
        assert_eq!(
            (
                count("ncclAllReduce") - ar,
                count("ncclAllReduce:split") - ar_split
            ),
            (1, 0)
        );
        // 16 MiB: the second communicator, where the buffers are ncclCommRegister'ed.
        c.all_reduce(&a, &mut b, ReduceOp::Sum, &st).unwrap();
        assert_eq!(
            (
                count("ncclAllReduce") - ar,
                count("ncclAllReduce:split") - ar_split
            ),
            (2, 1)
        );
        assert_eq!(b.copy_to_host(&st).unwrap(), input);

        let (a2a, a2a_split) = (count("ncclAlltoAll"), count("ncclAlltoAll:split"));
        // 64 KiB all_to_all: the second communicator.
        c.all_to_all(
            &a.slice(..16384).unwrap(),
            &mut b.slice_mut(..16384).unwrap(),
            &st,
        )
        .unwrap();
        assert_eq!(
            (
                count("ncclAlltoAll") - a2a,
                count("ncclAlltoAll:split") - a2a_split
            ),
            (1, 1)
        );
        // 16 MiB all_to_all: the copy engines (no library all-to-all; a world of one waits for
        // no peer, so no barrier either).
        let ar_before = count("ncclAllReduce");
        c.all_to_all(&a, &mut b, &st).unwrap();
        assert_eq!(
            count("ncclAlltoAll") - a2a,
            1,
            "the copy-engine path called the library"
        );
        assert_eq!(count("ncclAllReduce") - ar_before, 0);
        assert_eq!(
            c.backend().copy_engine_sync(),
            Some(unicomm_nccl_api::CopyEngineSync::Alone)
        );
        assert_eq!(b.copy_to_host(&st).unwrap(), input);

        c.deregister_auto(a).unwrap();
        c.deregister_auto(b).unwrap();
        let destroys = count("ncclCommDestroy");
        drop(c);
        assert_eq!(
            count("ncclCommDestroy") - destroys,
            2,
            "both communicators destroyed"
        );
    }
}
