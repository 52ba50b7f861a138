//! Abort against the fake NCCL, in a process of its own (so the fake's call counters see no
//! other test).

use crate::common::{calls, comm, fake, flavors};
use unicomm_core::{Error, ReduceOp};

isolated! {
    /// `abort` through a shared reference: the library's abort runs once, every later call is
    /// `Aborted` without reaching the library, and dropping the communicator destroys nothing.
    #[test]
    fn an_aborted_communicator_refuses_work_and_is_not_destroyed_again() {
        let path = fake("nccl228");
        // Held so the fake stays loaded (and keeps its counters) after the communicator's
        // last reference to it is dropped.
        // SAFETY: the fake's initialisers do nothing.
        let _keep = unsafe { libloading::Library::new(&path) }.unwrap();
        let c = comm(flavors(false, false), &path);
        let st = c.create_stream().unwrap();
        let mut b = c.alloc::<f32>(8).unwrap();
        let (aborts, destroys) = (
            calls(&path, "ncclCommAbort"),
            calls(&path, "ncclCommDestroy"),
        );
        let reduces = calls(&path, "ncclAllReduce");
        c.abort().unwrap();
        c.abort().unwrap(); // idempotent
        let r = c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st);
        assert!(matches!(r, Err(Error::Aborted { .. })), "{r:?}");
        assert_eq!(calls(&path, "ncclAllReduce"), reduces);
        drop(b);
        drop(c);
        assert_eq!(calls(&path, "ncclCommAbort") - aborts, 1);
        assert_eq!(calls(&path, "ncclCommDestroy"), destroys);
    }
}
