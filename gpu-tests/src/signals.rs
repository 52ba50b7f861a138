//! The copy-engine path's signals on a real GPU with two streams standing in for two ranks'
//! streams: the protocol of `signals.rs` (the code the path runs, `Signals::phase`), where a
//! machine has one GPU as much as where it has two.

#![allow(
    unsafe_code,
    reason = "the copy-engine path's building blocks driven directly on a GPU"
)]

use std::time::{Duration, Instant};

use unicomm_core::{Error, Result};

use super::Gpu;
use unicomm_nccl_api::testing::{block_bytes, block_image, release, Phase, Signals};
use unicomm_nccl_api::Runtime;

/// Device memory of this test, freed at the end (after the streams are idle).
pub(crate) struct Mem<'a, R: Runtime> {
    rt: &'a R,
    ptrs: Vec<usize>,
}

impl<R: Runtime> Mem<'_, R> {
    pub(crate) fn alloc(&mut self, bytes: usize) -> Result<usize> {
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
pub(crate) fn blocks<R: Runtime>(rt: &R) -> Result<(Mem<'_, R>, R::Stream, Vec<usize>)> {
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
pub(crate) fn need_memory_ops<R: Runtime>(rt: &R, dev: usize) -> Result<()> {
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
pub(crate) fn decode(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
        .collect()
}

/// `n` 4-byte words of device 0 at `addr`, read back through `s`.
///
/// # Safety
/// `addr` holds `4 * n` bytes of live device memory of device 0.
pub(crate) unsafe fn words<R: Runtime>(
    rt: &R,
    addr: usize,
    n: usize,
    s: &R::Stream,
) -> Result<Vec<u32>> {
    let mut host = vec![0u8; 4 * n];
    // SAFETY: as the caller promised.
    unsafe { rt.dtoh(0, &mut host, addr, s)? };
    Ok(decode(&host))
}

pub(crate) fn idle<R: Runtime>(rt: &R, s: &R::Stream, within: Duration) -> Result<()> {
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

pub(crate) const W: usize = 2;
pub(crate) const ITERS: usize = 2;
/// u32 per chunk: 4 MiB.
pub(crate) const N: usize = 1 << 20;
pub(crate) const CHUNK: usize = 4 * N;

/// What iteration `it` of rank `r` sends to rank `p` at element `i`.
pub(crate) fn value(it: usize, r: usize, p: usize, i: usize) -> u32 {
    (it * 100 + r * 10 + p) as u32 * 1_000_000 + i as u32
}

/// Two "ranks" on device 0: their signal blocks, buffers and streams.
pub(crate) struct World<'a, R: Runtime> {
    rt: &'a R,
    mem: Mem<'a, R>,
    setup: R::Stream,
    bases: Vec<usize>,
    /// send[it][r] (chunk p = `value(it, r, p, ..)`), recv[r], snap[it][r].
    send: Vec<Vec<usize>>,
    recv: [usize; W],
    snap: Vec<Vec<usize>>,
    pub(crate) streams: [R::Stream; W],
    sig: Vec<Signals<R>>,
}

impl<'a, R: Runtime> World<'a, R> {
    pub(crate) fn new(rt: &'a R) -> Result<Self> {
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
    pub(crate) fn enqueue(&self) -> Result<()> {
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
    pub(crate) fn clear(&self) -> Result<()> {
        let zero = vec![0u8; W * CHUNK];
        for &p in self.recv.iter().chain(self.snap.iter().flatten()) {
            // SAFETY: each holds `W * CHUNK` bytes.
            unsafe { self.rt.htod(0, p, &zero, &self.setup)? };
        }
        Ok(())
    }

    /// Every snapshot holds both ranks' chunks of its iteration; every flag is re-armed
    /// and each block's constant intact.
    pub(crate) fn check(&self, what: &str) -> Result<()> {
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
