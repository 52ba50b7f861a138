//! Automatic registration on a communicator without symmetric windows (NCCL's NULL window:
//! NCCL 2.32.3 gives none to ranks it sees on separate hosts, found on an H100): the buffers
//! are `ncclCommRegister`ed with this communicator and the second, every path the policy
//! picks runs exact (the copy engines, which need a window, give way to the registered
//! path), and the deregistration ends the buffer registrations, never a window. In a process
//! of its own: the fake's NULL window is a process-wide setting.

use crate::common::{calls, comm, fake, flavors};

isolated! {
    #[test]
    fn without_symmetric_windows_automatic_registration_registers_buffers() {
        // Before the fake is loaded or any thread runs.
        std::env::set_var("FAKE_NCCL_NULL_WINDOW", "1");
        let path = fake("nccl228");
        // SAFETY: the fake's initialisers do nothing; held so its counters outlive the comm.
        let _keep = unsafe { libloading::Library::new(&path) }.unwrap();
        let c = comm(flavors(false, false), &path);
        let count = |name: &str| calls(&path, name);
        // A window is refused here: what the automatic registration works around.
        assert!(c.register_window(c.alloc::<f32>(8).unwrap()).is_err());
        let st = c.create_stream().unwrap();
        let n = 4 << 20;
        let regs = count("ncclCommRegister");
        let mut a = c.register_auto(c.alloc::<f32>(n).unwrap()).unwrap();
        let mut b = c.register_auto(c.alloc::<f32>(n).unwrap()).unwrap();
        // Each buffer on this communicator and on the second.
        assert_eq!(count("ncclCommRegister") - regs, 4);
        let input: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
        a.copy_from_host(&input, &st).unwrap();
        // Small: this communicator (registered buffers where a window would be).
        let ar = count("ncclAllReduce");
        crate::sum_two!(c, a, b, &st)
        .unwrap();
        assert_eq!(count("ncclAllReduce") - ar, 1);
        assert_eq!(b.copy_to_host(&st).unwrap()[..2], input[..2]);
        // 16 MiB all_to_all, the copy engines' size: the registered path instead (no window).
        let a2a_split = count("ncclAlltoAll:split");
        c.all_to_all(&a, &mut b, &st).unwrap();
        assert_eq!(count("ncclAlltoAll:split") - a2a_split, 1);
        assert_eq!(b.copy_to_host(&st).unwrap(), input);
        let (deregs, windows) = (
            count("ncclCommDeregister"),
            count("ncclCommWindowDeregister"),
        );
        c.deregister_auto(a).unwrap();
        c.deregister_auto(b).unwrap();
        assert_eq!(count("ncclCommDeregister") - deregs, 4);
        assert_eq!(
            count("ncclCommWindowDeregister"),
            windows,
            "no window to end"
        );
    }
}
