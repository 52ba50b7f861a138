//! What one library version on one device permits, written once ([`Target`]): the NCCL-API
//! backends refuse through it (for the library they loaded and the device they run on), and
//! the mock configured to stand for a target refuses the same operations with the same
//! words, so a program tested on the mock meets on the cluster only the refusals it met in CI.

use std::borrow::Cow;

use unicomm_core::registry::RegKind;
use unicomm_core::{DataType, Error, Kind, ReduceOp, Result, Version};

use crate::sys::flavor::{
    Flavor, CALL_OPTIONS_SINCE, GROW_SINCE, NCCL, ONE_SIDED_CAPTURED_SINCE, ONE_SIDED_SINCE,
    PROPERTIES_SINCE, RCCL, SPLIT_SINCE, SUSPEND_SINCE,
};

/// The first compute capability on which NCCL reduces the 8-bit floats (sm90, Hopper).
pub const FP8_REDUCE_COMPUTE: (u32, u32) = (9, 0);

/// What a pre-multiplied sum is called in refusals, and its first release (NCCL 2.11; RCCL
/// of ROCm 5.2).
pub const PRE_MUL_SUM: &str = "a pre-multiplied sum (ncclRedOpCreatePreMulSum)";
/// See [`PRE_MUL_SUM`].
pub const PRE_MUL_SUM_SINCE: Version = Version::new(2, 11, 0);

/// What a communicator's properties are called in refusals.
pub const PROPERTIES_TITLE: &str = "a communicator's properties (ncclCommQueryProperties)";
/// What the sleep mode is called in refusals.
pub const SUSPEND_TITLE: &str =
    "suspending a communicator (ncclCommSuspend, ncclCommResume, ncclCommMemStats)";

/// What growing a communicator is called in refusals.
pub const GROW_TITLE: &str = "growing a communicator (ncclCommGrow, ncclCommGetUniqueId)";
/// What the one-sided operations are called in refusals.
pub const ONE_SIDED_TITLE: &str =
    "one-sided operations (ncclPutSignal, ncclSignal, ncclWaitSignal)";
/// What captured one-sided operations are called in refusals.
pub const ONE_SIDED_CAPTURED_TITLE: &str =
    "one-sided operations captured in a graph (ncclPutSignal, ncclSignal, ncclWaitSignal)";
/// What per-call options are called in refusals.
pub const CALL_OPTIONS_TITLE: &str = "per-call options (ncclCollConfig_t, nccl*Config)";

/// The newest NCCL unicomm was verified on, on an H200 (sm90): what the mock stands for
/// unless told otherwise.
pub const NEWEST_NCCL: Version = Version::new(2, 28, 9);

/// A library (NCCL or RCCL) at a version, on a device of a compute capability where known
/// (CUDA's `major.minor`; `None` on AMD and where it was not read), and where it was found
/// (for messages: the loaded file's path, or the mock standing for it).
#[derive(Debug, Clone)]
pub struct Target {
    /// NCCL's or RCCL's spellings and floors.
    pub flavor: &'static Flavor,
    /// The library's NCCL-API version.
    pub version: Version,
    /// CUDA's compute capability of the device (`(9, 0)` for sm90); `None` where unknown.
    pub compute: Option<(u32, u32)>,
    /// Where it is, for messages: `" at /usr/lib/libnccl.so.2"` or `" (the mock's target)"`.
    pub at: Cow<'static, str>,
}

impl Default for Target {
    /// The newest NCCL on sm90 ([`NEWEST_NCCL`]).
    fn default() -> Self {
        Target::nccl(NEWEST_NCCL, Some((9, 0)))
    }
}

impl Target {
    /// NCCL `version` on a device of compute capability `compute`, as the mock stands for it.
    pub fn nccl(version: Version, compute: Option<(u32, u32)>) -> Self {
        Target {
            flavor: &NCCL,
            version,
            compute,
            at: Cow::Borrowed(" (the mock's target)"),
        }
    }

    /// RCCL reporting NCCL-API `version` on an MI300 (whose fp8 is the FNUZ encoding), as the
    /// mock stands for it.
    pub fn rccl(version: Version) -> Self {
        Target {
            flavor: &RCCL,
            version,
            compute: None,
            at: Cow::Borrowed(" (the mock's target)"),
        }
    }

