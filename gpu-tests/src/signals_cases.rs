//! The signals' cost on one GPU, their replay in a CUDA graph, and the protocol between two
//! processes on one GPU.

#![allow(
    unsafe_code,
    reason = "the copy-engine path's building blocks driven directly on a GPU"
)]

use std::time::Duration;

use unicomm_core::Result;

use super::signals::*;
use super::Gpu;
use unicomm_nccl_api::testing::{block_bytes, block_image, release, Phase, Signals};
use unicomm_nccl_api::Runtime;

/// What the signals cost per operation, measured where one GPU is all there is: two streams
/// as two ranks run `LAT_ITERS` operations of 4 bytes per peer (ready phase, the copy, done
/// phase), timed with device events around the whole run, against the same copies without
/// the phases. Prints the two and their difference (the signals' cost per operation on this
/// GPU's front end and copy engines; between two GPUs the signal copies also cross NVLink);
/// asserts only that every operation completed and the last one's data landed.
pub fn signals_latency_on_one_gpu<R: Runtime>(g: &Gpu<R>) -> Result<()> {
    const LAT_ITERS: usize = 500;
    let rt = (g.vendor.runtime)()?;
    let (mut mem, setup, bases) = blocks(&*rt)?;
    let (send, recv) = latency_buffers(&*rt, &mut mem, &setup)?;
    // Signalled both ways: by 4-byte copies of the constant, and by stream writes.
    let sig = |by_write: bool| -> Vec<Signals<R>> {
        (0..W)
            .map(|_| Signals {
                block: None,
                bases: bases.clone(),
                mapped: Vec::new(),
                by_write,
            })
            .collect()
    };
    let (copies, writes) = (sig(false), sig(true));
    let streams = [rt.create_stream(0)?, rt.create_stream(0)?];
    // One run: both ranks' operations enqueued interleaved (a rank's stream never waits on
    // work its peer has not enqueued yet, however deep the queues).
    let run = |phases: Option<&[Signals<R>]>| -> Result<f64> {
        let start: Vec<R::Event> = streams
            .iter()
            .map(|s| rt.record(s))
            .collect::<Result<_>>()?;
        for _ in 0..LAT_ITERS {
            for r in 0..W {
                let s = &streams[r];
                if let Some(sig) = phases {
                    sig[r].phase(&*rt, 0, r, Phase::Ready, s)?;
                }
                for (p, &out) in recv.iter().enumerate() {
                    // SAFETY: word p of rank r's send buffer into word r of rank p's
                    // output, both live device memory of device 0 until the end.
                    unsafe { rt.copy_async(0, out + 4 * r, send[r] + 4 * p, 4, s)? };
                }
                if let Some(sig) = phases {
                    sig[r].phase(&*rt, 0, r, Phase::Done, s)?;
                }
            }
        }
        let end: Vec<R::Event> = streams
            .iter()
            .map(|s| rt.record(s))
            .collect::<Result<_>>()?;
        for s in &streams {
            idle(&*rt, s, Duration::from_secs(20))?;
        }
        let mut worst = 0f64;
        for r in 0..W {
            worst = worst.max(rt.elapsed_ms(&start[r], &end[r])?);
        }
        Ok(worst * 1e3 / LAT_ITERS as f64)
    };
    run(Some(&copies))?; // warm-up
    run(Some(&writes))?;
    let by_copy = run(Some(&copies))?;
    let by_write = run(Some(&writes))?;
    let without = run(None)?;
    for (r, &out) in recv.iter().enumerate() {
        // SAFETY: `out` holds `4 * W` bytes.
        let got = unsafe { words(&*rt, out, W, &setup)? };
        for (p, &got) in got.iter().enumerate() {
            assert_eq!(got, (p * 10 + r) as u32, "rank {r}'s word from rank {p}");
        }
    }
    eprintln!(
        "signals_latency_on_one_gpu: per operation ({LAT_ITERS} operations, two streams on device 0): {without:.2} us for the copies alone; with the signals by 4-byte copies {by_copy:.2} us (+{:.2}), by stream writes {by_write:.2} us (+{:.2}); this runtime signals by {}",
        by_copy - without,
        by_write - without,
        if rt.signal_by_write(0) { "writes" } else { "copies" }
    );
    Ok(())
}

/// Each rank's send buffer (word `p` of rank `r`: `r * 10 + p`) and output buffer, `W`
/// words each, on device 0.
fn latency_buffers<R: Runtime>(
    rt: &R,
    mem: &mut Mem<'_, R>,
    setup: &R::Stream,
) -> Result<(Vec<usize>, Vec<usize>)> {
    let (mut send, mut recv) = (Vec::new(), Vec::new());
    for r in 0..W {
        let sb = mem.alloc(4 * W)?;
        let words: Vec<u8> = (0..W)
            .flat_map(|p| ((r * 10 + p) as u32).to_ne_bytes())
            .collect();
        // SAFETY: `sb` holds `4 * W` bytes.
        unsafe { rt.htod(0, sb, &words, setup)? };
        send.push(sb);
        recv.push(mem.alloc(4 * W)?);
    }
    Ok((send, recv))
}

