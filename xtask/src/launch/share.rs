//! `--share-gpu`: how ranks of one GPU meet in NCCL. From NCCL 2.30.3 NCCL's own multi-rank
//! mode (`NCCL_MULTI_RANK_GPU_ENABLE=1`, the ranks one host: P2P between them and its
//! symmetric kernels, at most 2 ranks per GPU, processes only); below it a host id per
//! process (`NCCL_HOSTID`), which NCCL takes for ranks of different hosts joined over
//! sockets (older NCCLs refuse two ranks of one host on one GPU: "Duplicate GPU detected").

use std::process::Command;

use anyhow::{bail, Result};

/// NCCL's version code of the first release with the multi-rank mode (2.30.3).
const MULTI_RANK_SINCE: i32 = 23003;
/// The most ranks NCCL documents on one GPU in its multi-rank mode.
const MULTI_RANK_MAX: usize = 2;

/// How the ranks of the shared GPU meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Share {
    /// A host id per process: NCCL joins them over sockets.
    Hosts,
    /// NCCL's multi-rank mode: one host.
    MultiRank,
}

/// `major.minor.patch` of a NCCL version code (2.9 on: `major * 10000 + minor * 100 + patch`).
fn version(code: i32) -> String {
    format!("{}.{}.{}", code / 10000, code / 100 % 100, code % 100)
}

/// The mode for `n` ranks on one GPU, and the line saying why: the multi-rank mode where
/// the library the ranks load (`library`: its path and version code, where the launcher
/// could read it) has it, unless `NCCL_MULTI_RANK_GPU_ENABLE` (`forced`) says otherwise; more
/// ranks than NCCL puts on one GPU in that mode are refused, naming the rule.
pub(crate) fn decide(
    n: usize,
    library: Option<(&str, i32)>,
    forced: Option<&str>,
) -> Result<(Share, String)> {
    let (share, why) = match (forced, library) {
        (Some("0"), _) => (Share::Hosts, "NCCL_MULTI_RANK_GPU_ENABLE=0".to_string()),
        (Some(_), _) => (Share::MultiRank, "NCCL_MULTI_RANK_GPU_ENABLE is set".to_string()),
        (None, Some((path, code))) if code >= MULTI_RANK_SINCE => (
            Share::MultiRank,
            format!("NCCL {} at {path} has it (from 2.30.3)", version(code)),
        ),
        (None, Some((path, code))) => (
            Share::Hosts,
            format!("NCCL {} at {path} predates it (2.30.3)", version(code)),
        ),
        (None, None) => (
            Share::Hosts,
            "the ranks' NCCL is not named (set UNICOMM_NCCL_LIBRARY to a NCCL >= 2.30.3 for its multi-rank mode)".to_string(),
        ),
    };
    if share == Share::MultiRank && n > MULTI_RANK_MAX {
        bail!(
            "--share-gpu with {n} ranks: NCCL's multi-rank mode puts at most {MULTI_RANK_MAX} ranks on one GPU (NCCL's documented limit; {why}); launch {MULTI_RANK_MAX}, or set NCCL_MULTI_RANK_GPU_ENABLE=0 for separate host ids (sockets)"
        );
    }
    let line = match share {
        Share::MultiRank => format!(
            "--share-gpu: NCCL's multi-rank mode ({why}): one host, NCCL_MULTI_RANK_GPU_ENABLE=1, NCCL_MAX_CTAS=8 unless set; P2P between the ranks, correctness only (the contexts time-share the GPU)"
        ),
        Share::Hosts => format!(
            "--share-gpu: a host id per process (NCCL_HOSTID; {why}): NCCL joins the ranks over sockets, correctness only"
        ),
    };
    Ok((share, line))
}

impl Share {
    /// Rank `r`'s environment for this mode.
    pub(crate) fn apply(&self, cmd: &mut Command, token: &str, r: usize) {
        match self {
            Share::Hosts => {
                cmd.env("NCCL_HOSTID", format!("{token}-rank-{r}"));
            }
            Share::MultiRank => {
                cmd.env_remove("NCCL_HOSTID")
                    .env("NCCL_MULTI_RANK_GPU_ENABLE", "1");
                if std::env::var_os("NCCL_MAX_CTAS").is_none() {
                    cmd.env("NCCL_MAX_CTAS", "8");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mode follows the library's version, 2.30.3 the first with the multi-rank mode;
    /// the variable overrides it; more than 2 ranks per GPU in that mode are refused naming
    /// the rule.
    #[test]
    fn the_mode_follows_the_librarys_version_and_the_rule_of_two() {
        let lib = |c| Some(("/x/libnccl.so.2", c));
        assert_eq!(decide(2, lib(23203), None).unwrap().0, Share::MultiRank);
        assert_eq!(decide(2, lib(23003), None).unwrap().0, Share::MultiRank);
        assert_eq!(decide(2, lib(22809), None).unwrap().0, Share::Hosts);
        assert_eq!(decide(4, lib(22809), None).unwrap().0, Share::Hosts);
        assert_eq!(decide(2, None, None).unwrap().0, Share::Hosts);
        assert_eq!(decide(2, lib(23203), Some("0")).unwrap().0, Share::Hosts);
        assert_eq!(decide(2, None, Some("1")).unwrap().0, Share::MultiRank);
        let e = decide(3, lib(23203), None).unwrap_err().to_string();
        assert!(e.contains("at most 2 ranks on one GPU"), "{e}");
        let (_, line) = decide(2, lib(23203), None).unwrap();
        assert!(line.contains("NCCL 2.32.3"), "{line}");
    }
}
