//! A window's deregistration waits for the device's work: NCCL's `ncclCommWindowDeregister`
//! unmaps the peers' mappings at once (read in 2.30.7's `symWindowDestroy`), while a kernel
//! of NCCL's or an engine's may still read them. The host "device" is held stuck while the
//! window is dropped: the library's deregistration comes only once it is released. Alone in
//! its binary (the stuck device and the fake's counters).

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::{calls, comm, fake, flavors, HANG};

isolated! {
    #[test]
    fn a_window_s_deregistration_waits_for_the_device() {
        let path = fake("nccl232");
        let c = comm(flavors(false, false), &path);
        let w = c.register_window(c.alloc::<f32>(64).unwrap()).unwrap();
        let before = calls(&path, "ncclCommWindowDeregister");
        HANG.store(true, Ordering::SeqCst);
        std::thread::scope(|s| {
            let t = s.spawn(|| c.deregister_window(w).map(drop));
            std::thread::sleep(Duration::from_millis(300));
            let early = calls(&path, "ncclCommWindowDeregister") - before;
            HANG.store(false, Ordering::SeqCst);
            assert_eq!(early, 0, "deregistered while the device still ran");
            t.join().unwrap().unwrap();
        });
        assert_eq!(calls(&path, "ncclCommWindowDeregister") - before, 1);
    }
}