    /// Parses what `UNICOMM_MOCK_TARGET` holds: `nccl-2.23.4`, `nccl-2.28.9-sm80` (a compute
    /// capability as CUDA's `smXY`), `rccl-2.22.3` (an MI300). `InvalidArgument` naming the
    /// forms otherwise.
    pub fn parse(s: &str) -> Result<Self> {
        let bad = || {
            Error::invalid(
                "target",
                format!(
                    "{s:?} is not a target: nccl-MAJOR.MINOR.PATCH[-smXY] or rccl-MAJOR.MINOR.PATCH"
                ),
            )
        };
        let mut parts = s.trim().splitn(3, '-');
        let (lib, ver) = (parts.next().ok_or_else(bad)?, parts.next().ok_or_else(bad)?);
        let version = parse_version(ver).ok_or_else(bad)?;
        let sm = parts.next();
        match (lib.to_ascii_lowercase().as_str(), sm) {
            ("nccl", None) => Ok(Target::nccl(version, None)),
            ("nccl", Some(sm)) => Ok(Target::nccl(version, Some(parse_sm(sm).ok_or_else(bad)?))),
            ("rccl", None) => Ok(Target::rccl(version)),
            _ => Err(bad()),
        }
    }

    /// `NCCL 2.28.9 on sm90`, `RCCL 2.22.3`.
    pub fn name(&self) -> String {
        match self.compute {
            Some((a, b)) => format!("{} {} on sm{a}{b}", self.flavor.library, self.version),
            None => format!("{} {}", self.flavor.library, self.version),
        }
    }

    /// What was found, for an `Unsupported`: the library, its version and where it is.
    fn found(&self, note: &str) -> String {
        format!("{} {}{}{note}", self.flavor.library, self.version, self.at)
    }

    /// `Unsupported`: `what` needs the library at `since`.
    pub fn too_old(&self, what: &str, since: Version, note: &str) -> Error {
        Error::unsupported(
            what,
            format!("{} >= {since}", self.flavor.library),
            self.found(note),
        )
    }

    /// `Ok` where the library is at least `since`, else [`Target::too_old`].
    pub fn since(&self, what: &str, since: Version) -> Result<()> {
        if self.version >= since {
            return Ok(());
        }
        Err(self.too_old(what, since, ""))
    }

    /// Reductions of the 8-bit floats: NCCL >= 2.24.3 on sm90 or newer (what NCCL's kernels
    /// reduce); never on RCCL, whose MI300 encoding is FNUZ (unicomm does not reinterpret one
    /// as the other). `Unsupported` naming which.
    pub fn fp8_reduce(&self) -> Result<()> {
        let Some(since) = self.flavor.fp8_reduce_since else {
            return Err(Error::unsupported(
                "reductions of OCP 8-bit floats",
                "a library that reduces the OCP e4m3/e5m2 encoding (NCCL >= 2.24.3)",
                format!(
                    "{} {}, whose fp8 on MI300 is the FNUZ encoding (moving fp8 works)",
                    self.flavor.library, self.version
                ),
            ));
        };
        self.since("reductions of 8-bit floats", since)?;
        match self.compute {
            Some(c) if c < FP8_REDUCE_COMPUTE => Err(Error::unsupported(
                "reductions of 8-bit floats",
                "a GPU of compute capability 9.0 or newer (sm90)",
                format!("{} on sm{}{}", self.found(""), c.0, c.1),
            )),
            _ => Ok(()),
        }
    }

