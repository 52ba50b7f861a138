//! NCCL's device communicator against fake NCCLs of 2.32 and 2.28: what reaches
//! `ncclDevCommCreate` for each layout (the version told, the runtime-version mode, the
//! barriers), the runtime layout's size from the properties, the teams, the end at drop;
//! the refusals before the library (a release too old, a layout older than 2.31.2's, no
//! barrier); unicomm's device-API kernel handed the struct's bytes, both windows and the
//! blocks, and refused for another layout. In a process of its own (the fake's counters).

use crate::common::{calls, comm, fake, flavors, DEVICE_LAUNCHES, MAPPED};
use unicomm_core::{
    CommConfig, DeviceCommLayout, DeviceCommRequirements, Error, ReduceOp, Version,
};

/// One test at a time: they read the fake's shared counters.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

fn built(version: Version, size: usize) -> DeviceCommRequirements {
    DeviceCommRequirements {
        layout: DeviceCommLayout::Built { version, size },
        lsa_barriers: 4,
        lsa_multimem: false,
    }
}

fn unsupported_naming<T: std::fmt::Debug>(r: Result<T, Error>, release: &str) {
    match r {
        Err(Error::Unsupported { needs, .. }) => assert!(needs.contains(release), "{needs}"),
        other => panic!("not Unsupported naming {release}: {other:?}"),
    }
}

