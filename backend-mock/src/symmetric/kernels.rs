//! unicomm's symmetric kernels, run by the mock's stream worker over the ranks' mappings
//! with the protocols of the GPU kernels: a barrier on the signal pads (every rank's epoch
//! word, each peer's arrival word, compared as wrapping `u32`s), the all-reduces of one
//! shot, two shots and Lamport's poison (three workspaces in turn, each cleared a round
//! after it was read), and the fused residual add and RMSNorm. Every element and pad word is
//! read and written atomically (peers' threads and processes share them); every wait on a
//! peer also watches the world's poison (an abort) and the deadline.

#![allow(
    unsafe_code,
    reason = "peers' memory reached through its mapping's addresses, as a GPU kernel does"
)]

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use half::{bf16, f16};
use unicomm_core::symmetric::{pad_arrival, pad_gone, LAMPORT_HEADER, PAD_EPOCH, SIGNATURE_WORDS};
use unicomm_core::{DataType, Error, ReduceOp, Result};

use super::table::Record;
use crate::exec::RankCtx;
use crate::memory::{HostAlloc, MockMemory};

/// An element type of the kernels, read and written as its bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ty {
    F32,
    F16,
    Bf16,
}

impl Ty {
    pub(crate) fn of(d: DataType) -> Result<Ty> {
        match d {
            DataType::F32 => Ok(Ty::F32),
            DataType::F16 => Ok(Ty::F16),
            DataType::Bf16 => Ok(Ty::Bf16),
            other => Err(Error::invalid(
                "dtype",
                format!("{other}: not a symmetric kernel's"),
            )),
        }
    }

    pub(crate) fn dtype(self) -> DataType {
        match self {
            Ty::F32 => DataType::F32,
            Ty::F16 => DataType::F16,
            Ty::Bf16 => DataType::Bf16,
        }
    }

    pub(crate) fn size(self) -> usize {
        match self {
            Ty::F32 => 4,
            _ => 2,
        }
    }

    /// Negative zero: Lamport's "not written yet".
    pub(crate) fn poison(self) -> u32 {
        match self {
            Ty::F32 => 0x8000_0000,
            _ => 0x8000,
        }
    }

    /// Element `i` at `addr`, as bits.
    ///
    /// # Safety
    /// `addr + (i + 1) * size` lies inside a live mapping, `addr` aligned to the size.
    pub(crate) unsafe fn load(self, addr: usize, i: usize) -> u32 {
        // SAFETY: the caller's: inside a live mapping, aligned; atomics (peers share it).
        unsafe {
            match self {
                Ty::F32 => (*(addr as *const AtomicU32).add(i)).load(Ordering::Relaxed),
                _ => u32::from((*(addr as *const AtomicU16).add(i)).load(Ordering::Relaxed)),
            }
        }
    }

    /// Stores bits `b` as element `i` at `addr`.
    ///
    /// # Safety
    /// As [`Ty::load`].
    pub(crate) unsafe fn store(self, addr: usize, i: usize, b: u32) {
        // SAFETY: as `load`.
        unsafe {
            match self {
                Ty::F32 => (*(addr as *const AtomicU32).add(i)).store(b, Ordering::Relaxed),
                _ => (*(addr as *const AtomicU16).add(i)).store(b as u16, Ordering::Relaxed),
            }
        }
    }

    pub(crate) fn to_f64(self, b: u32) -> f64 {
        match self {
            Ty::F32 => f64::from(f32::from_bits(b)),
            Ty::F16 => f16::from_bits(b as u16).to_f64(),
            Ty::Bf16 => bf16::from_bits(b as u16).to_f64(),
        }
    }

    /// `x` rounded once to the type, as bits (a GPU kernel's `__float2bfloat16_rn`).
    pub(crate) fn bits_f32(self, x: f32) -> u32 {
        match self {
            Ty::F32 => x.to_bits(),
            Ty::F16 => u32::from(f16::from_f32(x).to_bits()),
            Ty::Bf16 => u32::from(bf16::from_f32(x).to_bits()),
        }
    }

