//! A communicator's control block for unicomm's symmetric kernels: host memory the device
//! maps, holding the abort word every kernel's wait watches (set here at the communicator's
//! abort) and the first fault a kernel reports (read by the stream's waits, which then
//! report it and abort the communicator, as they do NCCL's asynchronous errors).

#![allow(
    unsafe_code,
    reason = "the control block is host memory the device maps, read and written as atomics"
)]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use unicomm_core::symmetric::{mismatch, with_word, SIGNATURE_WORDS};
use unicomm_core::{Error, Result};

use crate::libcomm::AbortHook;
use crate::sys::kernel_args::{fault, refused, Control};
use crate::sys::runtime::Runtime;

/// The control block of one communicator's symmetric kernels.
pub(crate) struct ControlBlock<R: Runtime> {
    rt: Arc<R>,
    dev: usize,
    /// The mapped host memory (a [`Control`]), at one address for host and device.
    addr: usize,
    rank: usize,
    /// The communicator's deadline in milliseconds, as it follows `set_timeout` (the
    /// kernels' deadline, named by the `Timeout` a kernel reports).
    timeout_ms: Arc<AtomicU64>,
}

impl<R: Runtime> ControlBlock<R> {
    /// A zeroed block on `dev` (`Unsupported` where the runtime has no symmetric kernels).
    pub(crate) fn new(
        rt: Arc<R>,
        dev: usize,
        rank: usize,
        timeout_ms: Arc<AtomicU64>,
    ) -> Result<Self> {
        let addr = rt.alloc_host_mapped(dev, std::mem::size_of::<Control>())?;
        Ok(ControlBlock {
            rt,
            dev,
            addr,
            rank,
            timeout_ms,
        })
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    /// Its address, for a kernel's argument.
    pub(crate) fn address(&self) -> usize {
        self.addr
    }

    /// The `u32` word at byte `at` of the block.
    fn word(&self, at: usize) -> &AtomicU32 {
        // SAFETY: `addr` is a live, 8-byte aligned mapping of a `Control` (freed only at
        // drop) and `at` one of its `u32` fields' offsets; the device writes it only with
        // atomic or volatile stores.
        unsafe { &*((self.addr + at) as *const AtomicU32) }
    }

    /// The fault a kernel reported, as the error the communicator's waits report.
    fn reported(&self) -> Option<Error> {
        let code = self
            .word(std::mem::offset_of!(Control, fault))
            .load(Ordering::Acquire);
        if code == 0 {
            return None;
        }
        let rank = self
            .word(std::mem::offset_of!(Control, rank))
            .load(Ordering::Relaxed);
        let epoch = self
            .word(std::mem::offset_of!(Control, epoch))
            .load(Ordering::Relaxed);
        let detail = self.word64(std::mem::offset_of!(Control, detail));
        let me = self.rank;
        Some(match code {
            fault::TIMEOUT => Error::Timeout {
                what: format!(
                    "a symmetric kernel of rank {me} (barrier epoch or Lamport round {epoch}): rank {rank} never arrived"
                ),
                after: self.timeout(),
            },
            fault::MISMATCH => {
                // Only the differing word is known: the others are left 0 on both sides.
                let i = (detail >> 32) as usize;
                let none = [0u32; SIGNATURE_WORDS];
                let mine = with_word(&none, i, epoch);
                let theirs = with_word(&none, i, detail as u32);
                mismatch(me, &mine, rank as usize, &theirs, i.min(SIGNATURE_WORDS - 1))
            }
            fault::GONE => Error::Mismatch {
                what: "the number of symmetric calls",
                detail: format!(
                    "a symmetric kernel of rank {me} (barrier epoch or Lamport round {epoch}): rank {rank} released its part of the allocation (freed it, or ended its communicator) without making the call"
                ),
            },
            fault::TYPE => Error::invalid(
                "dtype",
                format!("a Lamport all-reduce on rank {me}: every rank called it with another type than the allocation's workspace"),
            ),
            fault::BARRIER => Error::Timeout {
                what: format!(
                    "unicomm's device-API kernel of rank {me} (NCCL's LSA barrier {}): an LSA peer never arrived",
                    if epoch == 0 { "before the reads" } else { "after the reads" }
                ),
                after: self.timeout(),
            },
            fault::POISONED => Error::aborted(format!(
                "a symmetric kernel of rank {me}: a peer's kernel gave up at its deadline"
            )),
            _ => Error::aborted(format!(
                "a symmetric kernel of rank {me} ended: the communicator was aborted"
            )),
        })
    }
}

impl<R: Runtime> ControlBlock<R> {
    /// The `u64` at byte `at` of the block (written before the code it goes with).
    fn word64(&self, at: usize) -> u64 {
        u64::from(self.word(at).load(Ordering::Relaxed))
            | (u64::from(self.word(at + 4).load(Ordering::Relaxed)) << 32)
    }

