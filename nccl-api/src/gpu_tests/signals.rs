//! The copy-engine path's signals on a real GPU with two streams standing in for two ranks'
//! streams: the protocol of `signals.rs` (the code the path runs, `Signals::phase`), where a
//! machine has one GPU as much as where it has two.

use std::time::{Duration, Instant};

use unicomm_core::{Error, Result};

use super::Gpu;
use crate::copy_engine::signals::{block_bytes, block_image, release, Phase, Signals};
use crate::Runtime;

/// Device memory of this test, freed at the end (after the streams are idle).
struct Mem<'a, R: Runtime> {
    rt: &'a R,
    ptrs: Vec<usize>,
}

impl<R: Runtime> Mem<'_, R> {
    fn alloc(&mut self, bytes: usize) -> Result<usize> {
        let p = self.rt.malloc(0, bytes)?;
        self.ptrs.push(p);
        Ok(p)
    }
}

impl<R: Runtime> Drop for Mem<'_, R> {
    fn drop(&mut self) {
        for &p in &self.ptrs {
            // SAFETY: each pointer came from `malloc` on device 0, freed once; the test
            // waited for its streams before returning (or leaks by failing before).
            let _ = unsafe { self.rt.free(0, p) };
        }
    }
}

/// What every signal test starts from: the runtime has stream memory operations, and `W`
/// signal blocks on device 0 (zeroed, the constant 1 in place), with the memory they live in
/// and a stream for setting up and reading back.
fn blocks<R: Runtime>(rt: &R) -> Result<(Mem<'_, R>, R::Stream, Vec<usize>)> {
    need_memory_ops(rt, 0)?;
    let mut mem = Mem {
        rt,
        ptrs: Vec::new(),
    };
    let setup = rt.create_stream(0)?;
    let init = block_image(W);
    let mut bases = Vec::new();
    for _ in 0..W {
        let b = mem.alloc(init.len())?;
        // SAFETY: `b` holds `init.len()` device bytes.
        unsafe { rt.htod(0, b, &init, &setup)? };
        bases.push(b);
    }
    Ok((mem, setup, bases))
}

/// Every signal test needs the runtime's stream memory operations on `dev`.
fn need_memory_ops<R: Runtime>(rt: &R, dev: usize) -> Result<()> {
    if rt.stream_memory_ops(dev) {
        return Ok(());
    }
    Err(Error::unsupported(
        "the copy-engine signals",
        "stream memory operations",
        format!("{} on device {dev}", R::NAME),
    ))
}

/// Bytes as native-endian 4-byte words.
fn decode(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
        .collect()
}

/// `n` 4-byte words of device 0 at `addr`, read back through `s`.
///
/// # Safety
/// `addr` holds `4 * n` bytes of live device memory of device 0.
unsafe fn words<R: Runtime>(rt: &R, addr: usize, n: usize, s: &R::Stream) -> Result<Vec<u32>> {
    let mut host = vec![0u8; 4 * n];
    // SAFETY: as the caller promised.
    unsafe { rt.dtoh(0, &mut host, addr, s)? };
    Ok(decode(&host))
}

