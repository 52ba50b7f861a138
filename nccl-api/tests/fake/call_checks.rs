//! The layer of library calls checks what it hands the library: memory too short for what a
//! call reads or writes, a range outside its allocation, a root or peer outside the world,
//! a variable-size part past its buffer are `InvalidArgument` before the library is called
//! (the fake's call counters stay where they were), where a C caller would get a kernel
//! writing past the buffer.

use crate::common::{calls, comm, fake, flavors};
use unicomm_core::Counts;
use unicomm_core::{DataType, Error, Slice};
use unicomm_nccl_api::sys::calls::{CommRef, P2p, Sides, StreamRef};

isolated! {
    #[test]
    fn a_call_refuses_memory_that_cannot_hold_what_it_reads_or_writes() {
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        let api = c.backend().api().clone();
        let small = c.alloc::<f32>(16).unwrap(); // 64 bytes
        let mem = small.memory();
        let whole = Slice {
            mem,
            offset: 0,
            bytes: 64,
        };
        let outside = Slice {
            mem,
            offset: 32,
            bytes: 64,
        };
        // SAFETY: the communicator of `c`, live while `c` is, used by this thread alone, a
        // world of one; the host runtime's stream is NULL.
        let (on, st) = unsafe {
            (
                CommRef::borrow_raw(c.backend().raw_comm(), 1, 0),
                StreamRef::borrow_raw(std::ptr::null_mut()),
            )
        };
        let both = |s| Sides {
            send: Some(s),
            recv: Some(s),
            config: None,
        };
        let before = calls(&path, "ncclAllReduce");
        let invalid = |r: &unicomm_core::Result<()>| matches!(r, Err(Error::InvalidArgument { .. }));
        // 32 floats do not fit in 64 bytes; a range past its allocation holds nothing.
        assert!(invalid(&api.all_reduce(
            both(&whole),
            32,
            DataType::F32,
            0,
            on,
            st
        )));
        assert!(invalid(&api.all_reduce(
            both(&outside),
            1,
            DataType::F32,
            0,
            on,
            st
        )));
        // Overflowing counts are refused, not wrapped.
        assert!(invalid(&api.all_reduce(
            both(&whole),
            usize::MAX,
            DataType::F32,
            0,
            on,
            st
        )));
        assert_eq!(
            calls(&path, "ncclAllReduce"),
            before,
            "the library was called"
        );
        // What fits is called.
        api.all_reduce(both(&whole), 16, DataType::F32, 0, on, st)
            .unwrap();
        assert_eq!(calls(&path, "ncclAllReduce"), before + 1);

        // A root or a peer outside the world of one.
        assert!(invalid(&api.broadcast(
            both(&whole),
            1,
            DataType::F32,
            1,
            on,
            st
        )));
        let p2p = api.send_recv(&whole, 1, DataType::F32, P2p::Send(1), on, st);
        assert!(invalid(&p2p));
    }

    /// RCCL's `ncclAllToAllv`: a part past the receive buffer is refused; an empty part is
    /// neither read nor written, so it may point anywhere.
    #[test]
    fn a_variable_size_part_past_its_buffer_is_refused_but_an_empty_one_is_not() {
        let path = fake("rccl-old");
        let c = comm(flavors(false, true), &path);
        let api = c.backend().api().clone();
        let buf = c.alloc::<f32>(16).unwrap();
        let whole = Slice {
            mem: buf.memory(),
            offset: 0,
            bytes: 64,
        };
        // SAFETY: as in the test above.
        let (on, st) = unsafe {
            (
                CommRef::borrow_raw(c.backend().raw_comm(), 1, 0),
                StreamRef::borrow_raw(std::ptr::null_mut()),
            )
        };
        let both = Sides {
            send: Some(&whole),
            recv: Some(&whole),
            config: None,
        };
        let per = |counts: &'static [usize], displs: &'static [usize]| Counts { counts, displs };
        let before = calls(&path, "ncclAllToAllv");
        let far = api.all_to_allv(
            both,
            per(&[4], &[0]),
            per(&[4], &[14]),
            DataType::F32,
            on,
            st,
        );
        assert!(matches!(far, Err(Error::InvalidArgument { .. })), "{far:?}");
        assert_eq!(
            calls(&path, "ncclAllToAllv"),
            before,
            "the library was called"
        );
        let both = Sides {
            send: Some(&whole),
            recv: Some(&whole),
            config: None,
        };
        let empty = per(&[0], &[1000]);
        let fine = api.all_to_allv(both, empty, per(&[0], &[1000]), DataType::F32, on, st);
        assert!(fine.is_ok(), "{fine:?}");
        assert_eq!(calls(&path, "ncclAllToAllv"), before + 1);
    }

    /// A library new enough for a call but built without its entry point is not "too old":
    /// the error says the symbol is missing, not that the version is.
    #[test]
    fn a_missing_entry_point_of_a_new_enough_library_is_named_as_missing() {
        let path = fake("nccl228");
        let api = unicomm_nccl_api::Api::open(flavors(false, false), &path).unwrap();
        let absent: Option<fn()> = None;
        let e = api
            .gated("something", unicomm_core::Version::new(2, 14, 0), absent)
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not export it"), "{e}");
        let old = api
            .gated(
                "something newer",
                unicomm_core::Version::new(2, 99, 0),
                Some(()),
            )
            .unwrap_err()
            .to_string();
        assert!(
            old.contains(">= 2.99.0") && !old.contains("does not export"),
            "{old}"
        );
    }

    /// The common call goes to the library without `Op::check` (its call layer checks the
    /// ranges), so whatever the call layer does not check must keep it off that route: a range
    /// not on an element boundary (the mock refuses it: its kernels read typed slices), a
    /// missing side of a zero-element call, and an overflowing all-gather (a window check runs
    /// before the call's own) are each refused, the library never called.
    #[test]
    fn the_common_route_refuses_what_the_contract_refuses_before_the_library_is_called() {
        use unicomm_core::{Collective, Kind, Op, ReduceOp};
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        let st = c.create_stream().unwrap();
        let buf = c.alloc::<f32>(16).unwrap();
        let mem = buf.memory();
        let at = |offset, bytes| Slice { mem, offset, bytes };
        let sum = Kind::AllReduce { op: ReduceOp::Sum };
        let before = calls(&path, "ncclAllReduce");
        let invalid = |r: unicomm_core::Result<()>| matches!(r, Err(Error::InvalidArgument { .. }));
        // Two bytes in: inside the allocation and long enough, but not on a float's boundary.
        let skewed = Op::new(sum, at(2, 8), at(2, 8), 2, DataType::F32);
        assert!(
            invalid(
                c.backend()
                    .enqueue(unicomm_core::Work::Collective(&skewed), &st)
            ),
            "a skewed range was accepted"
        );
        let mut missing = Op::new(sum, at(0, 8), at(0, 8), 0, DataType::F32);
        missing.recv = None;
        assert!(
            invalid(
                c.backend()
                    .enqueue(unicomm_core::Work::Collective(&missing), &st)
            ),
            "a missing side was accepted"
        );
        assert_eq!(
            calls(&path, "ncclAllReduce"),
            before,
            "the library was called"
        );
        let huge = Op::new(
            Kind::AllGather,
            at(0, 64),
            at(0, 64),
            usize::MAX / 2,
            DataType::F32,
        );
        assert!(invalid(
            c.backend()
                .enqueue(unicomm_core::Work::Collective(&huge), &st)
        ));
        // What is well formed still goes through.
        let fine = Op::new(sum, at(4, 8), at(8, 8), 2, DataType::F32);
        c.backend()
            .enqueue(unicomm_core::Work::Collective(&fine), &st)
            .unwrap();
        assert_eq!(calls(&path, "ncclAllReduce"), before + 1);
    }
}