    /// `acc` and `x` (bits) reduced by `op` in f32 and rounded once to the type, as the GPU
    /// kernels and NCCL's reduce 16-bit types (a sum at each step of the rank order).
    pub(crate) fn reduce(self, op: ReduceOp, acc: u32, x: u32) -> u32 {
        let (a, b) = (self.to_f64(acc) as f32, self.to_f64(x) as f32);
        let r = match op {
            ReduceOp::Max => a.max(b),
            ReduceOp::Min => a.min(b),
            _ => a + b,
        };
        self.bits_f32(r)
    }
}

/// Fills `bytes` bytes of `mem` from `offset` with the poison of `dtype` (the Lamport
/// workspaces, at allocation, before any peer can write them).
pub(crate) fn poison(
    mem: &MockMemory,
    offset: usize,
    bytes: usize,
    dtype: DataType,
    timeout: Duration,
) -> Result<()> {
    let t = Ty::of(dtype)?;
    let _g = mem.inner.write_lock(timeout)?;
    let base = mem.inner.addr() + offset;
    for i in 0..bytes / t.size() {
        // SAFETY: inside the allocation just made (`offset + bytes` is its size), aligned
        // (256-byte parts), write-locked.
        unsafe { t.store(base, i, t.poison()) };
    }
    Ok(())
}

/// The `u32` word at byte `at` of rank `p`'s pad, as long as `rec` lives.
pub(crate) fn pad_word(rec: &Record, p: usize, at: usize) -> &AtomicU32 {
    // SAFETY: the pad lies inside rank `p`'s mapping, which `rec` keeps (this rank's own
    // through its allocation, dropped after the record's own drop); `at` is one of the
    // pad's documented offsets (4-byte aligned, inside `PAD_BYTES`).
    unsafe { &*((rec.pad(p) + at) as *const AtomicU32) }
}

/// The largest value a signature word holds: a word with its top bit set is the poison.
pub(crate) const WORD: u32 = 0x7fff_ffff;

/// One Lamport slot as this rank sees it: its header ([`LAMPORT_HEADER`] bytes of signature
/// words), then the data's bytes; every access checked against them.
#[derive(Clone, Copy)]
pub(crate) struct Slot<'a> {
    rec: &'a Record,
    at: usize,
}

/// An access past what a kernel's checks allow: a bug in the mock, refused, never done.
fn outside(what: &str) -> Error {
    Error::invalid(
        "symmetric",
        format!("{what} outside its slot (a bug in the mock's kernels)"),
    )
}