isolated! {
    #[test]
    fn each_layout_reaches_the_library_as_nccl_2_32_reads_it() {
        let _one = serial();
        let path = fake("nccl232");
        let c = comm(flavors(false, false), &path);
        let dc = c.device_comm(&DeviceCommRequirements::runtime(3)).unwrap();
        assert_eq!(calls(&path, "devcomm create v23203 rt1 lsa3 mm0"), 1);
        assert_eq!(
            dc.kernel_arg().len(),
            248,
            "the runtime layout's size is the library's devCommRuntimeVersionSize"
        );
        assert_eq!(dc.kernel_arg()[..4], 0xcafe_beef_u32.to_ne_bytes());
        assert_eq!(dc.layout_version(), Version::new(2, 32, 3));
        assert_eq!(dc.world_team().ranks, 1);
        assert_eq!(dc.lsa_team().rank, 0);
        drop(dc);
        assert_eq!(calls(&path, "devcomm destroy v23203"), 1, "ended at drop");

        // Five barriers: a count no other test here asks for (the counters are shared).
        let mut five = built(Version::new(2, 31, 2), 200);
        five.lsa_barriers = 5;
        let dc = c.device_comm(&five).unwrap();
        assert_eq!(calls(&path, "devcomm create v23102 rt0 lsa5 mm0"), 1);
        assert_eq!(
            dc.kernel_arg().len(),
            200,
            "a built layout's size is its headers'"
        );
        assert_eq!(dc.kernel_arg()[4..8], 23102_u32.to_ne_bytes());
    }

    #[test]
    fn what_no_library_takes_is_refused_before_it() {
        let _one = serial();
        let path = fake("nccl232");
        let c = comm(flavors(false, false), &path);
        unsupported_naming(c.device_comm(&built(Version::new(2, 33, 0), 248)), "2.33.0");
        unsupported_naming(c.device_comm(&built(Version::new(2, 30, 7), 248)), "2.31.2");
        let mut none = DeviceCommRequirements::runtime(0);
        match c.device_comm(&none) {
            Err(Error::InvalidArgument { argument, .. }) => assert_eq!(argument, "lsa_barriers"),
            other => panic!("{other:?}"),
        }
        none.lsa_barriers = 1;
        none.layout = DeviceCommLayout::Built {
            version: Version::new(2, 32, 3),
            size: 0,
        };
        assert!(matches!(
            c.device_comm(&none),
            Err(Error::InvalidArgument { .. })
        ));
        for v in ["23300", "23007"] {
            assert_eq!(
                calls(&path, &format!("devcomm create v{v} rt0 lsa4 mm0")),
                0
            );
        }

        let old = fake("nccl228");
        let c = comm(flavors(false, false), &old);
        unsupported_naming(c.device_comm(&DeviceCommRequirements::runtime(1)), "2.31.2");
    }

    #[test]
    fn the_kernel_gets_the_struct_both_windows_and_a_block_per_barrier() {
        let _one = serial();
        MAPPED.store(true, std::sync::atomic::Ordering::SeqCst);
        let path = fake("nccl232");
        let c = comm(flavors(false, false), &path);
        let st = c.create_stream().unwrap();
        let send = c
            .register_window(c.upload(&[1.0f32; 64], &st).unwrap())
            .unwrap();
        let mut recv = c.register_window(c.alloc::<f32>(48).unwrap()).unwrap();

        let runtime_layout = c.device_comm(&DeviceCommRequirements::runtime(40)).unwrap();
        // The runtime layout of 2.32.3 is the kernel's: it takes it.
        c.all_reduce_device(&runtime_layout, &send, &mut recv, 48, ReduceOp::Max, &st)
            .unwrap();
        let (bytes, args, blocks) = DEVICE_LAUNCHES.lock().unwrap().pop().unwrap();
        assert_eq!(bytes, runtime_layout.kernel_arg());
        assert_eq!(
            (args.send, args.recv),
            (send.handle().0 as u64, recv.handle().0 as u64)
        );
        assert_eq!((args.count, args.op, args.rank), (48, 1, 0));
        assert_ne!(
            args.control, 0,
            "the control block's abort word is the kernel's to watch"
        );
        assert_eq!(args.timeout_ns, c.timeout().unwrap().as_nanos() as u64);
        assert_eq!(blocks, 32, "one block per barrier, at most 32");

        let other = c.device_comm(&built(Version::new(2, 31, 2), 248)).unwrap();
        unsupported_naming(
            c.all_reduce_device(&other, &send, &mut recv, 48, ReduceOp::Sum, &st),
            "2.32.3",
        );
        // A count past either window.
        let mut long = c.register_window(c.alloc::<f32>(65).unwrap()).unwrap();
        for count in [65, 49] {
            let w = if count == 65 { &mut long } else { &mut recv };
            assert!(matches!(
                c.all_reduce_device(&runtime_layout, &send, w, count, ReduceOp::Sum, &st),
                Err(Error::InvalidArgument { .. })
            ));
        }
        assert!(matches!(
            c.all_reduce_device(&runtime_layout, &send, &mut recv, 48, ReduceOp::Prod, &st),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(DEVICE_LAUNCHES.lock().unwrap().is_empty(), "none launched");
    }

    /// A non-blocking communicator's creation answers ncclInProgress: it is settled (polled)
    /// before the struct is read, and so is its end.
    #[test]
    fn a_non_blocking_communicator_s_device_communicator_is_settled_before_it_is_read() {
        let _one = serial();
        let path = fake("nccl232");
        let config = CommConfig {
            blocking: Some(false),
            ..CommConfig::default()
        };
        let c = comm(flavors(false, false), &path);
        let nb = c.split_with(Some(0), 0, &config).unwrap().expect("a child");
        let (progress, polls) = (
            calls(&path, "inProgress"),
            calls(&path, "ncclCommGetAsyncError"),
        );
        // A layout and barrier count no other test here asks for (the counters are shared).
        let mut reqs = built(Version::new(2, 31, 2), 248);
        reqs.lsa_barriers = 2;
        let dc = nb.device_comm(&reqs).unwrap();
        assert_eq!(calls(&path, "devcomm create v23102 rt0 lsa2 mm0"), 1);
        assert_eq!(
            calls(&path, "inProgress"),
            progress + 1,
            "the creation answered in progress"
        );
        assert!(
            calls(&path, "ncclCommGetAsyncError") - polls >= 3,
            "settled by polling"
        );
        assert_eq!(dc.kernel_arg()[..4], 0xcafe_beef_u32.to_ne_bytes());
        drop(dc);
        assert_eq!(
            calls(&path, "inProgress"),
            progress + 2,
            "its end settled too"
        );
    }
}
