//! One-sided operations on the mock with NCCL 2.29.2's rules (`ncclPutSignal`, `ncclSignal`,
//! `ncclWaitSignal`): the conformance case around rings of threads; a put's bytes land when
//! the peer's wait takes them, not before; a put larger than a message's part arrives
//! whole; called directly inside a capture they are refused; a peer that never signals ends the wait at the
//! deadline naming it; misuse is refused before anything is enqueued; a target before
//! 2.29.2 refuses naming it.

use std::time::{Duration, Instant};

use unicomm_core::{Comm, DeviceStream, Error, SignalWait};
use unicomm_mock::{local_comms_with, MockComm, MockConfig};

fn comms(world: usize, target: &str) -> Vec<Comm<MockComm>> {
    let config = MockConfig::standing_for(target).unwrap();
    local_comms_with(world, config.within(Duration::from_secs(5))).unwrap()
}

#[test]
fn the_suites_ring_moves_each_block_exactly_from_2_29_2_on() {
    for w in [1, 2, 3, 5] {
        let seen = unicomm_conformance::one_sided_put_signal(&comms(w, "nccl-2.32.3")).unwrap();
        assert!(seen.iter().all(|&s| s), "world {w}: {seen:?}");
        let seen = unicomm_conformance::one_sided_put_signal(&comms(w, "nccl-2.29.2")).unwrap();
        assert!(seen.iter().all(|&s| s), "world {w}: {seen:?}");
    }
}

#[test]
fn before_2_29_2_every_call_is_unsupported_naming_it() {
    let seen = unicomm_conformance::one_sided_put_signal(&comms(2, "nccl-2.28.9")).unwrap();
    assert_eq!(seen, vec![false, false]);
    let c = &comms(1, "nccl-2.28.9")[0];
    let st = c.create_stream().unwrap();
    for r in [
        c.signal(0, &st),
        c.wait_signal(&[SignalWait::new(0, 1)], &st),
    ] {
        match r {
            Err(Error::Unsupported { needs, .. }) => assert!(needs.contains("2.29.2"), "{needs}"),
            other => panic!("{other:?}"),
        }
    }
}

/// Rank 0 puts `data` into rank 1's window and signals; rank 1 reads its window before
/// its wait, then after it: the old bytes, then the new.
#[test]
fn a_puts_bytes_land_when_the_peers_wait_takes_them_even_past_a_messages_part() {
    // 5 MiB + 3 elements of u32: two parts of a message and a short third.
    let n = (5 << 20) / 4 + 3;
    let cs = comms(2, "nccl-2.32.3");
    std::thread::scope(|s| {
        for c in &cs {
            s.spawn(move || {
                let st = c.create_stream().unwrap();
                let r = c.rank() as u32;
                let data: Vec<u32> = (0..n as u32).map(|k| k ^ (r << 30)).collect();
                let win = c.register_window(c.upload(&data, &st).unwrap()).unwrap();
                if r == 0 {
                    c.put_signal(&win, 1, &win, 0, &st).unwrap();
                } else {
                    // The put may already have run: the bytes are not there before the wait.
                    std::thread::sleep(Duration::from_millis(100));
                    assert_eq!(win.copy_to_host(&st).unwrap(), data, "before the wait");
                    c.wait_signal(&[SignalWait::new(0, 1)], &st).unwrap();
                    let got = win.copy_to_host(&st).unwrap();
                    let want: Vec<u32> = (0..n as u32).collect();
                    assert!(got == want, "after the wait: rank 0's bytes");
                }
                c.barrier(&st).unwrap();
                st.synchronize().unwrap();
            });
        }
    });
}

#[test]
fn a_wait_whose_peer_never_signals_ends_at_the_deadline_naming_it() {
    let cs = comms(2, "nccl-2.32.3");
    let c = &cs[1];
    let st = c.create_stream().unwrap();
    let t = Instant::now();
    c.wait_signal(&[SignalWait::new(0, 1)], &st).unwrap();
    match st.synchronize() {
        Err(Error::Timeout { what, .. }) => {
            assert!(what.contains("never signalled"), "{what}");
        }
        other => panic!("{other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
}

/// Called directly inside a capture's closure (not through its step, which borrows the
/// window and the source for the graph's life): refused naming the step, as every direct
/// call there.
#[test]
fn inside_a_capture_they_are_refused_naming_the_step() {
    let cs = comms(1, "nccl-2.32.3");
    let c = &cs[0];
    let st = c.create_stream().unwrap();
    let win = c
        .register_window(c.upload(&[0u32; 8], &st).unwrap())
        .unwrap();
    let r = unicomm_core::graph::Graph::<MockComm>::capture(&st, |_step| {
        c.signal(0, &st)?;
        c.put_signal(&win, 0, &win, 0, &st)
    });
    match r.map(drop) {
        Err(Error::InvalidArgument { reason, .. }) => assert!(reason.contains("Step"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn misuse_is_refused_before_anything_is_enqueued() {
    let cs = comms(2, "nccl-2.32.3");
    let other = comms(2, "nccl-2.32.3");
    let c = &cs[0];
    let st = c.create_stream().unwrap();
    let invalid = |r: unicomm_core::Result<()>, arg: &str| match r {
        Err(Error::InvalidArgument { argument, .. }) => assert_eq!(argument, arg),
        other => panic!("{arg}: {other:?}"),
    };
    std::thread::scope(|s| {
        // Windows are collective: the peer registers its own while this rank registers.
        let peer = s.spawn(|| {
            let st = cs[1].create_stream().unwrap();
            let w = cs[1].register_window(cs[1].upload(&[0u32; 8], &st).unwrap());
            let ost = other[1].create_stream().unwrap();
            let o = other[1].register_window(other[1].upload(&[0u32; 8], &ost).unwrap());
            (w.map(drop), o.map(drop))
        });
        let win = c
            .register_window(c.upload(&[0u32; 8], &st).unwrap())
            .unwrap();
        let ost = other[0].create_stream().unwrap();
        let foreign = other[0]
            .register_window(other[0].upload(&[0u32; 8], &ost).unwrap())
            .unwrap();
        let plain = c.upload(&[0u32; 4], &st).unwrap();
        invalid(c.put_signal(&plain, 1, &win, 0, &st), "src");
        invalid(c.put_signal(&win, 2, &win, 0, &st), "peer");
        invalid(
            c.put_signal(&win.slice(..4).unwrap(), 1, &win, 5, &st),
            "offset",
        );
        invalid(c.put_signal(&win, 1, &foreign, 0, &st), "dst");
        invalid(c.signal(2, &st), "peer");
        invalid(c.wait_signal(&[], &st), "waits");
        invalid(c.wait_signal(&[SignalWait::new(1, 0)], &st), "waits");
        invalid(c.wait_signal(&[SignalWait::new(5, 1)], &st), "waits");
        st.synchronize().unwrap();
        drop((win, foreign));
        let _ = peer.join().unwrap();
    });
}
