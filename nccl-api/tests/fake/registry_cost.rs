//! Host time of an automatically registered all_reduce against the fake library: with many
//! other registrations live (the registry's lookup must not grow with their number), and
//! against the same call on plain, registered and window buffers (auto's choice must cost
//! next to nothing: at host-bound sizes a call's time is the host's, and auto's target is
//! within 3% of the best fixed mode). Timing benchmarks, so opt-in: `cargo test --release -p
//! unicomm-nccl-api --test fake -- registry_cost --ignored --nocapture --test-threads=1`
//! (one at a time: the fake counts calls under one lock; CI runs the
//! registry's deterministic tests instead: `registry::tests`).

use std::time::{Duration, Instant};

use crate::common::{comm, fake, flavors, medians_ns};

/// The host time of `n` all_reduces of 2 floats from `a` into `b`.
macro_rules! per_call {
    ($c:expr, $st:expr, $a:expr, $b:expr, $n:expr) => {{
        let t = Instant::now();
        for _ in 0..$n {
            crate::sum_two!($c, $a, $b, $st).unwrap();
        }
        t.elapsed()
    }};
}

isolated! {
    #[test]
    #[ignore = "a timing benchmark; run it with --ignored"]
    fn auto_call_cost_does_not_grow_with_registrations() {
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        let st = c.create_stream().unwrap();
        let a = c.register_auto(c.alloc::<f32>(64).unwrap()).unwrap();
        let mut b = c.register_auto(c.alloc::<f32>(64).unwrap()).unwrap();
        let mut others = Vec::new();
        let mut cost = Vec::new();
        for k in [0usize, 100, 1000, 4000] {
            while others.len() < k {
                others.push(c.register(c.alloc::<f32>(64).unwrap()).unwrap());
            }
            let n = 100_000u32;
            let ns = per_call!(c, &st, a, b, n).as_nanos() as f64 / f64::from(n);
            println!("{k} other registrations: {ns:.0} ns per automatic all_reduce");
            cost.push(ns);
        }
        assert!(
            cost[3] < 2.5 * cost[0],
            "the call's cost grew with the registrations: {cost:?}"
        );
        // The fake's deregistration sleeps 20 ms on purpose (4,000 would take 80 s): the
        // process ends instead.
        std::mem::forget(others);
        std::mem::forget((a, b, st));
        std::mem::forget(c);
    }

    #[test]
    #[ignore = "a timing benchmark; run it with --ignored"]
    fn auto_call_costs_about_what_a_window_call_costs() {
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        let st = c.create_stream().unwrap();
        let (pa, mut pb) = (c.alloc::<f32>(64).unwrap(), c.alloc::<f32>(64).unwrap());
        let ra = c.register(c.alloc::<f32>(64).unwrap()).unwrap();
        let mut rb = c.register(c.alloc::<f32>(64).unwrap()).unwrap();
        let wa = c.register_window(c.alloc::<f32>(64).unwrap()).unwrap();
        let mut wb = c.register_window(c.alloc::<f32>(64).unwrap()).unwrap();
        let aa = c.register_auto(c.alloc::<f32>(64).unwrap()).unwrap();
        let mut ab = c.register_auto(c.alloc::<f32>(64).unwrap()).unwrap();
        // The modes take turns, 15 rounds of 20,000 calls each; the median round per mode.
        let n = 20_000u32;
        let mut t: [Vec<Duration>; 4] = Default::default();
        for _ in 0..15 {
            t[0].push(per_call!(c, &st, pa, pb, n));
            t[1].push(per_call!(c, &st, ra, rb, n));
            t[2].push(per_call!(c, &st, wa, wb, n));
            t[3].push(per_call!(c, &st, aa, ab, n));
        }
        let ns = medians_ns(&mut t, n);
        println!(
            "ns per all_reduce (the fake library's own cost included): plain {:.0}, registered {:.0}, window {:.0}, auto {:.0}",
            ns[0], ns[1], ns[2], ns[3]
        );
        // Before the registry remembered its answers and auto asked for both buffers under one
        // lock, an automatic call cost 1.17-1.19x a window call here (and every call paid the
        // lookups while any automatic registration was live: plain 410 ns against 250 now);
        // since, 1.01-1.04x. The fake's own work is most of a call.
        assert!(
            ns[3] < 1.10 * ns[2],
            "an automatic call costs {:.0} ns against a window call's {:.0}",
            ns[3],
            ns[2]
        );
        std::mem::forget((ra, rb, wa, wb, aa, ab, pa, pb, st));
        std::mem::forget(c);
    }
}
