//! A device communicator's end waits for the device's work: NCCL's `ncclDevCommDestroy`
//! unmaps its resource window's peer mappings at once (read in 2.30.7's
//! `symWindowDestroy`), so a kernel still running must be done first. The host "device" is
//! held stuck while the drop runs: the library's destroy comes only once it is released.
//! In a process of its own (the stuck device and the fake's counters).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::common::{calls, comm, fake, flavors, HANG};
use unicomm_core::DeviceCommRequirements;

isolated! {
    #[test]
    fn the_end_of_a_device_communicator_waits_for_the_device() {
        let path = fake("nccl232");
        let c = comm(flavors(false, false), &path);
        let dc = c.device_comm(&DeviceCommRequirements::runtime(1)).unwrap();
        HANG.store(true, Ordering::SeqCst);
        let dropped = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                drop(dc);
                dropped.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(Duration::from_millis(300));
            let early = calls(&path, "devcomm destroy v23203");
            HANG.store(false, Ordering::SeqCst);
            assert_eq!(early, 0, "destroyed while the device still ran");
        });
        assert!(dropped.load(Ordering::SeqCst));
        assert_eq!(calls(&path, "devcomm destroy v23203"), 1);
    }
}