impl Record {
    /// Rank `p`'s Lamport workspace `b` (0..3), slot `s`.
    pub(crate) fn slot(&self, p: usize, b: usize, s: usize) -> Result<Slot<'_>> {
        let w = self.bases.len();
        if self.lamport.is_none() || p >= w || s >= w || b >= 3 {
            return Err(outside("a Lamport slot"));
        }
        Ok(Slot {
            rec: self,
            at: self.lamport_slot(p, b, s),
        })
    }

    /// Element `i` of rank `p`'s data, as bits.
    pub(crate) fn data(&self, ty: Ty, p: usize, i: usize) -> Result<u32> {
        match (i + 1).checked_mul(ty.size()) {
            Some(end) if end <= self.bytes && p < self.bases.len() => {
                // SAFETY: inside rank `p`'s data (`bytes`), which this record keeps mapped;
                // aligned (256-byte parts, elements of their size).
                Ok(unsafe { ty.load(self.bases[p], i) })
            }
            _ => Err(outside("a data element")),
        }
    }

    /// The `i`-th i64 of rank `p`'s data (an all-to-all's splits).
    pub(crate) fn count(&self, p: usize, i: usize) -> Result<&AtomicU64> {
        match (i + 1).checked_mul(8) {
            Some(end) if end <= self.bytes && p < self.bases.len() => {
                // SAFETY: inside rank `p`'s data, which this record keeps mapped; 8-byte
                // aligned (parts start on page boundaries).
                Ok(unsafe { &*((self.bases[p] + 8 * i) as *const AtomicU64) })
            }
            _ => Err(outside("a split")),
        }
    }

    /// Byte `i` of rank `p`'s data.
    pub(crate) fn byte(&self, p: usize, i: usize) -> Result<u8> {
        if i < self.bytes && p < self.bases.len() {
            // SAFETY: inside rank `p`'s data, which this record keeps mapped; atomic (peers
            // share it).
            Ok(unsafe { &*((self.bases[p] + i) as *const AtomicU8) }.load(Ordering::Relaxed))
        } else {
            Err(outside("a data byte"))
        }
    }

    /// Stores `x` as byte `i` of rank `p`'s data (an FP8 token's element, pushed to a peer).
    pub(crate) fn set_byte(&self, p: usize, i: usize, x: u8) -> Result<()> {
        if i < self.bytes && p < self.bases.len() {
            // SAFETY: inside rank `p`'s data, which this record keeps mapped; atomic (peers
            // share it).
            unsafe { &*((self.bases[p] + i) as *const AtomicU8) }.store(x, Ordering::Relaxed);
            Ok(())
        } else {
            Err(outside("a data byte"))
        }
    }

    /// Stores bits `x` as element `i` of rank `p`'s data (a push to a peer).
    pub(crate) fn set(&self, ty: Ty, p: usize, i: usize, x: u32) -> Result<()> {
        match (i + 1).checked_mul(ty.size()) {
            Some(end) if end <= self.bytes && p < self.bases.len() => {
                // SAFETY: inside rank `p`'s data (`bytes`), which this record keeps mapped;
                // aligned.
                unsafe { ty.store(self.bases[p], i, x) };
                Ok(())
            }
            _ => Err(outside("a data element")),
        }
    }

    /// Stores bits `x` as element `i` of this rank's own data.
    pub(crate) fn set_own(&self, ty: Ty, i: usize, x: u32) -> Result<()> {
        match (i + 1).checked_mul(ty.size()) {
            Some(end) if end <= self.bytes => {
                // SAFETY: inside this rank's data (`bytes`), which this record keeps mapped;
                // aligned.
                unsafe { ty.store(self.bases[self.rank], i, x) };
                Ok(())
            }
            _ => Err(outside("a data element")),
        }
    }

    /// Rank `p`'s whole workspace `b` filled with the poison of `ty`.
    pub(crate) fn clear_workspace(&self, ty: Ty, p: usize, b: usize) -> Result<()> {
        let first = self.slot(p, b, 0)?;
        for i in 0..self.bases.len() * self.lamport_stride() / ty.size() {
            // SAFETY: inside workspace `b` of rank `p` (`world` slots of `lamport_stride`
            // bytes from its first), which this record keeps mapped; aligned.
            unsafe { ty.store(first.at, i, ty.poison()) };
        }
        Ok(())
    }
}

