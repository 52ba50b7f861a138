//! The flight recorder's host cost per recorded operation (the always-on part: a lock, a
//! clock read, a ring slot), with the ring off and on, alternated:
//! `cargo run --release -p unicomm-core --example flight_cost`.

use std::time::Instant;

use unicomm_core::flight::FlightRecorder;
use unicomm_core::{DataType, Kind, ReduceOp};

fn per_call_ns(cap: usize, n: u64) -> f64 {
    let f = FlightRecorder::new("world", 0, 1, cap, false, None);
    let what =
        unicomm_core::What::Collective(Kind::AllReduce { op: ReduceOp::Sum }, 2, DataType::F32);
    let t = Instant::now();
    for i in 0..n {
        std::hint::black_box(f.record(what, "library", std::hint::black_box(i), None));
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    let n = 5_000_000;
    per_call_ns(1024, n); // warm-up
    for round in 1..=3 {
        let (off, on) = (per_call_ns(0, n), per_call_ns(1024, n));
        println!(
            "round {round}: ring off {off:.1} ns per call, on (1024 entries) {on:.1} ns per call"
        );
    }
}
