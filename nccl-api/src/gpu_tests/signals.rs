//! The copy-engine path's signals on a real GPU with two streams standing in for two ranks'
//! streams: the protocol of `signals.rs` (the code the path runs, `Signals::phase`), where a
//! machine has one GPU as much as where it has two.

use std::time::{Duration, Instant};

use unicomm_core::{Error, Result};

use super::Gpu;
use crate::signals::{block_bytes, Phase, Signals};
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

/// Two "ranks" on device 0, each with its own stream, run an all-to-all twice exactly as the
/// copy-engine path does (ready phase, peer copy, done phase), rank 1 held back by a gate
/// word at first: rank 0's stream must not pass its ready phase until rank 1 signals (the
/// wait holds on the device), both finish once the gate opens, every chunk lands, each
/// iteration's snapshot (taken after the done phase) holds both ranks' chunks, and every
/// flag is re-armed to 0 afterwards.
pub fn signals_order_two_streams<R: Runtime>(g: &Gpu<R>) -> Result<()> {
    let rt = (g.vendor.runtime)()?;
    let rt = &*rt;
    if !rt.stream_memory_ops(0) {
        return Err(Error::unsupported(
            "the copy-engine signals",
            "stream memory operations",
            format!("{} on device 0", R::NAME),
        ));
    }
    const W: usize = 2;
    const ITERS: usize = 2;
    let n = 1 << 20; // u32 per chunk: 4 MiB
    let chunk = 4 * n;
    let mut mem = Mem {
        rt,
        ptrs: Vec::new(),
    };
    let setup = rt.create_stream(0)?;
    let bytes = block_bytes(W);
    let mut init = vec![0u8; bytes];
    init[bytes - 4..].copy_from_slice(&1u32.to_ne_bytes());
    let mut bases = Vec::new();
    for _ in 0..W {
        let b = mem.alloc(bytes)?;
        // SAFETY: `b` holds `bytes` device bytes.
        unsafe { rt.htod(0, b, &init, &setup)? };
        bases.push(b);
    }
    let gate = mem.alloc(4)?;
    // SAFETY: `gate` holds 4 bytes.
    unsafe { rt.htod(0, gate, &0u32.to_ne_bytes(), &setup)? };
    // send[it][r] (W chunks, chunk p = (it, r, p) everywhere), recv[r], snap[it][r].
    let mut send = vec![vec![0usize; W]; ITERS];
    let mut recv = [0usize; W];
    let mut snap = vec![vec![0usize; W]; ITERS];
    let value = |it: usize, r: usize, p: usize, i: usize| {
        (it * 100 + r * 10 + p) as u32 * 1_000_000 + i as u32
    };
    for it in 0..ITERS {
        for r in 0..W {
            let s = mem.alloc(W * chunk)?;
            let host: Vec<u8> = (0..W * n)
                .flat_map(|j| value(it, r, j / n, j % n).to_ne_bytes())
                .collect();
            // SAFETY: `s` holds `W * chunk` bytes.
            unsafe { rt.htod(0, s, &host, &setup)? };
            send[it][r] = s;
            snap[it][r] = mem.alloc(W * chunk)?;
        }
    }
    for r in recv.iter_mut() {
        *r = mem.alloc(W * chunk)?;
    }
    let streams = [rt.create_stream(0)?, rt.create_stream(0)?];
    let sig: Vec<Signals<R>> = (0..W)
        .map(|_| Signals {
            block: None,
            bases: bases.clone(),
            mapped: Vec::new(),
        })
        .collect();
    // SAFETY: the gate word, alive until the end.
    unsafe { rt.wait_value32(0, gate, 1, &streams[1])? };
    for it in 0..ITERS {
        for r in 0..W {
            let s = &streams[r];
            sig[r].phase(rt, 0, r, Phase::Ready, s)?;
            for k in 0..W {
                let p = (r + k) % W;
                // SAFETY: chunk p of rank r's send buffer into chunk r of rank p's output,
                // both live device memory of device 0 until the end.
                unsafe {
                    rt.copy_async(0, recv[p] + r * chunk, send[it][r] + p * chunk, chunk, s)?
                };
            }
            sig[r].phase(rt, 0, r, Phase::Done, s)?;
            // SAFETY: rank r's output into its snapshot of this iteration.
            unsafe { rt.copy_async(0, snap[it][r], recv[r], W * chunk, s)? };
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let held = (rt.query(&streams[0])?, rt.query(&streams[1])?);
    // SAFETY: the gate word.
    unsafe { rt.htod(0, gate, &1u32.to_ne_bytes(), &setup)? };
    for s in &streams {
        idle(rt, s, Duration::from_secs(10))?;
    }
    assert_eq!(
        held,
        (false, false),
        "before the gate opened: rank 0 waits for rank 1's ready signal, rank 1 for the gate"
    );
    for (it, snaps) in snap.iter().enumerate() {
        for (r, &shot) in snaps.iter().enumerate() {
            let mut host = vec![0u8; W * chunk];
            // SAFETY: the snapshot holds `W * chunk` bytes.
            unsafe { rt.dtoh(0, &mut host, shot, &setup)? };
            for (j, w) in host.chunks_exact(4).enumerate() {
                let got = u32::from_ne_bytes([w[0], w[1], w[2], w[3]]);
                let (p, i) = (j / n, j % n);
                // Chunk p of rank r's output came from rank p's send chunk r.
                assert_eq!(
                    got,
                    value(it, p, r, i),
                    "iteration {it}, rank {r}, chunk {p}, element {i}"
                );
            }
        }
    }
    for (r, &b) in bases.iter().enumerate() {
        let mut host = vec![0u8; bytes];
        // SAFETY: the block holds `bytes` bytes.
        unsafe { rt.dtoh(0, &mut host, b, &setup)? };
        let words: Vec<u32> = host
            .chunks_exact(4)
            .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
            .collect();
        let mut want = vec![0u32; 2 * W];
        want.push(1);
        assert_eq!(
            words, want,
            "rank {r}'s flags re-armed, its constant intact"
        );
    }
    Ok(())
}
