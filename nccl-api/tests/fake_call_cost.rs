//! unicomm's host cost per call over the same library call made through the function table,
//! with the caches cold as on a GPU host: there a call's 5-10 us inside NCCL and the driver
//! leave unicomm's code and data out of the first-level caches, so each step costs several
//! times what it costs in a tight loop (a profile on 1x H200, 2026-12: 0.28 us per call
//! against ~60 ns here without the thrash). Between calls this benchmark runs straight-line
//! code (evicting the instruction cache, as the driver's enqueue does) and writes data (`THRASH_CODE_KIB`, `THRASH_DATA_KIB`, 64 each by default; 0 for a tight
//! loop; `ROUNDS`, 41; `CALLS` per round, 5,000: a few hundred under callgrind). Timing benchmark, so opt-in:
//! `cargo test --release -p unicomm-nccl-api --test fake_call_cost -- --ignored --nocapture`
//!
//! On the 2-core VM the thrash's own time varies by more than unicomm's cost, so the
//! rounds are paired (each unicomm round against the table round just before it) and the
//! median pair reported; with the thrash the quartiles still span ~150 ns, so this finds
//! regressions, not 20 ns gains (those were measured by `perf` on the GPU host).
//!
//! The same rounds under callgrind's cache simulation count unicomm's own instructions and
//! first-level misses per call, with no timing noise (the thrash evicts as above):
//! `CALLS=300 ROUNDS=3 valgrind --tool=callgrind --cache-sim=yes --collect-atstart=no
//! '--toggle-collect=unicomm_core::comm::collectives::<impl unicomm_core::comm::Comm<C>>::all_reduce*'
//! <this test binary> --ignored`, then the inclusive counts of `Comm::all_reduce` less those
//! of the fake's `ncclAllReduce`, over the 900 calls (the timing assertion fails under
//! callgrind; the counts are written regardless).

mod common;

use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use common::{comm, fake, flavors, medians_ns};
use nix::sys::mman::{mmap_anonymous, mprotect, MapFlags, ProtFlags};
use unicomm_core::{DataType, DeviceSlice};
use unicomm_nccl_api::sys::codes::NcclCode;

/// Straight-line code of `bytes` bytes ending in `ret` (x86-64), to run between calls.
struct Thrash {
    code: extern "C" fn(),
    data: Vec<u8>,
}

impl Thrash {
    #[cfg(target_arch = "x86_64")]
    fn new(code_bytes: usize, data_bytes: usize) -> Thrash {
        let len = NonZeroUsize::new(code_bytes + 4096).unwrap();
        // SAFETY: a fresh private anonymous mapping, not aliased.
        let p = unsafe {
            mmap_anonymous(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }
        .unwrap();
        // SAFETY: the mapping is `len` bytes, writable, and nothing else refers to it.
        let b = unsafe { std::slice::from_raw_parts_mut(p.as_ptr() as *mut u8, len.get()) };
        // The 8-byte NOP (0f 1f 84 00 00 00 00 00) over the whole range, then `ret`.
        for c in b[..code_bytes].chunks_exact_mut(8) {
            c.copy_from_slice(&[0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0]);
        }
        b[code_bytes] = 0xc3;
        // SAFETY: the mapping made above, now read-only and executable.
        unsafe { mprotect(p, len.get(), ProtFlags::PROT_READ | ProtFlags::PROT_EXEC) }.unwrap();
        Thrash {
            // SAFETY: the mapping starts with NOPs and ends in `ret`: a function of no
            // arguments that touches nothing; it stays mapped (never unmapped).
            code: unsafe { std::mem::transmute::<*mut c_void, extern "C" fn()>(p.as_ptr()) },
            data: vec![0; data_bytes],
        }
    }

    fn run(&mut self) {
        (self.code)();
        for i in (0..self.data.len()).step_by(64) {
            self.data[i] = self.data[i].wrapping_add(1);
        }
        std::hint::black_box(&self.data);
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
#[ignore = "a timing benchmark; run it with --ignored"]
fn unicomm_over_the_table_with_cold_caches() {
    let path = fake("nccl228");
    let c = comm(flavors(false, false), &path);
    let st = c.create_stream().unwrap();
    let a = c.alloc::<f32>(64).unwrap();
    let mut b = c.alloc::<f32>(64).unwrap();
    let api = c.backend().api().clone();
    let raw = c.backend().raw_comm();
    let (sa, ra) = (a.view().device_ptr(), b.view().device_ptr());
    let mut th = Thrash::new(code_kib() << 10, data_kib() << 10);
    let n = std::env::var("CALLS").map_or(5_000u32, |v| v.parse().unwrap());
    let rounds = std::env::var("ROUNDS").map_or(41, |v| v.parse().unwrap());
    // Modes take turns: thrash alone, the table, unicomm.
    let mut t: [Vec<Duration>; 3] = Default::default();
    for _ in 0..rounds {
        let s = Instant::now();
        for _ in 0..n {
            th.run();
        }
        t[0].push(s.elapsed());
        let s = Instant::now();
        for _ in 0..n {
            // SAFETY: the fake's all_reduce on its own host "device" memory of 64 floats.
            let code = unsafe {
                (api.fns.all_reduce)(
                    sa as *const c_void,
                    ra as *mut c_void,
                    2,
                    DataType::F32.nccl(),
                    0, // ncclSum
                    raw,
                    std::ptr::null_mut(),
                )
            };
            api.check("ncclAllReduce", code, Some(raw)).unwrap();
            th.run();
        }
        t[1].push(s.elapsed());
        let s = Instant::now();
        for _ in 0..n {
            crate::sum_two!(c, a, b, &st).unwrap();
            th.run();
        }
        t[2].push(s.elapsed());
    }
    // Paired by round (adjacent in time, so the machine's slow phases cancel).
    let mut d: Vec<f64> = t[2]
        .iter()
        .zip(&t[1])
        .map(|(u, r)| (u.as_nanos() as f64 - r.as_nanos() as f64) / f64::from(n))
        .collect();
    d.sort_by(f64::total_cmp);
    let ns = medians_ns(&mut t, n);
    println!(
        "ns per call, median of {rounds} rounds of {n}: thrash {:.0}, table {:.0} (+{:.0}), unicomm {:.0} (+{:.0}): unicomm over the table {:.0} ns (paired by round: median {:.0}, quartiles {:.0}..{:.0})",
        ns[0],
        ns[1],
        ns[1] - ns[0],
        ns[2],
        ns[2] - ns[0],
        ns[2] - ns[1],
        d[d.len() / 2],
        d[d.len() / 4],
        d[3 * d.len() / 4]
    );
    // About 100 ns warm on the 2-core VM, noisier with the thrash; a lock, an allocation or
    // a system call per call would show as several times that.
    assert!(
        d[d.len() / 2] < 500.0,
        "unicomm costs {:.0} ns per call over the table",
        d[d.len() / 2]
    );
    std::mem::forget((a, b, st));
    std::mem::forget(c);
}

fn code_kib() -> usize {
    std::env::var("THRASH_CODE_KIB").map_or(64, |v| v.parse().unwrap())
}
fn data_kib() -> usize {
    std::env::var("THRASH_DATA_KIB").map_or(64, |v| v.parse().unwrap())
}