impl Slot<'_> {
    fn word(&self, i: usize) -> &AtomicU32 {
        // SAFETY: the header's `SIGNATURE_WORDS` words (the index is reduced to them) at
        // the start of a slot of a live mapping; 32-byte aligned (slots are laid out in
        // multiples of 32 bytes from 256-byte aligned parts).
        unsafe { &*((self.at + 4 * (i % SIGNATURE_WORDS)) as *const AtomicU32) }
    }

    /// Whether the header was written (its first word is not the poison).
    pub(crate) fn written(&self) -> bool {
        self.word(0).load(Ordering::Acquire) >> 31 == 0
    }

    pub(crate) fn header(&self) -> [u32; SIGNATURE_WORDS] {
        std::array::from_fn(|i| self.word(i).load(Ordering::Relaxed))
    }

    /// `sig` as the header, its first word stored last.
    pub(crate) fn set_header(&self, sig: &[u32; SIGNATURE_WORDS]) {
        for (i, &x) in sig.iter().enumerate().skip(1) {
            self.word(i).store(x, Ordering::Relaxed);
        }
        self.word(0).store(sig[0], Ordering::Release);
    }

    /// Element `i` of the slot's data, as bits.
    pub(crate) fn load(&self, ty: Ty, i: usize) -> Result<u32> {
        self.check(ty, i)?;
        // SAFETY: inside the slot's data (checked), of a live mapping; aligned.
        Ok(unsafe { ty.load(self.at + LAMPORT_HEADER, i) })
    }

    /// Stores bits `x` as element `i` of the slot's data.
    pub(crate) fn store(&self, ty: Ty, i: usize, x: u32) -> Result<()> {
        self.check(ty, i)?;
        // SAFETY: as `load`.
        unsafe { ty.store(self.at + LAMPORT_HEADER, i, x) };
        Ok(())
    }

    fn check(&self, ty: Ty, i: usize) -> Result<()> {
        match (i + 1).checked_mul(ty.size()) {
            Some(end) if end <= self.rec.pad_at => Ok(()),
            _ => Err(outside("a slot's element")),
        }
    }
}

impl Drop for Record {
    /// The last holder of this rank's view (the allocation's handle, a pending kernel, a
    /// graph's step) is gone, so this rank will never run another kernel on the allocation:
    /// its departure word tells the peers that still wait on it.
    fn drop(&mut self) {
        for p in 0..self.bases.len() {
            pad_word(self, p, pad_gone(self.rank)).store(1, Ordering::Release);
        }
    }
}

impl Record {
    /// Whether rank `p` released its part (its departure word in this rank's pad).
    pub(crate) fn gone(&self, p: usize) -> bool {
        pad_word(self, self.rank, pad_gone(p)).load(Ordering::Acquire) == 1
    }
}

/// One run of a kernel on one rank: the allocation, the world, until when, and the
/// signature of the call every rank must make alike.
pub(crate) struct Run {
    pub rec: Arc<Record>,
    pub ctx: Arc<RankCtx>,
    pub deadline: Instant,
    pub sig: [u32; SIGNATURE_WORDS],
}

/// A range of this rank's memory a kernel writes or reads (its allocation kept alive).
#[derive(Clone)]
pub(crate) struct Local {
    pub alloc: Arc<HostAlloc>,
    pub offset: usize,
}

impl Local {
    fn addr(&self) -> usize {
        self.alloc.addr() + self.offset
    }
}

impl Run {
    pub(crate) fn world(&self) -> usize {
        self.rec.bases.len()
    }

