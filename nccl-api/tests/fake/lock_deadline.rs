//! A call waiting for the communicator's lock while another thread's call holds it gives up
//! at twice the communicator's deadline with `Timeout` instead of waiting for ever (the
//! holder's library call made slow on purpose, as a call stuck in the driver would be); the
//! holder's call completes, and the communicator works after. In a process of its own (the
//! fake's delay is process-wide).

use std::time::{Duration, Instant};

use crate::common::{comm, fake, flavors};
use unicomm_core::Error;

fn delay_all_reduce(path: &std::path::Path, ms: u64) {
    // SAFETY: the fake, loaded by the test; unicommFakeDelayAllReduce takes one integer.
    unsafe {
        let lib = libloading::Library::new(path).unwrap();
        let f: libloading::Symbol<unsafe extern "C" fn(u64)> =
            lib.get(b"unicommFakeDelayAllReduce\0").unwrap();
        f(ms);
    }
}

isolated! {
    #[test]
    fn a_call_behind_a_stuck_holder_times_out_at_twice_the_deadline() {
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        c.set_timeout(Duration::from_millis(100)).unwrap();
        let st = c.create_stream().unwrap();
        let (a, mut b) = (c.alloc::<f32>(64).unwrap(), c.alloc::<f32>(64).unwrap());
        let (a2, mut b2) = (c.alloc::<f32>(64).unwrap(), c.alloc::<f32>(64).unwrap());
        delay_all_reduce(&path, 1500);
        std::thread::scope(|s| {
            let holder = s.spawn(|| {
                crate::sum_two!(c, a, b, &st)
            });
            // Let the holder take the lock and enter the slowed library call.
            std::thread::sleep(Duration::from_millis(200));
            let t = Instant::now();
            let e = crate::sum_two!(c, a2, b2, &st)
                .expect_err("a call behind a stuck holder");
            let waited = t.elapsed();
            assert!(
                matches!(&e, Error::Timeout { what, .. } if what.contains("lock")),
                "{e}"
            );
            assert!(waited >= Duration::from_millis(200), "{waited:?}");
            assert!(waited < Duration::from_millis(1200), "{waited:?}");
            holder.join().unwrap().unwrap();
        });
        delay_all_reduce(&path, 0);
        crate::sum_two!(c, a2, b2, &st)
        .unwrap();
    }
}