/// What a vendor's graph capture gives the harness: `capture(origin, body)` captures what
/// `body` enqueues (on `origin` and on streams forked from it) into a graph and returns a
/// function that launches it on `origin`.
pub type Capture<'a, R> = &'a dyn Fn(
    &<R as Runtime>::Stream,
    &mut dyn FnMut() -> Result<()>,
) -> Result<Box<dyn FnMut() -> Result<()> + 'a>>;

/// The same two ranks' iterations captured into one graph (both streams forked from an
/// origin stream and joined back by events) and the graph launched three times, the outputs
/// cleared between launches: each replay must move every chunk again, which works only if
/// the graph re-arms its own flags (one value, 1, for every operation: nothing of the
/// host's is baked into the graph).
pub fn signals_replay_in_a_graph<R: Runtime>(g: &Gpu<R>, capture: Capture<'_, R>) -> Result<()> {
    let rt = (g.vendor.runtime)()?;
    let w = World::new(&*rt)?;
    let origin = rt.create_stream(0)?;
    let mut launch = capture(&origin, &mut || {
        let fork = rt.record(&origin)?;
        for s in &w.streams {
            rt.wait_event(0, s, &fork)?;
        }
        w.enqueue()?;
        for s in &w.streams {
            let join = rt.record(s)?;
            rt.wait_event(0, &origin, &join)?;
        }
        Ok(())
    })?;
    for replay in 0..3 {
        w.clear()?;
        launch()?;
        idle(&*rt, &origin, Duration::from_secs(10))?;
        w.check(&format!("graph replay {replay}"))?;
    }
    Ok(())
}

/// The protocol between two processes on one GPU (`Pair`), as one rank per process
/// runs it: each process is a rank whose output and signal block live in one allocation from
/// the library's allocator, exported and mapped by the other (the window and block exchange
/// of the path), so every signal and data copy into the peer goes through memory imported
/// from another process. Rank 1's stream is first held by a gate word of its own until rank
/// 0 opens it with a stream write through its mapping; rank 0's stream must wait on the
/// device meanwhile. Then each rank runs `ITERS` all-to-alls signalled by stream writes into
/// the peer's flags (where the runtime signals by writes) and `ITERS` by 4-byte copies:
/// every iteration's snapshot holds both ranks' chunks, and the flags end re-armed.
#[cfg(target_os = "linux")]
pub fn signals_across_processes<R: Runtime>(g: &Gpu<R>, test: &str) -> Result<()> {
    use unicomm_core::backend::DeviceMemory;
    let pair = super::ipc::Pair::start(test)?;
    let me = pair.me;
    let cs = g.comms(1)?;
    let c = &cs[0];
    let (rt, dev) = (c.backend().runtime().clone(), c.backend().device());
    need_memory_ops(&*rt, dev)?;
    let modes: &[bool] = if rt.signal_by_write(dev) {
        &[true, false]
    } else {
        &[false]
    };
    // The shared allocation: the output's W chunks, the signal block, the gate word.
    let block_off = W * CHUNK;
    let gate_off = block_off + block_bytes(W);
    let st = c.create_stream()?;
    let (region, send, snap) = prepare(c, &st, me, modes.len() * ITERS, gate_off)?;
    let own = region.memory().address();
    let (va, off, size) = pair.swap(&*rt, dev, own, gate_off + 4)?;
    let peer = va + off;
    let out = |r: usize| if r == me { own } else { peer };
    let bases: Vec<usize> = (0..W).map(|r| out(r) + block_off).collect();
    let work = c.create_stream()?;
    let s = work.inner();
    if me == 1 {
        // SAFETY: the gate word of this process's region, alive until the end.
        unsafe { rt.wait_value32(dev, own + gate_off, 1, s) }?;
    }
    let bufs = (&send[..], &snap[..]);
    exchange(&*rt, (dev, me), modes, &bases, (own, peer), bufs, s)?;
    let mut held = true;
    let opener = c.create_stream()?;
    if me == 0 {
        std::thread::sleep(Duration::from_millis(300));
        held = !rt.query(s)?;
        // SAFETY: the gate word of the peer's region, through the mapping, alive until it is
        // unmapped after this stream is idle.
        unsafe { rt.write_value32(dev, peer + gate_off, 1, opener.inner()) }?;
    }
    let done = idle(&*rt, s, Duration::from_secs(20))
        .and_then(|()| idle(&*rt, opener.inner(), Duration::from_secs(5)));
    if let Err(e) = done {
        // Release this rank's waits as an abort does, so nothing is freed under a waiting
        // stream; what does not drain is leaked.
        // SAFETY: this rank's block and gate, alive here.
        let drained = unsafe {
            rt.write_value32(dev, own + gate_off, 1, opener.inner())?;
            release(&*rt, dev, bases[me], W, me, Duration::from_secs(10), || {
                rt.query(s)
            })?
        };
        if !drained {
            std::mem::forget((region, send, snap));
        }
        return Err(e);
    }
    assert!(
        held,
        "rank 0's stream did not wait for rank 1's ready signal"
    );
    check_exchange(me, modes, &snap, &region, &st)?;
    // SAFETY: the mapping made by the swap; every stream that used it is idle.
    unsafe { rt.unmap_imported(dev, va, size) }?;
    eprintln!(
        "signals_across_processes: rank {me}: {} all-to-alls of {} MiB per peer through the peer's imported memory, signalled by {}",
        modes.len() * ITERS,
        CHUNK >> 20,
        if modes.len() == 2 { "writes, then copies" } else { "copies" }
    );
    pair.finish()
}

