//! The mock's checks and failure paths: cross-rank mismatches, registration rules, bad
//! input, fault injection and deadlines.

use std::time::{Duration, Instant};

use unicomm_core::{Comm, DeviceStream, Error, ReduceOp};
use unicomm_mock::{Fault, FaultKind, MockComm, MockConfig};

fn world(n: usize) -> Vec<Comm<MockComm>> {
    unicomm_mock::local_comms_with(
        n,
        MockConfig {
            timeout: Duration::from_secs(10),
            faults: vec![],
            ..MockConfig::default()
        },
    )
    .unwrap()
}

fn fast(n: usize, faults: Vec<Fault>) -> Vec<Comm<MockComm>> {
    unicomm_mock::local_comms_with(
        n,
        MockConfig {
            timeout: Duration::from_millis(300),
            faults,
            ..MockConfig::default()
        },
    )
    .unwrap()
}

/// Runs `f` on one thread per rank and returns the results in rank order.
fn each<R: Send>(comms: &[Comm<MockComm>], f: impl Fn(&Comm<MockComm>) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn ranks_calling_different_ops_get_mismatch_on_every_rank() {
    let comms = world(3);
    let out = each(&comms, |c| {
        let st = c.create_stream().unwrap();
        let mut b = c.alloc::<f32>(8).unwrap();
        if c.rank() == 1 {
            c.broadcast_in_place(&mut b, 0, &st).unwrap();
        } else {
            c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
        }
        st.synchronize()
    });
    for r in out {
        match r {
            Err(Error::Mismatch { what, detail }) => {
                assert_eq!(what, "operation");
                assert!(detail.contains("Broadcast"), "{detail}");
            }
            other => panic!("expected Mismatch, got {other:?}"),
        }
    }
}

#[test]
fn counts_types_roots_and_ops_must_agree() {
    let comms = world(2);
    type Case = (
        &'static str,
        fn(&Comm<MockComm>) -> unicomm_core::Result<()>,
    );
    let cases: [Case; 4] = [
        ("count", |c| {
            let st = c.create_stream()?;
            let mut b = c.alloc::<f32>(4 + c.rank())?;
            c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)?;
            st.synchronize()
        }),
        ("data type", |c| {
            let st = c.create_stream()?;
            if c.rank() == 0 {
                c.all_reduce_in_place(&mut c.alloc::<f32>(4)?, ReduceOp::Sum, &st)?;
            } else {
                c.all_reduce_in_place(&mut c.alloc::<i32>(4)?, ReduceOp::Sum, &st)?;
            }
            st.synchronize()
        }),
        ("root", |c| {
            let st = c.create_stream()?;
            c.broadcast_in_place(&mut c.alloc::<u8>(4)?, c.rank(), &st)?;
            st.synchronize()
        }),
        ("reduction", |c| {
            let st = c.create_stream()?;
            let op = if c.rank() == 0 {
                ReduceOp::Max
            } else {
                ReduceOp::Min
            };
            c.all_reduce_in_place(&mut c.alloc::<u8>(4)?, op, &st)?;
            st.synchronize()
        }),
    ];
    for (want, f) in cases {
        for r in each(&comms, f) {
            match r {
                Err(Error::Mismatch { what, .. }) => assert_eq!(what, want),
                other => panic!("{want}: expected Mismatch, got {other:?}"),
            }
        }
    }
    // The world still works after mismatches (they are detected before any data moves).
    let ok = each(&comms, |c| {
        let st = c.create_stream()?;
        let mut b = c.alloc::<f32>(4)?;
        b.copy_from_host(&[1.0; 4], &st)?;
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)?;
        b.copy_to_host(&st)
    });
    for r in ok {
        assert_eq!(r.unwrap(), vec![2.0; 4]);
    }
}

