//! The contract's types in the C API's values (wgpu-hal's `conv.rs`): the communicator
//! configuration as an `ncclConfig_t`, with the NCCL release that introduced each field
//! (the one table of them), the CTA policy and the shrink mode.

use std::ffi::{c_int, CString};

use unicomm_core::{CommConfig, CtaPolicy, Error, Result, ShrinkMode, Version};

pub(crate) use crate::sys::config::OwnedConfig;
use crate::sys::config::{Config, UNDEF};

/// The `ncclConfig_t::CTAPolicy` value (`NCCL_CTA_POLICY_*`).
pub(crate) const fn cta_policy(p: CtaPolicy) -> c_int {
    match p {
        CtaPolicy::Default => 0,
        CtaPolicy::Efficiency => 1,
        CtaPolicy::Zero => 2,
    }
}

/// The flag `ncclCommShrink` takes (`NCCL_SHRINK_*`; `Reform` never reaches it).
pub(crate) const fn shrink_flag(mode: ShrinkMode) -> c_int {
    match mode {
        ShrinkMode::Abort => 1,
        ShrinkMode::Default | ShrinkMode::Reform => 0,
    }
}

/// One field that is set, with the release that introduced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Field {
    /// The `ncclConfig_t` field's name.
    pub name: &'static str,
    /// The NCCL release that introduced it.
    pub since: Version,
}

const fn v(minor: u32) -> Version {
    Version::new(2, minor, 0)
}

/// The fields of `config` that are set, each with the NCCL release that introduced it
/// (read from `src/nccl.h.in` at each tag).
pub(crate) fn set_fields(config: &CommConfig) -> Vec<Field> {
    let c = config;
    let table = [
        (c.blocking.is_some(), "blocking", v(14)),
        (c.cga_cluster_size.is_some(), "cgaClusterSize", v(17)),
        (c.min_ctas.is_some(), "minCTAs", v(17)),
        (c.max_ctas.is_some(), "maxCTAs", v(17)),
        (c.net_name.is_some(), "netName", v(17)),
        (c.split_share.is_some(), "splitShare", v(18)),
        (c.traffic_class.is_some(), "trafficClass", v(26)),
        (c.comm_name.is_some(), "commName", v(27)),
        (c.collnet_enable.is_some(), "collnetEnable", v(27)),
        (
            c.cta_policy.is_some_and(|p| p != CtaPolicy::Zero),
            "CTAPolicy",
            v(27),
        ),
        (
            c.cta_policy == Some(CtaPolicy::Zero),
            "CTAPolicy = NCCL_CTA_POLICY_ZERO",
            v(28),
        ),
        (c.nvls_ctas.is_some(), "nvlsCTAs", v(27)),
        (c.graph_usage_mode.is_some(), "graphUsageMode", v(29)),
        (
            c.graph_stream_ordering.is_some(),
            "graphStreamOrdering",
            // 2.30.5: NCCL's own check (`parseCommConfig`) resets the field for a config
            // claiming 2.30.0-2.30.4, whose headers lack it.
            Version::new(2, 30, 5),
        ),
    ];
    table
        .into_iter()
        .filter(|(set, _, _)| *set)
        .map(|(_, name, since)| Field { name, since })
        .collect()
}

/// Checks every field of `config` that is set against the loaded library's version
/// (`library`, the NCCL API version `backend` reports) and its own range: `Unsupported`
/// naming the first field the library predates (NCCL would ignore it silently),
/// `InvalidArgument` for a value out of range.
pub(crate) fn check_config(config: &CommConfig, backend: &str, library: Version) -> Result<()> {
    if let Some(f) = set_fields(config).into_iter().find(|f| f.since > library) {
        return Err(Error::unsupported(
            format!("the communicator configuration field `{}`", f.name),
            format!("NCCL API >= {}", f.since),
            format!("{backend} {library}"),
        ));
    }
    config.check_values()
}

impl crate::sys::target::Target {
    /// Checks `config` as this target's library takes it: `Unsupported` naming the first
    /// field the library predates, `InvalidArgument` for a value out of range (what the
    /// NCCL-API backends check at creation, split and shrink, and the mock standing for
    /// this target too).
    pub fn check_config(&self, config: &CommConfig) -> Result<()> {
        check_config(config, self.flavor.library, self.version)
    }
}

