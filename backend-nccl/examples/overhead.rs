//! unicomm's cost over NCCL: the same all_reduce and all_to_all through unicomm and through
//! the raw function table, same buffers, same stream, one thread per GPU, in one run.
//! Trials alternate between the two paths (and which goes first); reported per path: the
//! median over the trials of the time per call including completion, and of the host time
//! per call spent enqueuing (unicomm's own cost shows there); then the median of the paired
//! differences (each trial's unicomm run against the raw run beside it, which cancels the
//! host's drift between trials) with their first and third quartiles.
//!
//! `overhead [--max-bytes N] [--trials T] [--door backend]` on a GPU machine (the bundle's
//! run script calls it); sizes above N are left out (a quick A/B of the small-call cost); T
//! trials per path (default 9). `--door backend` calls the backend's `enqueue` with a
//! prebuilt operation instead of `Comm`'s typed collective (the typed layer's checks left
//! out): the two doors' figures apart say what each layer costs.

use std::ffi::c_void;
use std::sync::Barrier;
use std::time::Instant;

use unicomm_core::{Collective, Comm, DataType, Kind, Op, ReduceOp, Slice};
use unicomm_nccl::NcclComm;
use unicomm_nccl_api::sys::codes::NcclCode;

const TRIALS: usize = 9;

/// The word after `flag` on the command line.
fn value_of(flag: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != flag).nth(1)
}