#[test]
fn registration_is_all_or_none_across_ranks() {
    let comms = world(2);
    let out = each(&comms, |c| {
        let st = c.create_stream().unwrap();
        let buf = c.alloc::<f32>(16).unwrap();
        if c.rank() == 0 {
            let mut reg = c.register(buf).unwrap();
            c.all_reduce_in_place(&mut reg, ReduceOp::Sum, &st).unwrap();
            let r = st.synchronize();
            c.deregister(reg).unwrap();
            r
        } else {
            let mut buf = buf;
            c.all_reduce_in_place(&mut buf, ReduceOp::Sum, &st).unwrap();
            st.synchronize()
        }
    });
    for r in out {
        match r {
            Err(Error::Mismatch { what, .. }) => assert!(what.contains("registration"), "{what}"),
            other => panic!("expected Mismatch, got {other:?}"),
        }
    }
}

#[test]
fn handles_of_another_communicator_and_double_deregistration_are_errors() {
    let comms = world(2);
    let (a, b) = (&comms[0], &comms[1]);
    let reg = a.register(a.alloc::<u32>(8).unwrap()).unwrap();
    let h = reg.handle();
    match b.deregister(reg) {
        Err(Error::InvalidArgument { argument, .. }) => assert_eq!(argument, "registration"),
        other => panic!("expected InvalidArgument, got {:?}", other.map(|_| ())),
    }
    // The registration was released by its own communicator when it was dropped.
    use unicomm_core::Collective;
    assert!(matches!(
        a.backend().deregister(h),
        Err(Error::InvalidArgument { .. })
    ));
    // Raw level: twice is an error, not UB.
    let mem = a.backend().alloc(64).unwrap();
    let h = a.backend().register(&mem, 0, 64).unwrap();
    a.backend().deregister(h).unwrap();
    assert!(matches!(
        a.backend().deregister(h),
        Err(Error::InvalidArgument { .. })
    ));
    // Another communicator's raw handle.
    let h = a.backend().register(&mem, 0, 64).unwrap();
    assert!(b.backend().deregister(h).is_err());
    a.backend().deregister(h).unwrap();
}

#[test]
fn memory_of_another_rank_is_rejected() {
    let comms = world(2);
    let st = comms[0].create_stream().unwrap();
    let mut foreign = comms[1].alloc::<f32>(4).unwrap();
    match comms[0].all_reduce_in_place(&mut foreign, ReduceOp::Sum, &st) {
        Err(Error::InvalidArgument { argument, .. }) => assert_eq!(argument, "buffer"),
        other => panic!("{other:?}"),
    }
    let other_stream = comms[1].create_stream().unwrap();
    let mut mine = comms[0].alloc::<f32>(4).unwrap();
    assert!(matches!(
        comms[0].all_reduce_in_place(&mut mine, ReduceOp::Sum, &other_stream),
        Err(Error::InvalidArgument {
            argument: "stream",
            ..
        })
    ));
}