    /// NCCL's one-rank path (`ncclLaunchOneRank`, 2.28.9) has no pre-multiplied-sum kernel
    /// for the 8-bit floats, so a float average or a pre-multiplied sum of fp8 on a
    /// communicator of one rank fails there with `ncclInvalidArgument` (measured on 1x H200):
    /// refused first, as `Unsupported` naming why.
    #[inline]
    pub fn one_rank(&self, world: usize, kind: Kind, dtype: DataType) -> Result<()> {
        let premul = matches!(
            kind.reduction(),
            Some(ReduceOp::Avg | ReduceOp::PreMulSum(_))
        );
        if world == 1 && dtype.is_fp8() && premul {
            return Err(self.no_one_rank_premul(kind, dtype));
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn no_one_rank_premul(&self, kind: Kind, dtype: DataType) -> Error {
        Error::unsupported(
            format!(
                "{} of {dtype} with a pre-multiplied sum (or a float average) on one rank",
                kind.name()
            ),
            "a communicator of two or more ranks",
            format!(
                "{} {}, whose one-rank path has no fp8 kernel for it",
                self.flavor.library, self.version
            ),
        )
    }

    /// What an operation of `kind` on `dtype` needs of the target beyond the entry points:
    /// the 8-bit floats' reductions and the one-rank path's rule.
    #[inline]
    pub fn check_op(&self, world: usize, kind: Kind, dtype: DataType) -> Result<()> {
        if !dtype.is_fp8() {
            return Ok(());
        }
        if kind.reduction().is_some() {
            self.fp8_reduce()?;
        }
        self.one_rank(world, kind, dtype)
    }

    /// NCCL 2.28.9's symmetric-window all-gather, in place, corrupts the ranks' chunks when
    /// a chunk is not a multiple of 4 bytes (measured on 2x H200: f16/bf16/i8/u8 with 1001
    /// elements per rank get garbage from the next 8-byte boundary on; 4- and 8-byte types
    /// and out-of-place calls are right; so is a world of one). The one rule of both
    /// backends: rank `rank` of `world` gathers `chunk` bytes from `send` into `recv`, in
    /// place (`send` is `recv`'s chunk `rank`) and inside a symmetric window of the
    /// communicator (`covering` says which registration covers a range: a window, or an
    /// automatic registration running through its window). Refused as `Unsupported` rather
    /// than computed wrong; RCCL reports the NCCL API it implements and is held to it.
    #[inline]
    pub fn window_all_gather(
        &self,
        rank: usize,
        world: usize,
        send: usize,
        recv: usize,
        chunk: usize,
        covering: impl FnOnce(usize, usize) -> Result<Option<RegKind>>,
    ) -> Result<()> {
        // One rank gathers nothing from peers (and was measured right).
        if world == 1 || chunk.is_multiple_of(4) {
            return Ok(());
        }
        // An overflowing size is the call's own refusal, not this rule's.
        let (Some(at), Some(total)) = (rank.checked_mul(chunk), chunk.checked_mul(world)) else {
            return Ok(());
        };
        if send != recv.wrapping_add(at) || !covering(recv, total)?.is_some_and(RegKind::is_window)
        {
            return Ok(());
        }
        Err(Error::unsupported(
            format!("in-place all_gather in a symmetric window with {chunk}-byte chunks"),
            "chunks that are a multiple of 4 bytes (or out of place, or a non-window buffer)",
            format!(
                "{} {}, whose symmetric in-place all-gather corrupts such chunks",
                self.flavor.library, self.version
            ),
        ))
    }

    /// User-buffer registration (`ncclCommRegister`).
    pub fn registration(&self) -> Result<()> {
        self.since(
            "user-buffer registration (ncclCommRegister)",
            self.flavor.registration_since,
        )
    }

    /// Symmetric windows (`ncclCommWindowRegister`).
    pub fn windows(&self) -> Result<()> {
        self.since(
            "symmetric windows (ncclCommWindowRegister)",
            self.flavor.windows_since,
        )
    }

    /// A communicator's properties (`ncclCommQueryProperties`, NCCL 2.29.2).
    pub fn properties(&self) -> Result<()> {
        self.since(PROPERTIES_TITLE, PROPERTIES_SINCE)
    }

    /// Per-call options on a call of `kind` (`nccl*Config`, NCCL 2.32): the release, then
    /// the eight collectives NCCL has an entry point for (`InvalidArgument` for the others).
    pub fn call_options(&self, kind: Kind) -> Result<()> {
        self.since(CALL_OPTIONS_TITLE, CALL_OPTIONS_SINCE)?;
        match kind {
            Kind::AllReduce { .. }
            | Kind::Broadcast { .. }
            | Kind::Reduce { .. }
            | Kind::AllGather
            | Kind::ReduceScatter { .. }
            | Kind::AllToAll
            | Kind::Gather { .. }
            | Kind::Scatter { .. } => Ok(()),
            other => Err(Error::invalid(
                "options",
                format!(
                    "NCCL has no per-call options for {} (its nccl*Config calls: AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AlltoAll, Gather, Scatter)",
                    other.name()
                ),
            )),
        }
    }

    /// Growing a communicator (`ncclCommGrow`, NCCL 2.29.2).
    pub fn grow(&self) -> Result<()> {
        self.since(GROW_TITLE, GROW_SINCE)
    }

    /// The one-sided operations (`ncclPutSignal`, `ncclSignal`, `ncclWaitSignal`, NCCL
    /// 2.29.2).
    pub fn one_sided(&self) -> Result<()> {
        self.since(ONE_SIDED_TITLE, ONE_SIDED_SINCE)
    }

    /// unicomm's own symmetric kernels: built for NVIDIA GPUs of sm90 or newer (their PTX's
    /// target), so refused on an older GPU and on RCCL on an AMD GPU (no code object for
    /// one yet), as the GPU backends refuse them; `Unsupported` naming which.
    pub fn symmetric_kernels(&self) -> Result<()> {
        let what = "unicomm's symmetric kernels";
        if std::ptr::eq(self.flavor, &RCCL) {
            return Err(Error::unsupported(
                what,
                "an NVIDIA GPU of sm90 or newer (no code object for AMD GPUs yet)",
                self.found(""),
            ));
        }
        match self.compute {
            Some(c) if c < (9, 0) => Err(Error::unsupported(
                what,
                "a GPU of sm90 or newer (the kernels' PTX targets sm_90)",
                self.found(&format!(" on sm{}{}", c.0, c.1)),
            )),
            _ => Ok(()),
        }
    }

    /// One-sided operations inside a graph's capture (NCCL 2.30.3,
    /// [`ONE_SIDED_CAPTURED_SINCE`]).
    pub fn one_sided_captured(&self) -> Result<()> {
        self.since(ONE_SIDED_CAPTURED_TITLE, ONE_SIDED_CAPTURED_SINCE)
    }

    /// Suspend, resume and memory statistics (`ncclCommSuspend`, NCCL 2.29.7).
    pub fn suspend(&self) -> Result<()> {
        self.since(SUSPEND_TITLE, SUSPEND_SINCE)
    }

    /// A pre-multiplied sum (`ncclRedOpCreatePreMulSum`, NCCL 2.11).
    pub fn pre_mul_sum(&self) -> Result<()> {
        self.since(PRE_MUL_SUM, PRE_MUL_SUM_SINCE)
    }

    /// Whether the library splits communicators itself (`ncclCommSplit`).
    pub fn native_split(&self) -> bool {
        self.version >= SPLIT_SINCE
    }

    /// Whether the library has `ncclGather`/`ncclScatter`.
    pub fn native_gather_scatter(&self) -> bool {
        self.version >= self.flavor.gather_since
    }

    /// Whether the library has `ncclMemAlloc`.
    pub fn mem_alloc(&self) -> bool {
        self.version >= self.flavor.mem_alloc_since
    }

    /// Whether the library has an all-to-all with per-peer counts (RCCL's `ncclAllToAllv`).
    pub fn native_all_to_all_v(&self) -> bool {
        std::ptr::eq(self.flavor, &RCCL)
    }
}

fn parse_version(s: &str) -> Option<Version> {
    let mut it = s.split('.').map(|p| p.parse::<u32>().ok());
    let v = Version::new(it.next()??, it.next()??, it.next().unwrap_or(Some(0))?);
    it.next().is_none().then_some(v)
}

fn parse_sm(s: &str) -> Option<(u32, u32)> {
    let d = s.strip_prefix("sm")?;
    if d.len() < 2 || !d.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (major, minor) = d.split_at(d.len() - 1);
    Some((major.parse().ok()?, minor.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms_and_refuses_others() {
        let t = Target::parse("nccl-2.23.4").unwrap();
        assert_eq!(
            (t.flavor.library, t.version, t.compute),
            ("NCCL", Version::new(2, 23, 4), None)
        );
        let t = Target::parse("nccl-2.28.9-sm80").unwrap();
        assert_eq!(t.compute, Some((8, 0)));
        assert_eq!(
            Target::parse("nccl-2.28.9-sm100").unwrap().compute,
            Some((10, 0))
        );
        assert_eq!(Target::parse("rccl-2.22.3").unwrap().flavor.library, "RCCL");
        for bad in [
            "",
            "nccl",
            "nccl-2",
            "nccl-x.1.2",
            "rccl-2.22.3-sm90",
            "gloo-1.0.0",
            "nccl-2.28.9-90",
            "nccl-2.1.2.3",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    // NCCL 2.24.3 added fp8 reductions, for sm90 and newer only; RCCL's MI300 fp8 is FNUZ.
    #[test]
    fn fp8_reductions_need_nccl_2_24_3_on_sm90_and_never_rccl() {
        assert!(Target::default().fp8_reduce().is_ok());
        assert!(Target::nccl(Version::new(2, 24, 3), None)
            .fp8_reduce()
            .is_ok());
        let old = Target::nccl(Version::new(2, 23, 4), Some((9, 0)))
            .fp8_reduce()
            .unwrap_err();
        assert!(old.to_string().contains("NCCL >= 2.24.3"), "{old}");
        let ampere = Target::nccl(Version::new(2, 28, 9), Some((8, 0)))
            .fp8_reduce()
            .unwrap_err();
        assert!(ampere.to_string().contains("sm80"), "{ampere}");
        let rccl = Target::rccl(Version::new(2, 22, 3))
            .fp8_reduce()
            .unwrap_err();
        assert!(rccl.to_string().contains("FNUZ"), "{rccl}");
    }

    #[test]
    fn windows_registration_and_scaled_sums_follow_the_floors() {
        let old = Target::nccl(Version::new(2, 26, 5), None);
        assert!(old.windows().is_err() && old.registration().is_ok());
        assert!(Target::nccl(Version::new(2, 18, 3), None)
            .registration()
            .is_err());
        assert!(Target::nccl(Version::new(2, 10, 3), None)
            .pre_mul_sum()
            .is_err());
        assert!(Target::default().windows().is_ok() && Target::default().pre_mul_sum().is_ok());
    }
}
