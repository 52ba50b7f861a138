//! Host time of an automatically registered all_reduce against the fake library with many
//! other registrations live: the registry's lookup must not grow with their number. A
//! timing benchmark, so opt-in: `cargo test --release -p unicomm-nccl-api --test
//! fake_registry_cost -- --ignored --nocapture` (CI runs the registry's deterministic tests
//! instead: `registry::tests`).

mod common;

use std::time::Instant;

use common::{comm, fake, flavors};
use unicomm_core::ReduceOp;

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
        let n = 100_000;
        let t = Instant::now();
        for _ in 0..n {
            c.all_reduce(
                &a.slice(..2).unwrap(),
                &mut b.slice_mut(..2).unwrap(),
                ReduceOp::Sum,
                &st,
            )
            .unwrap();
        }
        let ns = t.elapsed().as_nanos() as f64 / n as f64;
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