#[test]
fn bad_input_is_invalid_argument_naming_the_argument() {
    let comms = world(3);
    let c = &comms[0];
    let st = c.create_stream().unwrap();
    let arg = |r: unicomm_core::Result<()>| match r {
        Err(Error::InvalidArgument { argument, .. }) => argument,
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    // count x element size overflows
    assert_eq!(arg(c.alloc::<f64>(usize::MAX / 4).map(drop)), "len");
    let send = c.alloc::<f32>(10).unwrap();
    let mut small = c.alloc::<f32>(9).unwrap();
    // a receive buffer smaller than the count
    assert_eq!(
        arg(c.all_reduce(&send, &mut small, ReduceOp::Sum, &st)),
        "recv"
    );
    assert_eq!(arg(c.all_gather(&send, &mut small, &st)), "recv");
    // counts that do not split over the ranks
    assert_eq!(arg(c.all_to_all(&send, &mut small, &st)), "send");
    assert_eq!(
        arg(c.reduce_scatter(&send, &mut small, ReduceOp::Sum, &st)),
        "send"
    );
    // roots and peers out of range
    let mut b = c.alloc::<f32>(3).unwrap();
    assert_eq!(arg(c.broadcast_in_place(&mut b, 3, &st)), "root");
    assert_eq!(
        arg(c.reduce_in_place(&mut b, ReduceOp::Sum, 7, &st)),
        "root"
    );
    assert_eq!(arg(c.send(&b, 3, &st)), "peer");
    assert_eq!(arg(c.recv(&mut b, usize::MAX, &st)), "peer");
    // slices out of range, and host copies larger than the buffer
    assert_eq!(arg(b.slice(2..5).map(drop)), "range");
    assert_eq!(arg(b.copy_from_host(&[0.0; 4], &st)), "src");
    // nothing was enqueued by the failed calls
    st.synchronize().unwrap();
}

#[test]
fn raw_level_rejects_out_of_bounds_and_partial_overlap() {
    use unicomm_core::{Collective, DataType, Kind, Op, Slice};
    let comms = world(1);
    let c = comms[0].backend();
    let st = c.create_stream().unwrap();
    let mem = c.alloc(64).unwrap();
    let s = |offset, bytes| Slice {
        mem: &mem,
        offset,
        bytes,
    };
    let r = c.enqueue(
        unicomm_core::Work::Collective(&Op::new(
            Kind::AllReduce { op: ReduceOp::Sum },
            s(0, 64),
            s(0, 64),
            32,
            DataType::F32,
        )),
        &st,
    );
    assert!(
        matches!(
            r,
            Err(Error::InvalidArgument {
                argument: "send",
                ..
            })
        ),
        "{r:?}"
    );
    let r = c.enqueue(
        unicomm_core::Work::Collective(&Op::new(
            Kind::AllReduce { op: ReduceOp::Sum },
            s(0, 32),
            s(16, 32),
            8,
            DataType::F32,
        )),
        &st,
    );
    assert!(
        matches!(
            r,
            Err(Error::InvalidArgument {
                argument: "recv",
                ..
            })
        ),
        "{r:?}"
    );
    let r = c.enqueue(
        unicomm_core::Work::Collective(&Op::new(
            Kind::AllToAll,
            s(0, 32),
            s(0, 32),
            8,
            DataType::F32,
        )),
        &st,
    );
    assert!(r.is_err(), "in-place all-to-all must be rejected");
}

/// A raw all-gather whose count overflows the byte arithmetic is refused as an argument,
/// not a panic (debug) or a wrapped size (release) in the window test before the check.
#[test]
fn raw_all_gather_with_an_overflowing_count_is_refused_not_a_panic() {
    use unicomm_core::{Collective, DataType, Kind, Op, Slice};
    let comms = world(2);
    let c = comms[0].backend();
    let st = c.create_stream().unwrap();
    let mem = c.alloc(64).unwrap();
    let s = |offset, bytes| Slice {
        mem: &mem,
        offset,
        bytes,
    };
    for count in [usize::MAX, usize::MAX / 4 + 1, 1 << 62] {
        let r = c.enqueue(
            unicomm_core::Work::Collective(&Op::new(
                Kind::AllGather,
                s(0, 32),
                s(0, 64),
                count,
                DataType::F32,
            )),
            &st,
        );
        assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    }
}

/// Through the backend's own door (no typed `Comm` check before it), a receive layout whose
/// ranges share elements is refused before anything runs, on every rank: peer 1's elements
/// would otherwise overwrite peer 0's second one (seen as `[0, 100, 101, 0, ...]`).
#[test]
fn the_backend_refuses_receive_ranges_that_share_elements() {
    use unicomm_core::{Collective, Counts, DataType, Kind, Layout, Op, Slice};
    let comms = world(4);
    let out = each(&comms, |c| {
        let b = c.backend();
        let st = b.create_stream().unwrap();
        let (send, recv) = (b.alloc(32).unwrap(), b.alloc(32).unwrap());
        let whole = |mem| Slice {
            mem,
            offset: 0,
            bytes: 32,
        };
        let counts = [2usize; 4];
        let (packed, bad) = ([0usize, 2, 4, 6], [0usize, 1, 4, 6]);
        let layout = Layout {
            send: Some(Counts {
                counts: &counts,
                displs: &packed,
            }),
            recv: Some(Counts {
                counts: &counts,
                displs: &bad,
            }),
        };
        let op = Op::with(
            Kind::AllToAllV,
            Some(whole(&send)),
            Some(whole(&recv)),
            0,
            DataType::I32,
            layout,
        );
        b.enqueue(unicomm_core::Work::Collective(&op), &st)
    });
    for r in out {
        assert!(
            matches!(&r, Err(Error::InvalidArgument { argument: "recv", reason }) if reason.contains("rank 0") && reason.contains("rank 1")),
            "{r:?}"
        );
    }
}

#[test]
fn a_view_inside_a_registration_counts_as_registered() {
    let comms = world(1);
    let c = &comms[0];
    let st = c.create_stream().unwrap();
    let mut reg = c.register(c.alloc::<f32>(16).unwrap()).unwrap();
    c.all_reduce_in_place(&mut reg.slice_mut(4..8).unwrap(), ReduceOp::Sum, &st)
        .unwrap();
    st.synchronize().unwrap();
    c.deregister(reg).unwrap();
}

#[test]
fn partially_registered_buffer_is_rejected_at_the_call() {
    use unicomm_core::{Collective, DataType, Kind, Op, Slice};
    let comms = world(1);
    let c = comms[0].backend();
    let st = c.create_stream().unwrap();
    let mem = c.alloc(64).unwrap();
    let h = c.register(&mem, 0, 32).unwrap();
    let half = Slice {
        mem: &mem,
        offset: 16,
        bytes: 32,
    };
    let r = c.enqueue(
        unicomm_core::Work::Collective(&Op::new(
            Kind::AllReduce { op: ReduceOp::Sum },
            half,
            half,
            8,
            DataType::F32,
        )),
        &st,
    );
    assert!(
        matches!(
            r,
            Err(Error::InvalidArgument {
                argument: "buffer",
                ..
            })
        ),
        "{r:?}"
    );
    c.deregister(h).unwrap();
}

#[test]
fn a_rank_that_never_arrives_times_out_the_others() {
    let comms = fast(
        3,
        vec![Fault {
            rank: 2,
            op: 0,
            kind: FaultKind::Hang,
        }],
    );
    let t0 = Instant::now();
    let out = each(&comms, |c| {
        let st = c.create_stream().unwrap();
        let mut b = c.alloc::<f32>(4).unwrap();
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
        st.synchronize()
    });
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
    for (r, res) in out.iter().enumerate() {
        match res {
            Err(Error::Timeout { what, .. }) => {
                assert!(what.contains("rank(s) 2 never arrived"), "rank {r}: {what}")
            }
            other => panic!("rank {r}: expected Timeout, got {other:?}"),
        }
    }
    // The failure is sticky: later work fails at once instead of hanging.
    let st = comms[0].create_stream();
    assert!(st.is_err());
}

#[test]
fn a_rank_that_fails_reports_its_error_and_the_others_time_out() {
    let comms = fast(
        2,
        vec![Fault {
            rank: 1,
            op: 1,
            kind: FaultKind::Fail,
        }],
    );
    let out = each(&comms, |c| {
        let st = c.create_stream().unwrap();
        let mut b = c.alloc::<i32>(4).unwrap();
        b.copy_from_host(&[1; 4], &st).unwrap();
        // op 0: succeeds everywhere
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
        st.synchronize().unwrap();
        // op 1: rank 1 fails; the error surfaces at synchronize, not at the call
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
        st.synchronize()
    });
    assert!(
        matches!(&out[0], Err(Error::Timeout { .. })),
        "{:?}",
        out[0]
    );
    assert!(
        matches!(&out[1], Err(Error::Device { name, .. }) if name == "InjectedFault"),
        "{:?}",
        out[1]
    );
}

#[test]
fn abort_wakes_peers_blocked_in_a_collective() {
    let mut comms = world(2);
    let c1 = comms.pop().unwrap();
    let c0 = comms.pop().unwrap();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            let st = c0.create_stream().unwrap();
            let mut b = c0.alloc::<f32>(4).unwrap();
            c0.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
            st.synchronize()
        });
        std::thread::sleep(Duration::from_millis(100));
        // A rank that failed before its collective aborts (through a shared reference,
        // as the examples' runner does) instead of leaving its peer to the deadline.
        c1.abort().unwrap();
        let r = h.join().unwrap();
        assert!(matches!(r, Err(Error::Aborted { .. })), "{r:?}");
        // Who left is data, not only words: what the survivor hands to shrink.
        assert_eq!(r.unwrap_err().lost_ranks(), &[1]);
    });
    assert!(t0.elapsed() < Duration::from_secs(5));
    // Every later call on the aborted communicator is an error, not a hang.
    assert!(matches!(c1.create_stream(), Err(Error::Aborted { .. })));
}