/// The `ncclConfig_t` of `config`, or `None` where nothing is set and the library's (or the
/// parent's) defaults apply. `blocking` is `!nonblocking` where `config` leaves it unset and
/// `nonblocking` was asked for (`UNICOMM_NONBLOCKING=1`, or a split of a non-blocking
/// parent). The caller checked `config` against the library.
pub(crate) fn to_config(config: &CommConfig, nonblocking: bool) -> Result<Option<OwnedConfig>> {
    if set_fields(config).is_empty() && !nonblocking {
        return Ok(None);
    }
    let mut c = Config::new();
    let int = |x: Option<u32>| x.map_or(UNDEF, |v| v as c_int);
    let flag = |x: Option<bool>| x.map_or(UNDEF, c_int::from);
    c.blocking = match config.blocking {
        Some(b) => c_int::from(b),
        None if nonblocking => 0,
        None => UNDEF,
    };
    c.cga_cluster_size = int(config.cga_cluster_size);
    c.min_ctas = int(config.min_ctas);
    c.max_ctas = int(config.max_ctas);
    c.split_share = flag(config.split_share);
    c.traffic_class = int(config.traffic_class);
    c.collnet_enable = flag(config.collnet_enable);
    c.cta_policy = config.cta_policy.map_or(UNDEF, cta_policy);
    c.nvls_ctas = int(config.nvls_ctas);
    c.graph_usage_mode = config.graph_usage_mode.unwrap_or(UNDEF);
    c.graph_stream_ordering = config.graph_stream_ordering.unwrap_or(UNDEF);
    let mut owned = OwnedConfig::new(c);
    let name =
        |s: &str| CString::new(s).map_err(|_| Error::invalid("config", "a name with a NUL byte"));
    if let Some(s) = &config.net_name {
        owned.set_net_name(name(s)?);
    }
    if let Some(s) = &config.comm_name {
        owned.set_comm_name(name(s)?);
    }
    Ok(Some(owned))
}

/// Per-call options as the `ncclCollConfig_t` of one call (values checked by
/// [`CallOptions::check_values`] when the scope opened).
pub(crate) fn coll_config(
    o: &unicomm_core::CallOptions,
) -> Result<crate::sys::coll_config::CollConfig> {
    let alg = match &o.algorithms {
        Some(a) => Some(
            CString::new(a.selection())
                .map_err(|_| Error::invalid("algorithms", "contains a NUL byte"))?,
        ),
        None => None,
    };
    let mut c = crate::sys::coll_config::CollConfig::new(alg);
    let r = c.raw_mut();
    let int = |x: Option<u32>| x.map_or(UNDEF, |x| x.min(c_int::MAX as u32) as c_int);
    r.min_ctas = int(o.min_ctas);
    r.max_ctas = int(o.max_ctas);
    r.nvls_ctas = int(o.nvls_ctas);
    r.cga_cluster_size = int(o.cga_cluster_size);
    if let Some(f) = o.force_algorithms {
        r.force_alg_selection = c_int::from(f);
    }
    r.cta_policy = o.cta_policy.map_or(UNDEF, cta_policy);
    r.user_profiler_tag = o.profiler_tag.unwrap_or(0);
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NCCL ignores a field of a newer version than its own: unicomm refuses it instead.
    #[test]
    fn a_field_newer_than_the_library_is_unsupported_and_named() {
        let c = CommConfig {
            comm_name: Some("tp".into()),
            ..CommConfig::default()
        };
        assert!(check_config(&c, "nccl", Version::new(2, 27, 3)).is_ok());
        let e = check_config(&c, "nccl", Version::new(2, 26, 5))
            .unwrap_err()
            .to_string();
        assert!(e.contains("commName") && e.contains("2.27.0"), "{e}");
        let zero = CommConfig {
            cta_policy: Some(CtaPolicy::Zero),
            ..CommConfig::default()
        };
        let e = check_config(&zero, "nccl", Version::new(2, 27, 7))
            .unwrap_err()
            .to_string();
        assert!(e.contains("NCCL_CTA_POLICY_ZERO"), "{e}");
    }

    /// The graph modes are gated like the other fields: on NCCL 2.28.9 (the GPU machine's)
    /// setting either is `Unsupported` naming the field and its release, never dropped.
    #[test]
    fn the_graph_modes_need_nccl_2_29_and_2_30_5() {
        let usage = CommConfig {
            graph_usage_mode: Some(1),
            ..CommConfig::default()
        };
        let e = check_config(&usage, "nccl", Version::new(2, 28, 9))
            .unwrap_err()
            .to_string();
        assert!(e.contains("graphUsageMode") && e.contains("2.29.0"), "{e}");
        assert!(check_config(&usage, "nccl", Version::new(2, 29, 2)).is_ok());
        let ordering = CommConfig {
            graph_stream_ordering: Some(1),
            ..usage
        };
        for older in [Version::new(2, 29, 2), Version::new(2, 30, 3)] {
            let e = check_config(&ordering, "nccl", older)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("graphStreamOrdering") && e.contains("2.30.5"),
                "{e}"
            );
        }
        assert!(check_config(&ordering, "nccl", Version::new(2, 30, 5)).is_ok());
        let c = to_config(&ordering, false).unwrap().expect("set fields");
        assert_eq!((c.graph_usage_mode, c.graph_stream_ordering), (1, 1));
    }

    #[test]
    fn the_default_config_sets_nothing_and_fits_every_library() {
        assert!(set_fields(&CommConfig::default()).is_empty());
        assert!(check_config(&CommConfig::default(), "nccl", Version::new(2, 9, 0)).is_ok());
    }

    /// nccl.h's values: the library reads these integers, not our enum.
    #[test]
    fn the_cta_policy_and_shrink_flag_are_nccl_h_values() {
        assert_eq!(cta_policy(CtaPolicy::Zero), 2);
        assert_eq!(cta_policy(CtaPolicy::Efficiency), 1);
        assert_eq!(shrink_flag(ShrinkMode::Abort), 1);
        assert_eq!(shrink_flag(ShrinkMode::Default), 0);
    }
}
