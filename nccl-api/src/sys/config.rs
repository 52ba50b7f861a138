//! `ncclConfig_t`, the configuration of `ncclCommInitRankConfig` and `ncclCommSplit`.
//!
//! The struct is versioned and append-only (nccl.h: "attributes that users should never
//! touch": `size`, `magic`, `version`). A library reads the fields of the version the caller
//! names that it knows itself and takes its defaults for the rest, so the newest layout,
//! with its true `size` and `version`, is safe to hand to an older library: it never reads
//! past what it knows. Fields are laid out as NCCL 2.31's `ncclConfig_v23100`
//! (NVIDIA/nccl `src/nccl.h.in`); the release that added each is named beside it.

use std::ffi::{c_char, c_int, CString};

/// `ncclInProgress`: a non-blocking call still running.
pub const IN_PROGRESS: c_int = 7;
/// `NCCL_API_MAGIC`, checked by `ncclCommInitRankConfig`.
const API_MAGIC: u32 = 0xcafe_beef;
/// `NCCL_CONFIG_UNDEF_INT`: "the library's default".
pub const UNDEF: c_int = c_int::MIN;
/// The `NCCL_VERSION_CODE` whose layout [`Config`] is.
const LAYOUT_VERSION: u32 = 23100;

/// `ncclConfig_t` of NCCL 2.31.
#[repr(C)]
#[derive(Debug, Clone)]
#[expect(
    missing_docs,
    reason = "each field is the ncclConfig_t field of the same name"
)]
pub struct Config {
    size: usize,
    magic: u32,
    version: u32,
    /// 2.14.
    pub blocking: c_int,
    /// 2.17.
    pub cga_cluster_size: c_int,
    pub min_ctas: c_int,
    pub max_ctas: c_int,
    net_name: *const c_char,
    /// 2.18.
    pub split_share: c_int,
    /// 2.26.
    pub traffic_class: c_int,
    /// 2.27.
    comm_name: *const c_char,
    pub collnet_enable: c_int,
    pub cta_policy: c_int,
    pub shrink_share: c_int,
    pub nvls_ctas: c_int,
    /// 2.28.
    pub n_channels_per_net_peer: c_int,
    pub nvlink_centric_sched: c_int,
    /// 2.29.
    pub graph_usage_mode: c_int,
    pub num_rma_ctx: c_int,
    pub max_p2p_peers: c_int,
    /// 2.30.
    pub graph_stream_ordering: c_int,
    pub launch_order_implicit: c_int,
    pub num_rma_sig: c_int,
    pub rma_eager_init: c_int,
    /// 2.31.
    pub host_cft_mode: c_int,
    pub nvls_host_mode: c_int,
}

impl Config {
    /// `NCCL_CONFIG_INITIALIZER`: every field the library's default.
    pub fn new() -> Self {
        Config {
            size: std::mem::size_of::<Config>(),
            magic: API_MAGIC,
            version: LAYOUT_VERSION,
            blocking: UNDEF,
            cga_cluster_size: UNDEF,
            min_ctas: UNDEF,
            max_ctas: UNDEF,
            net_name: std::ptr::null(),
            split_share: UNDEF,
            traffic_class: UNDEF,
            comm_name: std::ptr::null(),
            collnet_enable: UNDEF,
            cta_policy: UNDEF,
            shrink_share: UNDEF,
            nvls_ctas: UNDEF,
            n_channels_per_net_peer: UNDEF,
            nvlink_centric_sched: UNDEF,
            graph_usage_mode: UNDEF,
            num_rma_ctx: UNDEF,
            max_p2p_peers: UNDEF,
            graph_stream_ordering: UNDEF,
            launch_order_implicit: UNDEF,
            num_rma_sig: UNDEF,
            rma_eager_init: UNDEF,
            host_cft_mode: UNDEF,
            nvls_host_mode: UNDEF,
        }
    }

    /// The initializer with `blocking` set (what non-blocking creation passes).
    pub fn with_blocking(blocking: bool) -> Self {
        Config {
            blocking: c_int::from(blocking),
            ..Config::new()
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::new()
    }
}

/// An `ncclConfig_t` with the strings its two name pointers point into, moved as one (into
/// the helper thread of a bounded call, which may outlive the caller's wait). The names can
/// be set only here, so a configuration handed to the library never points elsewhere.
#[derive(Debug)]
pub struct OwnedConfig {
    raw: Box<Config>,
    strings: Vec<CString>,
}

// SAFETY: the raw pointers point into `strings`, owned by the same value (a CString's heap
// buffer does not move), so moving the value to another thread moves what they point to.
#[allow(unsafe_code, reason = "the config owns what its pointers point to")]
unsafe impl Send for OwnedConfig {}

impl OwnedConfig {
    /// `config`'s integer fields, with no names set.
    pub fn new(config: Config) -> Self {
        OwnedConfig {
            raw: Box::new(Config {
                net_name: std::ptr::null(),
                comm_name: std::ptr::null(),
                ..config
            }),
            strings: Vec::new(),
        }
    }
    /// `netName` (NCCL 2.17).
    pub fn set_net_name(&mut self, name: CString) {
        self.raw.net_name = name.as_ptr();
        self.strings.push(name);
    }
    /// `commName` (NCCL 2.27).
    pub fn set_comm_name(&mut self, name: CString) {
        self.raw.comm_name = name.as_ptr();
        self.strings.push(name);
    }
    /// The struct for a call, valid while `self` lives.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut Config {
        &mut *self.raw
    }
}

impl std::ops::Deref for OwnedConfig {
    type Target = Config;
    fn deref(&self) -> &Config {
        &self.raw
    }
}

impl std::ops::DerefMut for OwnedConfig {
    fn deref_mut(&mut self) -> &mut Config {
        &mut self.raw
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NCCL reads `size` and `version` to know which fields the caller has: they must be
    /// those of the layout, or an older library could read past the struct.
    #[test]
    fn size_and_version_describe_the_layout_honestly() {
        let c = Config::new();
        assert_eq!(c.size, std::mem::size_of::<Config>());
        // The header (16 bytes), 21 ints and 2 pointers: 116 bytes, padded to 120.
        assert_eq!(c.size, 120);
        assert_eq!(c.version, 23100);
        assert_eq!(c.magic, 0xcafe_beef);
    }

    /// Field offsets of NCCL 2.14 (the fields every NCCL-API library since then knows) are
    /// unchanged by the later fields.
    #[test]
    fn the_2_14_prefix_keeps_its_offsets() {
        assert_eq!(std::mem::offset_of!(Config, blocking), 16);
        assert_eq!(std::mem::offset_of!(Config, max_ctas), 28);
        assert_eq!(std::mem::offset_of!(Config, net_name), 32);
        assert_eq!(std::mem::offset_of!(Config, split_share), 40);
    }
}