#[test]
fn grouped_send_recv_between_the_same_ranks_does_not_deadlock() {
    let comms = world(2);
    let out = each(&comms, |c| {
        let st = c.create_stream()?;
        let peer = 1 - c.rank();
        let mut a = c.alloc::<u64>(1000)?;
        a.copy_from_host(&vec![c.rank() as u64 + 10; 1000], &st)?;
        let mut b = c.alloc::<u64>(1000)?;
        c.group(|| {
            c.send(&a, peer, &st)?;
            c.recv(&mut b, peer, &st)
        })?;
        let _ = &mut a;
        b.copy_to_host(&st)
    });
    assert_eq!(out[0].as_ref().unwrap()[999], 11);
    assert_eq!(out[1].as_ref().unwrap()[0], 10);
}

#[test]
fn send_recv_count_mismatch_is_reported() {
    let comms = world(2);
    let out = each(&comms, |c| {
        let st = c.create_stream()?;
        if c.rank() == 0 {
            c.send(&c.alloc::<f32>(10)?, 1, &st)?;
        } else {
            c.recv(&mut c.alloc::<f32>(11)?, 0, &st)?;
        }
        st.synchronize()
    });
    for r in out {
        assert!(
            matches!(
                r,
                Err(Error::Mismatch {
                    what: "send/recv",
                    ..
                })
            ),
            "{r:?}"
        );
    }
}