/// The value after `flag` on the command line, parsed; `default` without it.
fn arg(flag: &str, default: usize) -> usize {
    match value_of(flag) {
        Some(v) => v.parse().unwrap_or_else(|_| {
            eprintln!("overhead: {flag} {v}: not a number");
            std::process::exit(2)
        }),
        None => default,
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Coll {
    AllReduce,
    AllToAll,
}

fn iters(bytes: usize) -> usize {
    match bytes {
        0..=65536 => 2000,
        65537..=4_194_304 => 200,
        _ => 20,
    }
}

fn main() {
    let comms: Vec<Comm<NcclComm>> = match unicomm_nccl::local_comms(None) {
        Ok(c) => c.into_iter().map(Comm::from_backend).collect(),
        Err(e) => {
            eprintln!("overhead: no GPU run possible: {e}");
            std::process::exit(2);
        }
    };
    let w = comms.len();
    let caps = comms[0].capabilities();
    println!(
        "# {} GPUs, NCCL {} at {}",
        w, caps.version, caps.library_path
    );
    let max = arg("--max-bytes", usize::MAX);
    let backend_door = value_of("--door").is_some_and(|d| d == "backend");
    if backend_door {
        println!("# unicomm through the backend's door (Collective::enqueue, a prebuilt Op)");
    }
    let trials = arg("--trials", TRIALS).max(1);
    println!(
        "# {:>10} {:>10} {:>12} {:>12} {:>9} {:>10} {:>14} {:>14} {:>12} {:>16}",
        "coll",
        "bytes",
        "unicomm_us",
        "raw_us",
        "delta",
        "delta_us",
        "uni_enqueue_us",
        "raw_enqueue_us",
        "paired_us",
        "paired_q1..q3"
    );
    let sizes: Vec<usize> = [8usize, 1 << 20, 16 << 20, 128 << 20, 512 << 20]
        .into_iter()
        .filter(|&b| b <= max)
        .collect();
    let barrier = Barrier::new(w);
    for coll in [Coll::AllReduce, Coll::AllToAll] {
        for &bytes in &sizes {
            let results: Vec<[f64; 7]> = std::thread::scope(|s| {
                let hs: Vec<_> = comms
                    .iter()
                    .map(|c| {
                        let barrier = &barrier;
                        s.spawn(move || run(c, coll, (bytes, trials, backend_door), barrier))
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            // The slowest rank bounds a collective.
            let worst = |i: usize| results.iter().map(|r| r[i]).fold(0.0, f64::max);
            let (uni, raw) = (worst(0), worst(1));
            let name = if coll == Coll::AllReduce {
                "all_reduce"
            } else {
                "all_to_all"
            };
            println!(
                "  {:>10} {:>10} {:>12.2} {:>12.2} {:>8.2}% {:>10.3} {:>14.3} {:>14.3} {:>12.3} {:>7.3}..{:.3}",
                name,
                bytes,
                uni,
                raw,
                (uni - raw) / raw * 100.0,
                uni - raw,
                worst(2),
                worst(3),
                worst(4),
                worst(5),
                worst(6)
            );
        }
    }
    pieces(comms[0].backend().device());
    for c in comms {
        let _ = c.finalize();
    }
}

/// Host nanoseconds of pieces every unicomm call has and a raw NCCL call does not: making
/// sure the rank's device is current (one `cuCtxGetCurrent` when it is) and the driver call
/// alone; the median of 9 runs of 1,000,000.
fn pieces(dev: usize) {
    use unicomm_nccl_api::Runtime as _;
    let rt = unicomm_nccl::cuda().unwrap();
    let n = 1_000_000u32;
    let time = |f: &dyn Fn()| {
        median(
            (0..TRIALS)
                .map(|_| {
                    let t = Instant::now();
                    for _ in 0..n {
                        f();
                    }
                    t.elapsed().as_nanos() as f64 / f64::from(n)
                })
                .collect(),
        )
    };
    let with_device = time(&|| {
        rt.with_device(dev, || Ok(())).unwrap();
    });
    let get_current = time(&|| {
        std::hint::black_box(cudarc::driver::result::ctx::get_current().unwrap());
    });
    let monotonic = time(&|| {
        std::hint::black_box(Instant::now());
    });
    let wall = time(&|| {
        std::hint::black_box(std::time::SystemTime::now());
    });
    println!("# host ns per call: with_device (device already current) {with_device:.1}, cuCtxGetCurrent {get_current:.1}, Instant::now {monotonic:.1}, SystemTime::now {wall:.1}");
}

/// The first `bytes` of `b`'s memory, as a backend operation sees them.
fn whole<C: Collective>(b: &unicomm_core::Buffer<f32, C>, bytes: usize) -> Slice<'_, C::Memory> {
    Slice {
        mem: b.memory(),
        offset: 0,
        bytes,
    }
}

fn median(v: Vec<f64>) -> f64 {
    quantile(v, 0.5)
}

/// The value at fraction `q` of the sorted values (nearest rank).
fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Per-op microseconds through unicomm and through the raw table, then the host time per
/// call spent enqueuing on each path, then the paired differences' median and quartiles.
fn run(
    c: &Comm<NcclComm>,
    coll: Coll,
    (bytes, trials, backend_door): (usize, usize, bool),
    barrier: &Barrier,
) -> [f64; 7] {
    let w = c.world_size();
    let count = (bytes / 4).max(1);
    let count = if coll == Coll::AllToAll {
        count.div_ceil(w) * w
    } else {
        count
    };
    let st = c.create_stream().unwrap();
    let send = c.alloc::<f32>(count).unwrap();
    let mut recv = c.alloc::<f32>(count).unwrap();
    let api = c.backend().api().clone();
    let raw_comm = c.backend().raw_comm();
    let raw_stream = st.inner().0.cu_stream() as *mut c_void;
    let (sp, rp) = (
        send.device_ptr() as *const c_void,
        recv.device_ptr() as *mut c_void,
    );
    let n = iters(bytes);
    let (kind, per) = match coll {
        Coll::AllReduce => (Kind::AllReduce { op: ReduceOp::Sum }, count),
        Coll::AllToAll => (Kind::AllToAll, count / w),
    };
    let mut uni_path = |k: usize| {
        let t = Instant::now();
        for _ in 0..k {
            if backend_door {
                let (sb, rb) = (whole(&send, count * 4), whole(&recv, count * 4));
                let op = Op::new(kind, sb, rb, per, DataType::F32);
                c.backend()
                    .enqueue(unicomm_core::Work::Collective(&op), &st)
                    .unwrap();
                continue;
            }
            match coll {
                Coll::AllReduce => c.all_reduce(&send, &mut recv, ReduceOp::Sum, &st).unwrap(),
                Coll::AllToAll => c.all_to_all(&send, &mut recv, &st).unwrap(),
            }
        }
        let enq = t.elapsed();
        st.synchronize().unwrap();
        enq
    };
    // The raw path runs with this rank's context current, as unicomm leaves it.
    let _ = unicomm_nccl::cuda()
        .unwrap()
        .context(c.backend().device())
        .unwrap()
        .bind_to_thread();
    let raw_path = |k: usize| {
        let t = Instant::now();
        for _ in 0..k {
            // SAFETY: the same live communicator, buffers and stream unicomm uses; this
            // thread is the only one using the communicator.
            let r = unsafe {
                match coll {
                    Coll::AllReduce => (api.fns.all_reduce)(
                        sp,
                        rp,
                        count,
                        DataType::F32.nccl(),
                        0, // ncclSum
                        raw_comm,
                        raw_stream,
                    ),
                    Coll::AllToAll => (api.all_to_all.expect("native all-to-all"))(
                        sp,
                        rp,
                        count / w,
                        DataType::F32.nccl(),
                        raw_comm,
                        raw_stream,
                    ),
                }
            };
            // A non-blocking communicator (unicomm's default where NCCL has them) answers
            // ncclInProgress; a raw user must poll it done before the next call.
            if r == 7 {
                let get = api.fns.comm_get_async_error.expect("ncclCommGetAsyncError");
                let mut s = 7;
                while s == 7 {
                    // SAFETY: the live communicator; one int out.
                    assert_eq!(unsafe { get(raw_comm, &mut s) }, 0);
                }
                assert_eq!(s, 0);
            } else {
                assert_eq!(r, 0);
            }
        }
        let enq = t.elapsed();
        st.synchronize().unwrap();
        enq
    };
    uni_path(20);
    raw_path(20);
    let (mut u, mut r, mut ue, mut re) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6 / n as f64;
    for trial in 0..trials {
        for first_uni in [trial % 2 == 0, trial % 2 == 1] {
            barrier.wait();
            let t = Instant::now();
            if first_uni {
                ue.push(us(uni_path(n)));
                u.push(us(t.elapsed()));
            } else {
                re.push(us(raw_path(n)));
                r.push(us(t.elapsed()));
            }
        }
    }
    let paired: Vec<f64> = u.iter().zip(&r).map(|(a, b)| a - b).collect();
    [
        median(u),
        median(r),
        median(ue),
        median(re),
        quantile(paired.clone(), 0.5),
        quantile(paired.clone(), 0.25),
        quantile(paired, 0.75),
    ]
}
