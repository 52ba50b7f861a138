//! A timestamp cheap enough to take on every call: the CPU's time-stamp counter on x86-64
//! (invariant on every CPU a GPU host has), turned into wall time only when read back, by
//! the counter's rate between two readings of the system clock. Elsewhere, the monotonic
//! clock. The flight recorder stamps each operation with it.

#![allow(
    unsafe_code,
    reason = "views of element slices as bytes, and the cycle counter"
)]

use std::time::{SystemTime, UNIX_EPOCH};

/// A reading of [`stamp`] with the wall time at that moment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Anchor {
    stamp: u64,
    wall_us: u64,
}

impl Anchor {
    /// Now.
    pub(crate) fn now() -> Anchor {
        Anchor {
            stamp: stamp(),
            wall_us: wall_now_us(),
        }
    }

    /// The wall time (microseconds since the Unix epoch) of `s`, a stamp taken between
    /// `self` and `later` (or near them), by the counter's rate between the two.
    pub(crate) fn wall_us(&self, later: &Anchor, s: u64) -> u64 {
        let (ds, dw) = (
            later.stamp.saturating_sub(self.stamp),
            later.wall_us.saturating_sub(self.wall_us),
        );
        if ds == 0 {
            return later.wall_us;
        }
        let back = u128::from(later.stamp.saturating_sub(s)) * u128::from(dw) / u128::from(ds);
        later.wall_us.saturating_sub(back as u64)
    }
}

/// Microseconds since the Unix epoch.
pub(crate) fn wall_now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The counter: one instruction on x86-64 (the system clock is a vDSO call at best, and a
/// system call where the kernel's clock source is not the TSC, as on some virtual machines).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn stamp() -> u64 {
    // SAFETY: RDTSC reads a counter register; it touches no memory and every x86-64 CPU
    // has it.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Nanoseconds of the monotonic clock since the first stamp of the process.
#[cfg(not(target_arch = "x86_64"))]
#[inline]
pub(crate) fn stamp() -> u64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stamp taken between two anchors maps between their wall times.
    #[test]
    fn a_stamp_between_two_anchors_maps_between_their_wall_times() {
        let a = Anchor::now();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let s = stamp();
        let mid = wall_now_us();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = Anchor::now();
        let w = a.wall_us(&b, s);
        assert!(
            w >= a.wall_us && w <= b.wall_us,
            "{w} not in {}..{}",
            a.wall_us,
            b.wall_us
        );
        // Within 5 ms of the system clock read beside it.
        assert!(w.abs_diff(mid) < 5_000, "{w} vs {mid}");
    }
}