#[test]
fn windows_of_different_sizes_are_a_mismatch() {
    let comms = world(2);
    let out = each(&comms, |c| {
        c.register_window(c.alloc::<f32>(8 + c.rank()).unwrap())
            .map(drop)
            .map_err(|e| e.error)
    });
    for r in out {
        assert!(
            matches!(r, Err(Error::Mismatch { what: "count", .. })),
            "{r:?}"
        );
    }
}

#[test]
fn register_failure_hands_the_buffer_back() {
    let comms = world(2);
    let err = comms[0]
        .register(comms[1].alloc::<f32>(4).unwrap())
        .expect_err("foreign memory cannot be registered");
    assert!(matches!(err.error, Error::InvalidArgument { .. }));
    assert_eq!(err.buffer.len(), 4);
}

#[test]
fn single_thread_drives_every_rank_inside_a_group() {
    let comms = world(4);
    let streams: Vec<_> = comms.iter().map(|c| c.create_stream().unwrap()).collect();
    let mut bufs: Vec<_> = comms
        .iter()
        .zip(&streams)
        .map(|(c, s)| {
            let mut b = c.alloc::<f64>(5).unwrap();
            b.copy_from_host(&[c.rank() as f64; 5], s).unwrap();
            b
        })
        .collect();
    comms[0]
        .group(|| {
            for ((c, s), b) in comms.iter().zip(&streams).zip(bufs.iter_mut()) {
                c.all_reduce_in_place(b, ReduceOp::Max, s)?;
            }
            Ok(())
        })
        .unwrap();
    for (b, s) in bufs.iter().zip(&streams) {
        assert_eq!(b.copy_to_host(s).unwrap(), vec![3.0; 5]);
    }
}

