//! [`CommConfig`]: how a communicator is created (NCCL's `ncclConfig_t`), one type for every
//! way of creating one (in the process, one rank per process, a split).
//!
//! Every field is `None` by default, meaning the library's own default. A field set on a
//! library older than the release that introduced it is an `Unsupported` error naming the
//! field and that release ([`CommConfig::check_supported`]), never dropped: NCCL reads only
//! the fields of the versions it knows, so an older library would ignore it silently.

use crate::{Error, Result, Version};

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

impl CtaPolicy {
    /// The `ncclConfig_t::CTAPolicy` value.
    pub const fn nccl(self) -> i32 {
        match self {
            CtaPolicy::Default => 0,
            CtaPolicy::Efficiency => 1,
            CtaPolicy::Zero => 2,
        }
    }
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
}

/// One field that is set, with the release that introduced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// The `ncclConfig_t` field's name.
    pub name: &'static str,
    /// The NCCL release that introduced it.
    pub since: Version,
}

const fn v(minor: u32) -> Version {
    Version::new(2, minor, 0)
}

impl CommConfig {
    /// The fields that are set, each with the NCCL release that introduced it.
    pub fn set_fields(&self) -> Vec<Field> {
        let f = |name, since| Field { name, since };
        let mut out = Vec::new();
        let mut add = |set: bool, field: Field| {
            if set {
                out.push(field)
            }
        };
        add(self.blocking.is_some(), f("blocking", v(14)));
        add(self.cga_cluster_size.is_some(), f("cgaClusterSize", v(17)));
        add(self.min_ctas.is_some(), f("minCTAs", v(17)));
        add(self.max_ctas.is_some(), f("maxCTAs", v(17)));
        add(self.net_name.is_some(), f("netName", v(17)));
        add(self.split_share.is_some(), f("splitShare", v(18)));
        add(self.traffic_class.is_some(), f("trafficClass", v(26)));
        add(self.comm_name.is_some(), f("commName", v(27)));
        add(self.collnet_enable.is_some(), f("collnetEnable", v(27)));
        add(
            self.cta_policy.is_some_and(|p| p != CtaPolicy::Zero),
            f("CTAPolicy", v(27)),
        );
        add(
            self.cta_policy == Some(CtaPolicy::Zero),
            f("CTAPolicy = NCCL_CTA_POLICY_ZERO", v(28)),
        );
        add(self.nvls_ctas.is_some(), f("nvlsCTAs", v(27)));
        out
    }

    /// Checks every field that is set against the loaded library's version (`library`, the
    /// NCCL API version `backend` reports) and its own range: `Unsupported` naming the
    /// first field the library predates, `InvalidArgument` for a value out of range.
    pub fn check_supported(&self, backend: &str, library: Version) -> Result<()> {
        if let Some(f) = self.set_fields().into_iter().find(|f| f.since > library) {
            return Err(Error::unsupported(
                format!("the communicator configuration field `{}`", f.name),
                format!("NCCL API >= {}", f.since),
                format!("{backend} {library}"),
            ));
        }
        self.check_values()
    }

    /// Checks the values NCCL documents a range for.
    pub fn check_values(&self) -> Result<()> {
        if self.cga_cluster_size.is_some_and(|c| c > 8) {
            return Err(Error::invalid(
                "cga_cluster_size",
                "NCCL takes 0..=8 (larger is a CUDA launch error)",
            ));
        }
        let int = |x: Option<u32>, arg: &'static str| -> Result<()> {
            match x {
                Some(x) if x > i32::MAX as u32 => {
                    Err(Error::invalid(arg, format!("{x} does not fit a C int")))
                }
                _ => Ok(()),
            }
        };
        int(self.min_ctas, "min_ctas")?;
        int(self.max_ctas, "max_ctas")?;
        int(self.traffic_class, "traffic_class")?;
        int(self.nvls_ctas, "nvls_ctas")?;
        if let (Some(lo), Some(hi)) = (self.min_ctas, self.max_ctas) {
            if lo > hi {
                return Err(Error::invalid(
                    "min_ctas",
                    format!("{lo} is above max_ctas = {hi}"),
                ));
            }
        }
        for (s, arg) in [(&self.net_name, "net_name"), (&self.comm_name, "comm_name")] {
            if s.as_deref().is_some_and(|s| s.contains('\0')) {
                return Err(Error::invalid(arg, "contains a NUL byte"));
            }
        }
        Ok(())
    }
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
        assert!(c.check_supported("nccl", Version::new(2, 27, 3)).is_ok());
        let e = c
            .check_supported("nccl", Version::new(2, 26, 5))
            .unwrap_err()
            .to_string();
        assert!(e.contains("commName") && e.contains("2.27.0"), "{e}");
        let zero = CommConfig {
            cta_policy: Some(CtaPolicy::Zero),
            ..CommConfig::default()
        };
        let e = zero
            .check_supported("nccl", Version::new(2, 27, 7))
            .unwrap_err()
            .to_string();
        assert!(e.contains("NCCL_CTA_POLICY_ZERO"), "{e}");
    }

    #[test]
    fn the_default_config_sets_nothing_and_fits_every_library() {
        assert!(CommConfig::default().set_fields().is_empty());
        assert!(CommConfig::default()
            .check_supported("nccl", Version::new(2, 9, 0))
            .is_ok());
    }

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
}
