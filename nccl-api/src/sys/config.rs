//! `ncclConfig_t`, the configuration of `ncclCommInitRankConfig` and `ncclCommSplit`.
//!
//! The struct is versioned and append-only (nccl.h: "attributes that users should never
//! touch": `size`, `magic`, `version`). A library reads the fields of the version the caller
//! names that it knows itself and takes its defaults for the rest, so the newest layout,
//! with its true `size` and `version`, is safe to hand to an older library: it never reads
//! past what it knows. Fields are laid out as NCCL 2.31's `ncclConfig_v23100`
//! (NVIDIA/nccl `src/nccl.h.in`; NCCL 2.32.3's nccl.h has the same layout, no field
//! newer); the release that added each is named beside it.

use std::ffi::{c_char, c_int, CString};

/// `ncclInProgress`: a non-blocking call still running.
pub const IN_PROGRESS: c_int = 7;
/// `NCCL_API_MAGIC`, checked by `ncclCommInitRankConfig`.
pub(crate) const API_MAGIC: u32 = 0xcafe_beef;
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
    /// 2.30.5 (`ncclConfig_v23000`, read in 2.30.7; NCCL resets it for a config claiming
    /// an earlier 2.30).
    pub graph_stream_ordering: c_int,
    /// 2.31 (`ncclConfig_v23100`, unchanged in 2.32.3).
    pub launch_order_implicit: c_int,
    pub num_rma_sig: c_int,
    pub rma_eager_init: c_int,
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

/// The layout of `ncclCommProperties_t` read here: NCCL 2.32's (`nccl_device/host.h`),
/// whose prefix every release since 2.29.2 shares.
const PROPERTIES_LAYOUT: u32 = 23203;
/// Told to a library up to 2.29.3, `ncclCommQueryProperties` fills only the fields up to
/// `multimemSupport` (2.30.7's dev_runtime.cc).
const PROPERTIES_HOST_RMA: u32 = 22903;

/// `ncclCommProperties_t` of NCCL 2.32 (C's `bool` read as a byte, enums as `int`).
#[repr(C)]
#[derive(Debug)]
pub struct RawProperties {
    size: usize,
    magic: u32,
    version: u32,
    rank: c_int,
    n_ranks: c_int,
    cuda_dev: c_int,
    nvml_dev: c_int,
    device_api_support: u8,
    multimem_support: u8,
    gin_type: c_int,
    n_lsa_teams: c_int,
    host_rma_support: u8,
    railed_gin_type: c_int,
    comm_hash: u64,
    gin_min_stride: c_int,
    gin_connection_type: c_int,
    gin_support: [u8; 64],
    dev_comm_runtime_version_size: usize,
    cft_support: u8,
    cft_multicast_support: u8,
    cft_counted_support: u8,
}

impl RawProperties {
    /// `NCCL_COMM_PROPERTIES_INITIALIZER` for a library of version code `library`: the
    /// older of its version and the layout's (NCCL refuses a version newer than its own).
    pub fn new(library: u32) -> Self {
        RawProperties {
            size: std::mem::size_of::<RawProperties>(),
            magic: API_MAGIC,
            version: library.min(PROPERTIES_LAYOUT),
            rank: -1,
            n_ranks: -1,
            cuda_dev: -1,
            nvml_dev: -1,
            device_api_support: 0,
            multimem_support: 0,
            gin_type: 0,
            n_lsa_teams: 0,
            host_rma_support: 0,
            railed_gin_type: 0,
            comm_hash: 0,
            gin_min_stride: 0,
            gin_connection_type: 0,
            gin_support: [0; 64],
            dev_comm_runtime_version_size: 0,
            cft_support: 0,
            cft_multicast_support: 0,
            cft_counted_support: 0,
        }
    }

    /// `devCommRuntimeVersionSize`, where the version told has it (2.31.2) and the library
    /// filled it.
    pub fn runtime_dev_comm_size(&self) -> Option<usize> {
        (self.version >= 23102 && self.dev_comm_runtime_version_size > 0)
            .then_some(self.dev_comm_runtime_version_size)
    }

    /// What the library filled for the version it was told.
    pub fn read(&self) -> unicomm_core::Properties {
        let newer = self.version > PROPERTIES_HOST_RMA;
        unicomm_core::Properties {
            rank: self.rank.max(0) as usize,
            world: self.n_ranks.max(0) as usize,
            device: self.cuda_dev.max(0) as usize,
            device_api: self.device_api_support != 0,
            multimem: self.multimem_support != 0,
            host_rma: newer.then_some(self.host_rma_support != 0),
            lsa_teams: newer.then_some(self.n_lsa_teams.max(0) as usize),
        }
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

    /// The 2.31 fields sit where NCCL 2.32.3's nccl.h (`ncclConfig_v23100`) has them: 19
    /// ints and two pointers after the header, the last at 112.
    #[test]
    fn the_2_31_fields_sit_where_nccl_2_32_has_them() {
        assert_eq!(std::mem::offset_of!(Config, comm_name), 48);
        assert_eq!(std::mem::offset_of!(Config, collnet_enable), 56);
        assert_eq!(std::mem::offset_of!(Config, graph_stream_ordering), 92);
        assert_eq!(std::mem::offset_of!(Config, launch_order_implicit), 96);
        assert_eq!(std::mem::offset_of!(Config, nvls_host_mode), 112);
    }

    /// `ncclCommProperties_t` as NCCL 2.32.3's `nccl_device/host.h` lays it out (C's
    /// alignment of each field), and the version told is never newer than the library.
    #[test]
    fn properties_are_laid_out_as_nccl_2_32_and_never_claim_a_newer_version() {
        assert_eq!(std::mem::offset_of!(RawProperties, rank), 16);
        assert_eq!(std::mem::offset_of!(RawProperties, device_api_support), 32);
        assert_eq!(std::mem::offset_of!(RawProperties, gin_type), 36);
        assert_eq!(std::mem::offset_of!(RawProperties, host_rma_support), 44);
        assert_eq!(std::mem::offset_of!(RawProperties, comm_hash), 56);
        assert_eq!(std::mem::offset_of!(RawProperties, gin_support), 72);
        assert_eq!(
            std::mem::offset_of!(RawProperties, dev_comm_runtime_version_size),
            136
        );
        assert_eq!(std::mem::size_of::<RawProperties>(), 152);
        assert_eq!(RawProperties::new(22902).version, 22902);
        assert_eq!(RawProperties::new(23301).version, 23203);
        let mut p = RawProperties::new(22903);
        (p.host_rma_support, p.n_lsa_teams) = (1, 2);
        assert_eq!(p.read().lsa_teams, None, "2.29.3 does not fill them");
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
