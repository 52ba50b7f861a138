//! [`CommConfig`]: how a communicator is created (NCCL's `ncclConfig_t`), one type for every
//! way of creating one (in the process, one rank per process, a split).
//!
//! Every field is `None` by default, meaning the library's own default. A field set on a
//! library older than the release that introduced it is an `Unsupported` error naming the
//! field and that release (the NCCL-API layer holds the table), never dropped: NCCL reads only
//! the fields of the versions it knows, so an older library would ignore it silently.

use crate::{Error, Result};

/// NCCL's CTA policy (`NCCL_CTA_POLICY_*`, NCCL >= 2.27): how many SMs its kernels take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CtaPolicy {
    /// `NCCL_CTA_POLICY_DEFAULT`: as many as the fastest algorithm wants.
    Default,
    /// `NCCL_CTA_POLICY_EFFICIENCY`: fewer SMs for about the same bandwidth, leaving SMs to
    /// compute that overlaps the collective.
    Efficiency,
    /// `NCCL_CTA_POLICY_ZERO` (NCCL >= 2.28): no SMs where a copy-engine path exists
    /// (symmetric windows).
    Zero,
}

/// The configuration of a new communicator (`ncclConfig_t`); `None` keeps the library's
/// default. The release of NCCL that introduced each field is named beside it; RCCL follows
/// NCCL's API version (its `ncclGetVersion`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommConfig {
    /// `blocking` (2.14): `false` makes creation and every call return at once, with
    /// unicomm waiting for the library's progress up to its deadline.
    pub blocking: Option<bool>,
    /// `cgaClusterSize` (2.17): CUDA cooperative group array cluster size, 0..=8.
    pub cga_cluster_size: Option<u32>,
    /// `minCTAs` (2.17): the fewest CTAs (SMs) a kernel uses.
    pub min_ctas: Option<u32>,
    /// `maxCTAs` (2.17): the most CTAs (SMs) a kernel uses.
    pub max_ctas: Option<u32>,
    /// `netName` (2.17): the network plugin to use ("IB", "Socket", ...).
    pub net_name: Option<String>,
    /// `splitShare` (2.18): a child of `split` shares its parent's internal resources
    /// (buffers, proxy), which costs less memory but means the two must not run work
    /// concurrently (NCCL's rule for shared resources).
    pub split_share: Option<bool>,
    /// `trafficClass` (2.26): the network's traffic class (QoS) of this communicator.
    pub traffic_class: Option<u32>,
    /// `commName` (2.27): a name NCCL shows in its logs and profiler.
    pub comm_name: Option<String>,
    /// `collnetEnable` (2.27): use CollNet/SHARP where the network has it.
    pub collnet_enable: Option<bool>,
    /// `CTAPolicy` (2.27; [`CtaPolicy::Zero`] 2.28).
    pub cta_policy: Option<CtaPolicy>,
    /// `nvlsCTAs` (2.27): CTAs of NVLink SHARP kernels.
    pub nvls_ctas: Option<u32>,
    /// `graphUsageMode` (2.29): how this communicator's work is used in CUDA graphs
    /// (TensorRT-LLM creates its communicators with 1); the values are NCCL's
    /// (`ncclConfig_t`), checked by the library.
    pub graph_usage_mode: Option<i32>,
    /// `graphStreamOrdering` (2.30.5): how captured work orders itself with the stream's
    /// other work; the values are NCCL's, checked by the library.
    pub graph_stream_ordering: Option<i32>,
}

/// The most CTAs per kernel `minCTAs` and `maxCTAs` take (NCCL's user guide).
const MAX_CTAS: u32 = 32;

impl CommConfig {
    /// Checks the values NCCL documents a range for.
    pub fn check_values(&self) -> Result<()> {
        check_ctas(
            self.min_ctas,
            self.max_ctas,
            self.nvls_ctas,
            self.cga_cluster_size,
        )?;
        if self.traffic_class.is_some_and(|x| x > i32::MAX as u32) {
            return Err(Error::invalid(
                "traffic_class",
                format!("{} does not fit a C int", self.traffic_class.unwrap_or(0)),
            ));
        }
        for (s, arg) in [(&self.net_name, "net_name"), (&self.comm_name, "comm_name")] {
            if s.as_deref().is_some_and(|s| s.contains('\0')) {
                return Err(Error::invalid(arg, "contains a NUL byte"));
            }
        }
        Ok(())
    }
}

/// The CTA fields' ranges, shared by `ncclConfig_t` and `ncclCollConfig_t`: NCCL's user
/// guide gives minCTAs and maxCTAs "a positive integer value, up to 32" (min at most max),
/// nvlsCTAs a positive integer, cgaClusterSize 0..=8 (larger is a CUDA launch error).
pub(crate) fn check_ctas(
    min_ctas: Option<u32>,
    max_ctas: Option<u32>,
    nvls_ctas: Option<u32>,
    cga_cluster_size: Option<u32>,
) -> Result<()> {
    if cga_cluster_size.is_some_and(|c| c > 8) {
        return Err(Error::invalid(
            "cga_cluster_size",
            "NCCL takes 0..=8 (larger is a CUDA launch error)",
        ));
    }
    for (x, arg) in [(min_ctas, "min_ctas"), (max_ctas, "max_ctas")] {
        if x.is_some_and(|x| !(1..=MAX_CTAS).contains(&x)) {
            return Err(Error::invalid(
                arg,
                format!("NCCL takes 1..={MAX_CTAS}, not {}", x.unwrap_or(0)),
            ));
        }
    }
    match nvls_ctas {
        Some(0) => {
            return Err(Error::invalid(
                "nvls_ctas",
                "NCCL takes a positive count, not 0",
            ))
        }
        Some(x) if x > i32::MAX as u32 => {
            return Err(Error::invalid(
                "nvls_ctas",
                format!("{x} does not fit a C int"),
            ))
        }
        _ => {}
    }
    if let (Some(lo), Some(hi)) = (min_ctas, max_ctas) {
        if lo > hi {
            return Err(Error::invalid(
                "min_ctas",
                format!("{lo} is above max_ctas = {hi}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_out_of_ncclconfig_ranges_are_refused() {
        let bad = CommConfig {
            min_ctas: Some(8),
            max_ctas: Some(4),
            ..CommConfig::default()
        };
        assert!(bad.check_values().is_err());
        let nul = CommConfig {
            comm_name: Some("a\0b".into()),
            ..CommConfig::default()
        };
        assert!(nul.check_values().is_err());
    }

    /// NCCL documents minCTAs and maxCTAs as 1..=32 and nvlsCTAs as positive: 0 and a
    /// million passed before, for the library to refuse or clamp as it liked.
    #[test]
    fn cta_counts_outside_ncclconfigs_documented_range_are_refused() {
        for (min, max, nvls) in [
            (Some(0), None, None),
            (None, Some(1_000_000), None),
            (None, Some(33), None),
            (None, None, Some(0)),
        ] {
            let c = CommConfig {
                min_ctas: min,
                max_ctas: max,
                nvls_ctas: nvls,
                ..CommConfig::default()
            };
            assert!(
                matches!(c.check_values(), Err(Error::InvalidArgument { .. })),
                "{min:?} {max:?} {nvls:?}"
            );
        }
        let fine = CommConfig {
            min_ctas: Some(1),
            max_ctas: Some(32),
            nvls_ctas: Some(16),
            ..CommConfig::default()
        };
        fine.check_values().unwrap();
    }
}