    /// The call a kernel refused on every rank alike (a dispatch past its capacity), taken:
    /// its word cleared, so that the next refusal is reported in turn.
    fn take_refusal(&self) -> Option<Error> {
        let word = self.word(std::mem::offset_of!(Control, refused));
        let code = word.load(Ordering::Acquire);
        if code == 0 {
            return None;
        }
        let source = self
            .word(std::mem::offset_of!(Control, refused_rank))
            .load(Ordering::Relaxed);
        let at = self.word64(std::mem::offset_of!(Control, refused_at));
        let count = self.word64(std::mem::offset_of!(Control, refused_count));
        word.store(0, Ordering::Release);
        Some(match code {
            refused::EXPERT => Error::invalid(
                "ids",
                format!("rank {source}'s routing names an expert outside 0..{count}"),
            ),
            refused::SPLIT => Error::invalid(
                "splits",
                format!("rank {source} would send {} elements to rank {at}", count as i64),
            ),
            refused::SENT => Error::invalid(
                "splits",
                format!("rank {source} would send {count} elements from a {at}-element input"),
            ),
            refused::PACKED => Error::invalid(
                "max_recv",
                format!("rank {source} would receive {count} token copies, past max_recv {at}"),
            ),
            refused::RECEIVED => Error::invalid(
                "splits",
                format!("rank {source} would receive {count} elements, past the {at}-element bound (the input's size)"),
            ),
            _ => Error::invalid(
                "max_tokens",
                format!(
                    "expert {} (rank {}) would receive {} tokens from rank {source}, past max_tokens {}",
                    at >> 32,
                    at as u32,
                    count >> 32,
                    count as u32
                ),
            ),
        })
    }
}

impl<R: Runtime> AbortHook for ControlBlock<R> {
    /// Sets the abort word: every waiting kernel of this communicator ends within a few
    /// microseconds.
    fn release(&self, _within: Duration, _report: bool) -> bool {
        self.word(std::mem::offset_of!(Control, abort))
            .store(1, Ordering::Release);
        true
    }

    fn fault(&self) -> Option<Error> {
        self.reported()
    }

    fn refusal(&self) -> Option<Error> {
        self.take_refusal()
    }
}

impl<R: Runtime> Drop for ControlBlock<R> {
    /// Freed once the device is idle (no kernel reads it any more), within the deadline on
    /// a helper thread; past it, freed when the device is (never: leaked, not freed under a
    /// kernel).
    fn drop(&mut self) {
        let (rt, dev, addr) = (self.rt.clone(), self.dev, self.addr);
        let free = move || -> Result<()> {
            rt.synchronize_device(dev)?;
            // SAFETY: `addr` came from `alloc_host_mapped`, freed once, here, after the
            // device's work (synchronized above).
            unsafe { rt.free_host_mapped(addr) }
        };
        let what = format!("the symmetric kernels' control block on device {dev}");
        crate::wait::released(what, self.timeout(), free);
    }
}