/// A panic inside `group`, caught by the caller, closes the group: the rank's later
/// collectives run (they are not deferred to a group that never ends).
#[test]
fn a_panic_inside_group_closes_the_group() {
    let comms = world(1);
    let c = &comms[0];
    let st = c.create_stream().unwrap();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = c.group(|| -> unicomm_core::Result<()> { panic!("inside the group") });
    }));
    assert!(caught.is_err());
    let mut b = c.alloc::<f32>(4).unwrap();
    b.copy_from_host(&[1.0; 4], &st).unwrap();
    c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
    st.synchronize().unwrap();
    assert_eq!(b.copy_to_host(&st).unwrap(), vec![1.0; 4]);
    // And the group nesting is back to zero: a stray group_end is an error.
    use unicomm_core::Collective;
    assert!(c.backend().group_end().is_err());
}

/// A raw operation on a misaligned range is refused before any kernel reads it (the mock's
/// kernels view buffers as typed slices, which must be aligned).
#[test]
fn misaligned_raw_ranges_are_refused() {
    use unicomm_core::{Collective, DataType, Kind, Op, Slice};
    let comms = world(1);
    let c = comms[0].backend();
    let st = c.create_stream().unwrap();
    let mem = c.alloc(64).unwrap();
    let odd = Slice {
        mem: &mem,
        offset: 1,
        bytes: 32,
    };
    let r = c.enqueue(
        unicomm_core::Work::Collective(&Op::new(
            Kind::AllReduce { op: ReduceOp::Sum },
            odd,
            odd,
            8,
            DataType::F32,
        )),
        &st,
    );
    assert!(
        matches!(
            r,
            Err(Error::InvalidArgument {
                argument: "send",
                ..
            })
        ),
        "{r:?}"
    );
    st.synchronize().unwrap();
}

/// A raw handle of another communicator is not taken as one's own (handles are unique in
/// the process), and the owner's registration survives the attempt.
#[test]
fn a_foreign_raw_handle_is_an_error_and_leaves_the_owner_registered() {
    use unicomm_core::Collective;
    let (a, b) = (world(1), world(1));
    let (a, b) = (a[0].backend(), b[0].backend());
    let mem = a.alloc(64).unwrap();
    let h = a.register(&mem, 0, 64).unwrap();
    let _other = b.register(&b.alloc(64).unwrap(), 0, 64).unwrap();
    assert!(matches!(
        b.deregister(h),
        Err(Error::InvalidArgument { .. })
    ));
    a.deregister(h).unwrap();
}

/// Host copies must be ordered on a stream of the memory's own rank.
#[test]
fn a_copy_on_another_ranks_stream_is_refused() {
    let comms = world(2);
    let st1 = comms[1].create_stream().unwrap();
    let mut b = comms[0].alloc::<f32>(4).unwrap();
    let r = b.copy_from_host(&[1.0; 4], &st1);
    assert!(
        matches!(
            r,
            Err(Error::InvalidArgument {
                argument: "stream",
                ..
            })
        ),
        "{r:?}"
    );
    assert!(matches!(
        b.copy_to_host(&st1),
        Err(Error::InvalidArgument { .. })
    ));
}