    /// Every rank but this one: a rank never waits for itself (the GPU kernels' rule: at
    /// world 1 a barrier waits on nothing, and Lamport reads a rank's own part from its
    /// input).
    pub(crate) fn peers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.world()).filter(move |&p| p != self.ctx.rank)
    }

    /// Waits on rank `peer` until `ready`, watching the world's poison, the peer's
    /// departure (it released its part: `Mismatch` at once), `diverged` (a peer's call of
    /// another kind: it poisons the world, the ranks' counters being out of step) and the
    /// deadline (then `Timeout` naming `what`, the world poisoned so that the peers end too).
    pub(crate) fn wait(
        &self,
        peer: usize,
        what: impl Fn() -> String,
        ready: impl Fn() -> bool,
        diverged: impl Fn() -> Option<Error>,
    ) -> Result<()> {
        let mut spins = 0u32;
        while !ready() {
            spins += 1;
            if spins.is_multiple_of(64) {
                if let Some(e) = self.ctx.fabric.poisoned() {
                    return Err(e);
                }
                if let Some(e) = diverged() {
                    self.ctx.fabric.poison(e.clone());
                    return Err(e);
                }
                // A call of another kind first: a peer that left after it had arrived there.
                // Its last writes come before its departure word: seen gone, read again.
                if self.rec.gone(peer) && !ready() {
                    return Err(Error::Mismatch {
                        what: "the number of symmetric calls",
                        detail: format!(
                            "rank {peer} released its part of the allocation (freed it, or ended its communicator) without making the call rank {} waits in: {}",
                            self.ctx.rank,
                            what()
                        ),
                    });
                }
                if Instant::now() >= self.deadline {
                    let e = Error::Timeout {
                        what: what(),
                        after: self.ctx.timeout,
                    };
                    self.ctx.fabric.poison(e.clone());
                    return Err(e);
                }
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    /// The `u32` word at byte `at` of rank `p`'s pad.
    pub(crate) fn word(&self, p: usize, at: usize) -> &AtomicU32 {
        pad_word(&self.rec, p, at)
    }

    /// The `SIGNATURE_WORDS` words from byte `at` of rank `p`'s pad.
    pub(crate) fn words(&self, p: usize, at: usize) -> [u32; SIGNATURE_WORDS] {
        std::array::from_fn(|i| self.word(p, at + 4 * i).load(Ordering::Relaxed))
    }

    /// The barrier: this rank's epoch advanced, written into every rank's arrival word for
    /// it, then every rank's word for this epoch awaited, `diverged(p, e)` watched while
    /// rank `p` is. Its epoch.
    pub(crate) fn barrier(&self, diverged: impl Fn(usize, u32) -> Option<Error>) -> Result<u32> {
        let me = self.ctx.rank;
        let e = self
            .word(me, PAD_EPOCH)
            .load(Ordering::Relaxed)
            .wrapping_add(1);
        self.word(me, PAD_EPOCH).store(e, Ordering::Relaxed);
        for p in self.peers() {
            self.word(p, pad_arrival(me)).store(e, Ordering::Release);
        }
        for p in self.peers() {
            let word = self.word(me, pad_arrival(p));
            self.wait(
                p,
                || format!("a symmetric barrier of rank {me} (epoch {e}): rank {p} never arrived"),
                || word.load(Ordering::Acquire).wrapping_sub(e) as i32 >= 0,
                || diverged(p, e),
            )?;
        }
        Ok(e)
    }
}

/// `bits` written to `out` under its allocation's write lock.
pub(crate) fn write(out: &Local, ty: Ty, bits: &[u32], timeout: Duration) -> Result<()> {
    let _g = out.alloc.write_lock(timeout)?;
    for (i, &b) in bits.iter().enumerate() {
        // SAFETY: `out` holds `count` elements (checked at enqueue) and is write-locked.
        unsafe { ty.store(out.addr(), i, b) };
    }
    Ok(())
}

/// `bytes` written at the start of `out` under its allocation's write lock.
pub(crate) fn write_bytes(out: &Local, bytes: &[u8], timeout: Duration) -> Result<()> {
    let _g = out.alloc.write_lock(timeout)?;
    // SAFETY: `out` holds `bytes.len()` bytes (checked at enqueue) and is write-locked.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.addr() as *mut u8, bytes.len()) };
    Ok(())
}

/// Element `i` of `l`, as bits (its allocation read-locked by the caller).
pub(crate) fn read(l: &Local, ty: Ty, i: usize) -> u32 {
    // SAFETY: the caller checked `i` against the range at enqueue and holds its lock.
    unsafe { ty.load(l.addr(), i) }
}

/// Byte `i` of `l` (its allocation read-locked by the caller).
pub(crate) fn read_u8(l: &Local, i: usize) -> u8 {
    // SAFETY: the caller checked `i` against the range at enqueue and holds its lock.
    unsafe { *((l.addr() + i) as *const u8) }
}

/// `b` written as element `i` of `l` (its allocation write-locked by the caller).
pub(crate) fn put(l: &Local, ty: Ty, i: usize, b: u32) {
    // SAFETY: as `read`.
    unsafe { ty.store(l.addr(), i, b) }
}