/// A `u32` buffer of the GPU backend.
type Buf<R> = unicomm_core::Buffer<u32, unicomm_nccl_api::ApiComm<R>>;

/// Set-up: the shared region (the output's chunks zeroed, the signal block's image, the
/// gate word closed), and per iteration a send buffer of its values and a snapshot.
#[allow(
    clippy::type_complexity,
    reason = "the region, the sends, the snapshots"
)]
fn prepare<R: Runtime>(
    c: &unicomm_core::Comm<unicomm_nccl_api::ApiComm<R>>,
    st: &unicomm_nccl_api::ApiStream<R>,
    me: usize,
    iters: usize,
    gate_off: usize,
) -> Result<(Buf<R>, Vec<Buf<R>>, Vec<Buf<R>>)> {
    let mut region = c.alloc::<u32>((gate_off + 4) / 4)?;
    let mut image = vec![0u32; W * N];
    image.extend(decode(&block_image(W)));
    image.push(0);
    region.copy_from_host(&image, st)?;
    let (mut send, mut snap) = (Vec::new(), Vec::new());
    for k in 0..iters {
        let mut b = c.alloc::<u32>(W * N)?;
        let values: Vec<u32> = (0..W * N).map(|j| value(k, me, j / N, j % N)).collect();
        b.copy_from_host(&values, st)?;
        send.push(b);
        snap.push(c.alloc::<u32>(W * N)?);
    }
    st.synchronize()?;
    Ok((region, send, snap))
}

/// The run: per signalling mode, `ITERS` all-to-alls of `CHUNK` bytes per peer between the
/// ready and done phases, each rank's output copied to that iteration's snapshot.
fn exchange<R: Runtime>(
    rt: &R,
    (dev, me): (usize, usize),
    modes: &[bool],
    bases: &[usize],
    (own, peer): (usize, usize),
    (send, snap): (&[Buf<R>], &[Buf<R>]),
    s: &R::Stream,
) -> Result<()> {
    use unicomm_core::backend::DeviceMemory;
    let out = |r: usize| if r == me { own } else { peer };
    for (m, &by_write) in modes.iter().enumerate() {
        let sig = Signals {
            block: None,
            bases: bases.to_vec(),
            mapped: Vec::new(),
            by_write,
        };
        for it in 0..ITERS {
            let k = m * ITERS + it;
            sig.phase(rt, dev, me, Phase::Ready, s)?;
            for q in 0..W {
                let p = (me + q) % W;
                let (dst, src) = (out(p) + me * CHUNK, send[k].memory().address() + p * CHUNK);
                // SAFETY: chunk p of this rank's send buffer into chunk `me` of rank p's
                // output (this process's region or the mapping of the peer's), both alive
                // until this stream is idle (the caller waits).
                unsafe { rt.copy_async(dev, dst, src, CHUNK, s) }?;
            }
            sig.phase(rt, dev, me, Phase::Done, s)?;
            // SAFETY: this rank's output into its snapshot of iteration k.
            unsafe { rt.copy_async(dev, snap[k].memory().address(), own, W * CHUNK, s) }?;
        }
    }
    Ok(())
}

/// The check: every iteration's snapshot holds each peer's chunk, and the flags are re-armed
/// with the constant intact (and the gate opened on rank 1).
fn check_exchange<R: Runtime>(
    me: usize,
    modes: &[bool],
    snap: &[Buf<R>],
    region: &Buf<R>,
    st: &unicomm_nccl_api::ApiStream<R>,
) -> Result<()> {
    for (k, shot) in snap.iter().enumerate() {
        let got = shot.copy_to_host(st)?;
        if let Some(j) = (0..W * N).find(|&j| got[j] != value(k, j / N, me, j % N)) {
            panic!(
                "rank {me}, iteration {k} (signals by {}): chunk {} element {} is {}, not rank {}'s {}",
                if modes[k / ITERS] { "writes" } else { "copies" },
                j / N,
                j % N,
                got[j],
                j / N,
                value(k, j / N, me, j % N)
            );
        }
    }
    let flags = &region.copy_to_host(st)?[W * N..];
    let mut want = vec![0u32; 2 * W];
    want.extend([1, u32::from(me == 1)]);
    assert_eq!(
        flags, want,
        "rank {me}: flags re-armed, the constant intact (and the gate opened)"
    );
    Ok(())
}