fn idle<R: Runtime>(rt: &R, s: &R::Stream, within: Duration) -> Result<()> {
    let end = Instant::now() + within;
    while !rt.query(s)? {
        if Instant::now() > end {
            return Err(Error::Timeout {
                what: "a stream of the signal test".into(),
                after: within,
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

const W: usize = 2;
const ITERS: usize = 2;
/// u32 per chunk: 4 MiB.
const N: usize = 1 << 20;
const CHUNK: usize = 4 * N;

/// What iteration `it` of rank `r` sends to rank `p` at element `i`.
fn value(it: usize, r: usize, p: usize, i: usize) -> u32 {
    (it * 100 + r * 10 + p) as u32 * 1_000_000 + i as u32
}

/// Two "ranks" on device 0: their signal blocks, buffers and streams.
struct World<'a, R: Runtime> {
    rt: &'a R,
    mem: Mem<'a, R>,
    setup: R::Stream,
    bases: Vec<usize>,
    /// send[it][r] (chunk p = `value(it, r, p, ..)`), recv[r], snap[it][r].
    send: Vec<Vec<usize>>,
    recv: [usize; W],
    snap: Vec<Vec<usize>>,
    streams: [R::Stream; W],
    sig: Vec<Signals<R>>,
}

impl<'a, R: Runtime> World<'a, R> {
    fn new(rt: &'a R) -> Result<Self> {
        let (mut mem, setup, bases) = blocks(rt)?;
        let mut send = vec![vec![0usize; W]; ITERS];
        let mut snap = vec![vec![0usize; W]; ITERS];
        for it in 0..ITERS {
            for r in 0..W {
                let s = mem.alloc(W * CHUNK)?;
                let host: Vec<u8> = (0..W * N)
                    .flat_map(|j| value(it, r, j / N, j % N).to_ne_bytes())
                    .collect();
                // SAFETY: `s` holds `W * CHUNK` bytes.
                unsafe { rt.htod(0, s, &host, &setup)? };
                send[it][r] = s;
                snap[it][r] = mem.alloc(W * CHUNK)?;
            }
        }
        let recv = [mem.alloc(W * CHUNK)?, mem.alloc(W * CHUNK)?];
        let streams = [rt.create_stream(0)?, rt.create_stream(0)?];
        let sig = (0..W)
            .map(|_| Signals {
                block: None,
                bases: bases.clone(),
                mapped: Vec::new(),
                by_write: rt.signal_by_write(0),
            })
            .collect();
        Ok(World {
            rt,
            mem,
            setup,
            bases,
            send,
            recv,
            snap,
            streams,
            sig,
        })
    }

    /// Every iteration of both ranks, as the copy-engine path enqueues an all-to-all: the
    /// ready phase, the copies, the done phase; then the rank's snapshot of its output.
    fn enqueue(&self) -> Result<()> {
        for it in 0..ITERS {
            for r in 0..W {
                self.enqueue_one(it, r)?;
            }
        }
        Ok(())
    }

    /// Iteration `it` of rank `r` alone, on its stream.
    fn enqueue_one(&self, it: usize, r: usize) -> Result<()> {
        let rt = self.rt;
        let s = &self.streams[r];
        self.sig[r].phase(rt, 0, r, Phase::Ready, s)?;
        for k in 0..W {
            let p = (r + k) % W;
            let (dst, src) = (self.recv[p] + r * CHUNK, self.send[it][r] + p * CHUNK);
            // SAFETY: chunk p of rank r's send buffer into chunk r of rank p's output, both
            // live device memory of device 0 until the end.
            unsafe { rt.copy_async(0, dst, src, CHUNK, s)? };
        }
        self.sig[r].phase(rt, 0, r, Phase::Done, s)?;
        // SAFETY: rank r's output into its snapshot of this iteration.
        unsafe { rt.copy_async(0, self.snap[it][r], self.recv[r], W * CHUNK, s) }
    }

    /// Zeroes the outputs and snapshots (so a replay that did nothing fails the check).
    fn clear(&self) -> Result<()> {
        let zero = vec![0u8; W * CHUNK];
        for &p in self.recv.iter().chain(self.snap.iter().flatten()) {
            // SAFETY: each holds `W * CHUNK` bytes.
            unsafe { self.rt.htod(0, p, &zero, &self.setup)? };
        }
        Ok(())
    }

    /// Every snapshot holds both ranks' chunks of its iteration; every flag is re-armed
    /// and each block's constant intact.
    fn check(&self, what: &str) -> Result<()> {
        let rt = self.rt;
        for (it, snaps) in self.snap.iter().enumerate() {
            for (r, &shot) in snaps.iter().enumerate() {
                // SAFETY: the snapshot holds `W * CHUNK` bytes.
                let got = unsafe { words(rt, shot, W * CHUNK / 4, &self.setup)? };
                for (j, got) in got.into_iter().enumerate() {
                    let (p, i) = (j / N, j % N);
                    // Chunk p of rank r's output came from rank p's send chunk r.
                    assert_eq!(
                        got,
                        value(it, p, r, i),
                        "{what}: iteration {it}, rank {r}, chunk {p}, element {i}"
                    );
                }
            }
        }
        for (r, &b) in self.bases.iter().enumerate() {
            // SAFETY: the block holds `block_bytes(W)` bytes.
            let words = unsafe { words(rt, b, block_bytes(W) / 4, &self.setup)? };
            let mut want = vec![0u32; 2 * W];
            want.push(1);
            assert_eq!(
                words, want,
                "{what}: rank {r}'s flags re-armed, its constant intact"
            );
        }
        Ok(())
    }

    fn idle(&self) -> Result<()> {
        for s in &self.streams {
            idle(self.rt, s, Duration::from_secs(10))?;
        }
        Ok(())
    }
}

/// Two "ranks" on device 0, each with its own stream, run an all-to-all twice exactly as the
/// copy-engine path does (ready phase, peer copy, done phase), rank 1 held back by a gate
/// word at first: rank 0's stream must not pass its ready phase until rank 1 signals (the
/// wait holds on the device), both finish once the gate opens, every chunk lands, each
/// iteration's snapshot (taken after the done phase) holds both ranks' chunks, and every
/// flag is re-armed to 0 afterwards.
pub fn signals_order_two_streams<R: Runtime>(g: &Gpu<R>) -> Result<()> {
    let rt = (g.vendor.runtime)()?;
    let mut w = World::new(&*rt)?;
    let gate = w.mem.alloc(4)?;
    // SAFETY: `gate` holds 4 bytes.
    unsafe { rt.htod(0, gate, &0u32.to_ne_bytes(), &w.setup)? };
    // SAFETY: the gate word, alive until the end.
    unsafe { rt.wait_value32(0, gate, 1, &w.streams[1])? };
    w.enqueue()?;
    std::thread::sleep(Duration::from_millis(300));
    let held = (rt.query(&w.streams[0])?, rt.query(&w.streams[1])?);
    // SAFETY: the gate word.
    unsafe { rt.htod(0, gate, &1u32.to_ne_bytes(), &w.setup)? };
    w.idle()?;
    assert_eq!(
        held,
        (false, false),
        "before the gate opened: rank 0 waits for rank 1's ready signal, rank 1 for the gate"
    );
    w.check("direct")
}

/// Rank 1 never arrives: rank 0's stream holds at its first wait, on the device, for good;
/// then the host releases rank 0's waits as an abort does (`signals::release`: the flags
/// written from a stream of its own, round after round, while every wait it releases
/// re-arms its word and the next one waits again). Rank 0's two iterations (four waits)
/// must drain within the release's deadline, and the release must say so.
pub fn signals_released_by_the_host<R: Runtime>(g: &Gpu<R>) -> Result<()> {
    let rt = (g.vendor.runtime)()?;
    let w = World::new(&*rt)?;
    for it in 0..ITERS {
        w.enqueue_one(it, 0)?;
    }
    std::thread::sleep(Duration::from_millis(300));
    let held = !rt.query(&w.streams[0])?;
    let start = Instant::now();
    // SAFETY: rank 0's block, alive until `w` drops, after its stream is idle (below).
    let drained = unsafe {
        release(&*rt, 0, w.bases[0], W, 0, Duration::from_secs(10), || {
            rt.query(&w.streams[0])
        })
    }?;
    let took = start.elapsed();
    w.idle()?;
    eprintln!(
        "signals_released_by_the_host: rank 0's stream drained {took:?} after the release began"
    );
    assert!(held, "rank 0's stream did not wait for the absent rank 1");
    assert!(
        drained,
        "the release gave up before rank 0's stream drained"
    );
    Ok(())
}

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
    let (mut send, mut recv) = (Vec::new(), Vec::new());
    for r in 0..W {
        let sb = mem.alloc(4 * W)?;
        let words: Vec<u8> = (0..W)
            .flat_map(|p| ((r * 10 + p) as u32).to_ne_bytes())
            .collect();
        // SAFETY: `sb` holds `4 * W` bytes.
        unsafe { rt.htod(0, sb, &words, &setup)? };
        send.push(sb);
        recv.push(mem.alloc(4 * W)?);
    }
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
    let pair = super::Pair::start(test)?;
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
    let iters = modes.len() * ITERS;
    // The shared allocation: the output's W chunks, the signal block, the gate word.
    let block_off = W * CHUNK;
    let gate_off = block_off + block_bytes(W);
    let st = c.create_stream()?;
    let mut region = c.alloc::<u32>((gate_off + 4) / 4)?;
    let mut image = vec![0u32; W * N];
    image.extend(decode(&block_image(W)));
    image.push(0);
    region.copy_from_host(&image, &st)?;
    let (mut send, mut snap) = (Vec::new(), Vec::new());
    for k in 0..iters {
        let mut b = c.alloc::<u32>(W * N)?;
        b.copy_from_host(
            &(0..W * N)
                .map(|j| value(k, me, j / N, j % N))
                .collect::<Vec<_>>(),
            &st,
        )?;
        send.push(b);
        snap.push(c.alloc::<u32>(W * N)?);
    }
    st.synchronize()?;
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
    for (m, &by_write) in modes.iter().enumerate() {
        let sig = Signals {
            block: None,
            bases: bases.clone(),
            mapped: Vec::new(),
            by_write,
        };
        for it in 0..ITERS {
            let k = m * ITERS + it;
            sig.phase(&*rt, dev, me, Phase::Ready, s)?;
            for q in 0..W {
                let p = (me + q) % W;
                let (dst, src) = (out(p) + me * CHUNK, send[k].memory().address() + p * CHUNK);
                // SAFETY: chunk p of this rank's send buffer into chunk `me` of rank p's
                // output (this process's region or the mapping of the peer's), both alive
                // until this stream is idle (below).
                unsafe { rt.copy_async(dev, dst, src, CHUNK, s) }?;
            }
            sig.phase(&*rt, dev, me, Phase::Done, s)?;
            // SAFETY: this rank's output into its snapshot of iteration k.
            unsafe { rt.copy_async(dev, snap[k].memory().address(), own, W * CHUNK, s) }?;
        }
    }
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
    for (k, shot) in snap.iter().enumerate() {
        let got = shot.copy_to_host(&st)?;
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
    let flags = &region.copy_to_host(&st)?[W * N..];
    let mut want = vec![0u32; 2 * W];
    want.extend([1, u32::from(me == 1)]);
    assert_eq!(
        flags, want,
        "rank {me}: flags re-armed, the constant intact (and the gate opened)"
    );
    // SAFETY: the mapping made by the swap; every stream that used it is idle.
    unsafe { rt.unmap_imported(dev, va, size) }?;
    eprintln!(
        "signals_across_processes: rank {me}: {iters} all-to-alls of {} MiB per peer through the peer's imported memory, signalled by {}",
        CHUNK >> 20,
        if modes.len() == 2 { "writes, then copies" } else { "copies" }
    );
    pair.finish()
}
