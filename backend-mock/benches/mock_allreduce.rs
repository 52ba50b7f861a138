//! Speed of the mock: all_reduce of 64 MiB of f32 over 4 thread-ranks, against this
//! machine's single-thread memcpy bandwidth measured in the same run.
//!
//! `cargo bench -p backend-mock --bench mock_allreduce` (or `cargo xtask bench --vendor mock`).
//! The goal is a ratio of at least 0.25; the bench prints it and exits non-zero below it.
//! Both sides are the best of several timed rounds (this machine's memcpy alone varies by
//! half from run to run).

use std::time::Instant;

use unicomm_core::{DeviceStream, ReduceOp};

const BYTES: usize = 64 << 20;
const RANKS: usize = 4;
const ITERS: usize = 10;

const ROUNDS: usize = 3;

fn memcpy_gbps() -> f64 {
    let src = vec![1u8; BYTES];
    let mut dst = vec![0u8; BYTES];
    dst.copy_from_slice(&src); // touch the pages first
    let mut best = f64::MAX;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..ITERS {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        }
        best = best.min(t.elapsed().as_secs_f64() / ITERS as f64);
    }
    BYTES as f64 / best / 1e9
}

fn main() {
    let memcpy = memcpy_gbps();
    let comms = unicomm_mock::local_comms(RANKS).expect("mock world");
    let n = BYTES / 4;
    let times: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let st = c.create_stream().unwrap();
                    let mut send = c.alloc::<f32>(n).unwrap();
                    send.copy_from_host(&vec![c.rank() as f32; n], &st).unwrap();
                    let mut recv = c.alloc::<f32>(n).unwrap();
                    // warm-up: faults the pages in
                    c.all_reduce(&send, &mut recv, ReduceOp::Sum, &st).unwrap();
                    st.synchronize().unwrap();
                    let mut dt = f64::MAX;
                    for _ in 0..ROUNDS {
                        let t = Instant::now();
                        for _ in 0..ITERS {
                            c.all_reduce(&send, &mut recv, ReduceOp::Sum, &st).unwrap();
                        }
                        st.synchronize().unwrap();
                        dt = dt.min(t.elapsed().as_secs_f64() / ITERS as f64);
                    }
                    let out = recv.copy_to_host(&st).unwrap();
                    assert!(out.iter().all(|&x| x == 6.0), "wrong all_reduce result");
                    dt
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let t = times.iter().cloned().fold(0.0, f64::max);
    let algbw = BYTES as f64 / t / 1e9;
    let ratio = algbw / memcpy;
    println!(
        "machine: {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("single-thread memcpy, 64 MiB:        {memcpy:8.2} GB/s");
    println!(
        "mock all_reduce f32 64 MiB, {RANKS} ranks: {algbw:8.2} GB/s algbw ({:.2} ms)",
        t * 1e3
    );
    println!("ratio all_reduce / memcpy:            {ratio:8.2} (goal >= 0.25)");
    if ratio < 0.25 {
        eprintln!("below the goal");
        std::process::exit(1);
    }
}