/// A rank that drops its communicator while panicking will not do its part: the drop
/// aborts, and its peers fail at once, not at their deadline.
#[test]
fn a_rank_that_panics_holding_its_communicator_fails_its_peers_at_once() {
    let mut comms = world(2);
    let c1 = comms.pop().unwrap();
    let c0 = comms.pop().unwrap();
    let t0 = Instant::now();
    let r = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let st = c0.create_stream().unwrap();
            let mut b = c0.alloc::<f32>(4).unwrap();
            c0.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
            st.synchronize()
        });
        std::thread::sleep(Duration::from_millis(100));
        let p = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _c1 = c1;
            panic!("rank 1 fails holding its communicator");
        }));
        assert!(p.is_err());
        h.join().unwrap()
    });
    assert!(matches!(r, Err(Error::Aborted { .. })), "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

/// NCCL's rule (ncclCommDestroy finalizes a communicator that was not finalized): a
/// communicator dropped without `finalize` is finalized; a peer that goes on with its own
/// work is not disturbed.
#[test]
fn a_communicator_dropped_without_finalize_is_finalized_not_aborted() {
    let mut comms = world(2);
    let c1 = comms.pop().unwrap();
    let c0 = comms.pop().unwrap();
    let out = std::thread::scope(|s| {
        let h = s.spawn(move || {
            let st = c1.create_stream().unwrap();
            let mut b = c1.alloc::<f32>(4).unwrap();
            c1.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
            st.synchronize().unwrap();
            drop(b);
            drop(st);
            // Dropped, not finalized.
        });
        let st = c0.create_stream().unwrap();
        let mut b = c0.alloc::<f32>(4).unwrap();
        b.copy_from_host(&[1.0; 4], &st).unwrap();
        c0.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
        st.synchronize().unwrap();
        h.join().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        // Rank 0's own work after its peer left still runs (a copy needs no peer).
        let host = b.copy_to_host(&st);
        drop(b);
        (host, c0.finalize())
    });
    assert_eq!(out.0.unwrap(), vec![1.0; 4]);
    out.1.unwrap();
}

/// A window dropped while its thread unwinds does not block for the deadline: the
/// communicator is aborted (peers learn at once) and the memory is leaked.
#[test]
fn a_window_dropped_while_unwinding_does_not_wait_for_the_deadline() {
    let comms = world(2);
    let t0 = Instant::now();
    // Rank 1 fails only once both ranks are past the (collective) registration.
    let registered = std::sync::Barrier::new(2);
    let out = each(&comms, |c| {
        let win = c.register_window(c.alloc::<f32>(16).unwrap()).unwrap();
        registered.wait();
        if c.rank() == 1 {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let _w = win;
                panic!("rank 1 fails holding a window");
            }));
            assert!(r.is_err());
            return Err(Error::aborted("rank 1 panicked"));
        }
        // Rank 0 deregisters collectively: the peer's abort ends its wait.
        c.deregister_window(win).map(drop)
    });
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(matches!(out[0], Err(Error::Aborted { .. })), "{:?}", out[0]);
}

/// Empty buffers in one group (all of them at the same dangling address) do not make the
/// group wait on itself until the deadline.
#[test]
fn empty_buffers_in_one_group_do_not_deadlock() {
    let comms = unicomm_mock::local_comms_with(
        2,
        MockConfig {
            timeout: Duration::from_secs(3),
            faults: vec![],
            ..MockConfig::default()
        },
    )
    .unwrap();
    let t0 = Instant::now();
    let out = each(&comms, |c| {
        let st = c.create_stream()?;
        let a = c.alloc::<f32>(0)?;
        let mut b = c.alloc::<f32>(0)?;
        let d = c.alloc::<f32>(0)?;
        let mut e = c.alloc::<f32>(0)?;
        c.group(|| {
            c.all_reduce(&a, &mut b, ReduceOp::Sum, &st)?;
            c.all_reduce(&d, &mut e, ReduceOp::Sum, &st)?;
            c.all_reduce(&a, &mut e, ReduceOp::Sum, &st)
        })?;
        st.synchronize()
    });
    for o in out {
        o.unwrap();
    }
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
}

