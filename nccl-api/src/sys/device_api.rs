//! NCCL's device API as its host side lays it out: `ncclDevCommRequirements_t` (the layout
//! of NCCL 2.31.2's `nccl_device/core.h`, kept byte for byte by 2.32.3's
//! `nccl_device/host.h`: both measured by a C++ compiler against the headers, 120 bytes)
//! and `ncclTeam_t`.

use std::ffi::{c_int, c_void};

use unicomm_core::device_api::{DeviceCommLayout, DeviceCommRequirements, Team};
use unicomm_core::Version;

use crate::sys::config::API_MAGIC;

/// The release whose requirements layout this is (the oldest that has it).
pub const REQUIREMENTS_LAYOUT: Version = Version::new(2, 31, 2);

/// `NCCL_CONFIG_UNDEF_INT`.
const UNDEF_INT: c_int = c_int::MIN;

/// `ncclDevCommRequirements_t` of NCCL 2.31.2 and 2.32.3 (C's `bool` as a byte, enums as
/// `int`).
#[repr(C)]
#[derive(Debug)]
pub struct RawDevCommRequirements {
    size: usize,
    magic: u32,
    version: u32,
    resource_requirements: *mut c_void,
    team_requirements: *mut c_void,
    lsa_multimem: u8,
    barrier_count: c_int,
    lsa_barrier_count: c_int,
    rail_gin_barrier_count: c_int,
    lsa_ll_a2a_block_count: c_int,
    lsa_ll_a2a_slot_count: c_int,
    gin_force_enable: u8,
    gin_context_count: c_int,
    gin_signal_count: c_int,
    gin_counter_count: c_int,
    gin_connection_type: c_int,
    gin_exclusive_contexts: u8,
    gin_queue_depth: c_int,
    gin_traffic_class: c_int,
    world_gin_barrier_count: c_int,
    gin_strong_signals_required: u8,
    gin_va_signals_required: u8,
    gin_custom_stride: c_int,
    gin_type: c_int,
    use_runtime_version: u8,
    cft_caps: c_int,
    cft_barrier_count: c_int,
}

/// A release as NCCL's version code.
pub fn code(v: Version) -> u32 {
    v.major * 10000 + v.minor * 100 + v.patch
}

impl RawDevCommRequirements {
    /// `NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER` with `reqs` set, for a library of version
    /// `library`: the version told is the built layout's (NCCL fills that release's
    /// `ncclDevComm`), or for the runtime layout the library's own, no newer than this
    /// layout's newest known release (NCCL refuses a version newer than its own).
    pub fn new(reqs: &DeviceCommRequirements, library: Version) -> Self {
        let (version, runtime) = match reqs.layout {
            DeviceCommLayout::Runtime => (code(library).min(23203), 1),
            DeviceCommLayout::Built { version, .. } => (code(version), 0),
        };
        RawDevCommRequirements {
            size: std::mem::size_of::<Self>(),
            magic: API_MAGIC,
            version,
            resource_requirements: std::ptr::null_mut(),
            team_requirements: std::ptr::null_mut(),
            lsa_multimem: u8::from(reqs.lsa_multimem),
            barrier_count: 0,
            lsa_barrier_count: c_int::try_from(reqs.lsa_barriers).unwrap_or(c_int::MAX),
            rail_gin_barrier_count: 0,
            lsa_ll_a2a_block_count: 0,
            lsa_ll_a2a_slot_count: 0,
            gin_force_enable: 0,
            gin_context_count: 4,
            gin_signal_count: 0,
            gin_counter_count: 0,
            gin_connection_type: 0,
            gin_exclusive_contexts: 0,
            gin_queue_depth: 0,
            gin_traffic_class: UNDEF_INT,
            world_gin_barrier_count: 0,
            gin_strong_signals_required: 1,
            gin_va_signals_required: 1,
            gin_custom_stride: 1,
            gin_type: 0,
            use_runtime_version: runtime,
            cft_caps: 0,
            cft_barrier_count: 0,
        }
    }

    /// The version told to the library.
    pub fn version(&self) -> u32 {
        self.version
    }
}

/// `ncclTeam_t`: three ints, returned by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawTeam {
    n_ranks: c_int,
    rank: c_int,
    stride: c_int,
}

impl RawTeam {
    /// As the contract's [`Team`] (a negative field, which no library answers, as 0).
    pub fn team(self) -> Team {
        let u = |x: c_int| usize::try_from(x).unwrap_or(0);
        Team {
            ranks: u(self.n_ranks),
            rank: u(self.rank),
            stride: u(self.stride),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// The offsets g++ gave for 2.31.2's and 2.32.3's headers (identical in both).
    #[test]
    fn the_requirements_sit_where_nccl_2_31_2_and_2_32_3_have_them() {
        type R = RawDevCommRequirements;
        assert_eq!(std::mem::size_of::<R>(), 120);
        assert_eq!(offset_of!(R, resource_requirements), 16);
        assert_eq!(offset_of!(R, lsa_multimem), 32);
        assert_eq!(offset_of!(R, lsa_barrier_count), 40);
        assert_eq!(offset_of!(R, gin_force_enable), 56);
        assert_eq!(offset_of!(R, gin_connection_type), 72);
        assert_eq!(offset_of!(R, gin_exclusive_contexts), 76);
        assert_eq!(offset_of!(R, world_gin_barrier_count), 88);
        assert_eq!(offset_of!(R, gin_va_signals_required), 93);
        assert_eq!(offset_of!(R, gin_custom_stride), 96);
        assert_eq!(offset_of!(R, use_runtime_version), 104);
        assert_eq!(offset_of!(R, cft_barrier_count), 112);
        assert_eq!(std::mem::size_of::<RawTeam>(), 12);
    }

    /// The runtime layout tells the library its own version (no newer than the layout
    /// known here) with `useRuntimeVersion`; a built one tells the headers' release
    /// without it.
    #[test]
    fn the_version_told_is_the_library_s_or_the_headers() {
        let mut reqs = DeviceCommRequirements::runtime(4);
        let r = RawDevCommRequirements::new(&reqs, Version::new(2, 31, 2));
        assert_eq!((r.version, r.use_runtime_version), (23102, 1));
        assert_eq!(r.lsa_barrier_count, 4);
        let r = RawDevCommRequirements::new(&reqs, Version::new(2, 40, 1));
        assert_eq!(r.version, 23203);
        reqs.layout = DeviceCommLayout::Built {
            version: Version::new(2, 32, 3),
            size: 248,
        };
        let r = RawDevCommRequirements::new(&reqs, Version::new(2, 33, 0));
        assert_eq!((r.version, r.use_runtime_version), (23203, 0));
    }
}
