//! Memory lent with its owner's stream (a cudarc slice, freed by cudarc in stream order on
//! its stream): a collective on another stream makes the owner's stream wait for it, so the
//! owner's free follows the collective even where the caller leaked what waited for it (a
//! forgotten `Completion`); on the owner's own stream nothing is added. In a process of its own
//! (the host runtime's count of stream waits is process-wide).

use crate::common;

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

use crate::common::{comm, fake, flavors, Host, EVENT_WAITS};
use unicomm_core::{LentMut, ReduceOp};
use unicomm_nccl_api::{ApiMemory, ApiStream, Runtime};

isolated! {
    #[test]
    fn a_collective_on_another_stream_orders_the_lenders_stream_after_it() {
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        let rt = Arc::new(Host);
        let mut host = vec![1.0f32; 64];
        let addr = host.as_mut_ptr() as usize;
        let lend = |home| {
            // SAFETY: `host` outlives every view made here; the fake's "device" is host memory.
            let mem = unsafe { ApiMemory::borrowed(rt.clone(), 0, addr, 256, None) }.unwrap();
            LentMut::<f32, _>::from_memory(mem.lent_on(home), 64).unwrap()
        };
        let other = c.create_stream().unwrap();
        let before = EVENT_WAITS.load(SeqCst);
        let mut lent = lend(rt.create_stream(0).unwrap());
        c.all_reduce_in_place(&mut lent, ReduceOp::Sum, &other)
            .unwrap();
        assert_eq!(
            EVENT_WAITS.load(SeqCst) - before,
            1,
            "the lender's stream was not ordered after the collective"
        );
        drop(lent);
        assert_eq!(host.len(), 64);
        // On the lender's own stream: its order already holds.
        let own = rt.create_stream(0).unwrap();
        let own_raw = Host::raw_stream(&own) as usize;
        let on_own = ApiStream::from_runtime(rt.clone(), own, 0).unwrap();
        // The same stream handle as the memory's home (the host runtime's handles are numbers).
        let mut lent = {
            // SAFETY: as above.
            let mem = unsafe { ApiMemory::borrowed(rt.clone(), 0, addr, 256, None) }.unwrap();
            let home = common::host_stream(own_raw);
            LentMut::<f32, _>::from_memory(mem.lent_on(home), 64).unwrap()
        };
        let before = EVENT_WAITS.load(SeqCst);
        c.all_reduce_in_place(&mut lent, ReduceOp::Sum, &on_own)
            .unwrap();
        assert_eq!(EVENT_WAITS.load(SeqCst), before, "a wait on its own stream");
    }
}