/// One rule in threads and processes: a rank that drops (or finalizes) its communicator
/// after fewer collectives than its peers is named at once by every peer waiting on a
/// collective it will never join (not after the 10 s deadline), and at its own finalize
/// where they already wait; peers that made as many calls as it did are not disturbed.
#[test]
fn a_rank_that_leaves_early_is_named_at_once_by_the_peers_waiting_for_it() {
    let comms = world(3);
    let t0 = Instant::now();
    let out = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| {
                s.spawn(move || -> Vec<unicomm_core::Result<()>> {
                    let st = c.create_stream().unwrap();
                    let mut b = c.alloc::<f32>(4).unwrap();
                    let first = c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st);
                    let first = first.and_then(|()| st.synchronize());
                    if c.rank() == 2 {
                        // Its peers are in their second collective by now.
                        std::thread::sleep(Duration::from_millis(300));
                        drop(b);
                        return vec![first, c.finalize()];
                    }
                    let second = c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st);
                    vec![first, second.and_then(|()| st.synchronize())]
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    for (r, v) in out.iter().enumerate() {
        assert!(v[0].is_ok(), "rank {r}'s first collective: {:?}", v[0]);
        match &v[1] {
            Err(Error::Mismatch { detail, .. }) => {
                assert!(
                    detail.contains("rank 2") && detail.contains("after 1 collective"),
                    "{detail}"
                )
            }
            other => panic!("rank {r}: {other:?}"),
        }
    }
    // The same number of calls everywhere: a drop disturbs no one.
    let comms = world(3);
    let done: Vec<unicomm_core::Result<()>> = each(&comms, |c| {
        let st = c.create_stream().unwrap();
        let mut b = c.alloc::<f32>(4).unwrap();
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)
            .and_then(|()| st.synchronize())
    });
    assert!(done.iter().all(|r| r.is_ok()), "{done:?}");
    let mut comms = comms;
    drop(comms.pop());
    for c in comms {
        c.finalize().unwrap();
    }
}

/// Ranks disagreeing on an all_to_all_v's counts: rank 0 sends 3 elements to rank 1, which
/// expects 2. Every rank gets the same `Mismatch` naming the pair and both counts, at that
/// call and promptly (not a deadline, no internal id): the ranks compare their layouts
/// before any data moves, and the world is poisoned with it, as NCCL's grouped calls would
/// corrupt or hang the whole communicator; the next call gets it too.
#[test]
fn disagreeing_all_to_all_v_counts_are_a_mismatch_on_every_rank_at_once() {
    use unicomm_core::{packed_displs, Counts};
    let named = |r: &unicomm_core::Result<()>| {
        matches!(r, Err(Error::Mismatch { detail, .. })
            if detail == "all_to_all_v: rank 0 sends 3 elements to rank 1, which receives 2 from it")
    };
    for _ in 0..5 {
        let comms = world(4);
        // Every rank set up before any starts: the poison also refuses new streams.
        let ready = std::sync::Barrier::new(4);
        let t0 = Instant::now();
        let out = each(&comms, |c| {
            let (r, w) = (c.rank(), c.world_size());
            let st = c.create_stream().unwrap();
            let mut sc = vec![2usize; w];
            if r == 0 {
                sc[1] = 3;
            }
            let rc = vec![2usize; w];
            let (sd, rd) = (packed_displs(&sc).unwrap(), packed_displs(&rc).unwrap());
            let send = c.alloc::<f32>(sc.iter().sum()).unwrap();
            let mut recv = c.alloc::<f32>(2 * w).unwrap();
            let s = Counts {
                counts: &sc,
                displs: &sd,
            };
            let rcs = Counts {
                counts: &rc,
                displs: &rd,
            };
            ready.wait();
            let first = c
                .all_to_all_v(&send, s, &mut recv, rcs, &st)
                .and_then(|()| st.synchronize());
            let next = c
                .all_reduce_in_place(&mut recv, ReduceOp::Sum, &st)
                .and_then(|()| st.synchronize());
            (first, next)
        });
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        for (r, (first, next)) in out.iter().enumerate() {
            assert!(named(first), "rank {r}: {first:?}");
            assert!(named(next), "rank {r}'s next call: {next:?}");
        }
    }
}
