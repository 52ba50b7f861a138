//! What differs between NCCL and RCCL at the loader level, and the two flavours, defined
//! once: the vendor crates load through them and the fake library's tests read them, so a
//! version floor is written in one place.

use std::path::PathBuf;

use unicomm_core::Version;

use crate::sys::search::{env_dirs, python_wheel_dirs};

/// What differs between NCCL and RCCL at the loader level.
#[derive(Debug)]
pub struct Flavor {
    /// "NCCL" or "RCCL".
    pub library: &'static str,
    /// The variable that names the library file explicitly.
    pub env_var: &'static str,
    /// Directories searched in order (each from an environment variable or a fixed path).
    pub dirs: fn() -> Vec<PathBuf>,
    /// File names tried in each directory, then handed to the system loader as sonames.
    pub sonames: &'static [&'static str],
    /// The all-to-all symbol, tried in order.
    pub all_to_all: &'static [&'static str],
    /// First NCCL-API version with `ncclCommRegister` (NCCL 2.19; RCCL of ROCm 6.2 reports
    /// NCCL-API 2.20).
    pub registration_since: Version,
    /// First version with `ncclCommWindowRegister` (NCCL 2.27).
    pub windows_since: Version,
    /// First version with `ncclMemAlloc` (NCCL 2.19).
    pub mem_alloc_since: Version,
    /// First version with `ncclGather`/`ncclScatter` (NCCL 2.28.3; RCCL has had them since
    /// ROCm 3.7).
    pub gather_since: Version,
    /// First version that reduces the 8-bit floats in the OCP encoding the element types
    /// hold (NCCL 2.24.3, on sm90 or newer); `None`: refused (RCCL, whose MI300 encoding is
    /// FNUZ: unicomm does not reinterpret one as the other).
    pub fp8_reduce_since: Option<Version>,
}

/// `ncclCommSplit` exists from NCCL 2.18.
pub const SPLIT_SINCE: Version = Version::new(2, 18, 0);
/// `ncclCommShrink` exists from NCCL 2.27.
pub const SHRINK_SINCE: Version = Version::new(2, 27, 0);
/// `ncclCommRevoke` exists from NCCL 2.28.7.
pub const REVOKE_SINCE: Version = Version::new(2, 28, 7);
/// `ncclCommGrow` and `ncclCommGetUniqueId` exist from NCCL 2.29.2.
pub const GROW_SINCE: Version = Version::new(2, 29, 2);
/// `ncclPutSignal`, `ncclSignal`, `ncclWaitSignal` and `ncclWinGetUserPtr` exist from NCCL
/// 2.29.2 (RCCL 2.30.4 has them too).
pub const ONE_SIDED_SINCE: Version = Version::new(2, 29, 2);
/// `ncclGetPeerDevicePointer` (a window's part on a peer, as this rank's kernels reach it)
/// exists from NCCL 2.29.2 (not in 2.28.9's nccl_device/core.h).
pub const PEER_POINTER_SINCE: Version = Version::new(2, 29, 2);
/// One-sided operations captured in a graph: NCCL 2.30.3's copy-engine path gives graphs
/// signals of their own (a flag the receiver's wait resets and acknowledges, read in its
/// `rma_ce.cc`); 2.29's bakes the host's running count into the graph, so a replay's wait
/// would find it reached and not wait. RCCL 2.30.4 is taken by its number (not checked on
/// an AMD GPU).
pub const ONE_SIDED_CAPTURED_SINCE: Version = Version::new(2, 30, 3);
/// NCCL's device communicator (`ncclDevCommCreate`/`ncclDevCommDestroy`, `ncclTeamWorld`,
/// `ncclTeamLsa`) in the layout unicomm fills (`ncclDevCommRequirements_t` of 2.31.2, which
/// 2.32.3 keeps byte for byte) and its runtime-version mode (`useRuntimeVersion`, with
/// `devCommRuntimeVersionSize`): NCCL 2.31.2 (2.28-2.30 had other requirements layouts).
pub const DEVICE_COMM_SINCE: Version = Version::new(2, 31, 2);
/// `ncclCommQueryProperties` exists from NCCL 2.29.2.
pub const PROPERTIES_SINCE: Version = Version::new(2, 29, 2);
/// `ncclCommSuspend`, `ncclCommResume` and `ncclCommMemStats` exist from NCCL 2.29.7 (not in
/// 2.29.3; in 2.30.3 and later).
pub const SUSPEND_SINCE: Version = Version::new(2, 29, 7);
/// NCCL's parameter API (`ncclParamGetAllParameterKeys`, `ncclParamGetParameter`) exists
/// from NCCL 2.30.4.
pub const PARAMS_SINCE: Version = Version::new(2, 30, 4);
/// The per-collective configuration (`ncclCollConfig_t` and the `nccl*Config` entry
/// points): the layout unicomm fills is 2.32's nccl.h (`ncclCollConfig_v23200`).
pub const CALL_OPTIONS_SINCE: Version = Version::new(2, 32, 0);
/// `ncclCommInitRankScalable` (several roots) exists from NCCL 2.23.
pub const SCALABLE_SINCE: Version = Version::new(2, 23, 0);
/// `ncclCommInitRankConfig` exists from NCCL 2.14.
pub const CONFIG_SINCE: Version = Version::new(2, 14, 0);
/// `ncclSend`/`ncclRecv` exist from NCCL 2.7.
pub const P2P_SINCE: Version = Version::new(2, 7, 0);
/// NCCL's search directories: `NCCL_HOME/lib`, `CUDA_HOME/lib64`, Python wheels
/// (`site-packages/nvidia/nccl/lib`).
pub fn nccl_dirs() -> Vec<PathBuf> {
    let mut v = env_dirs(&[("NCCL_HOME", "lib"), ("CUDA_HOME", "lib64")]);
    v.extend(python_wheel_dirs("nvidia/nccl/lib"));
    v
}

/// ROCm's library directories: `ROCM_PATH/lib`, `HIP_PATH/lib`, `/opt/rocm/lib` (RCCL's and
/// HIP's).
pub fn rocm_dirs() -> Vec<PathBuf> {
    let mut v = env_dirs(&[("ROCM_PATH", "lib"), ("HIP_PATH", "lib")]);
    v.push(PathBuf::from("/opt/rocm/lib"));
    v
}

/// NCCL's loader settings: `UNICOMM_NCCL_LIBRARY`, [`nccl_dirs`], then `libnccl.so.2`,
/// `libnccl.so`; the floors from `src/nccl.h.in` at each tag.
pub static NCCL: Flavor = Flavor {
    library: "NCCL",
    env_var: "UNICOMM_NCCL_LIBRARY",
    dirs: nccl_dirs,
    sonames: &["libnccl.so.2", "libnccl.so"],
    all_to_all: &["ncclAlltoAll"],
    registration_since: Version::new(2, 19, 0),
    windows_since: Version::new(2, 27, 0),
    mem_alloc_since: Version::new(2, 19, 0),
    gather_since: Version::new(2, 28, 3),
    fp8_reduce_since: Some(Version::new(2, 24, 3)),
};

/// RCCL's loader settings: `UNICOMM_RCCL_LIBRARY`, [`rocm_dirs`], then `librccl.so.1`,
/// `librccl.so`.
pub static RCCL: Flavor = Flavor {
    library: "RCCL",
    env_var: "UNICOMM_RCCL_LIBRARY",
    dirs: rocm_dirs,
    sonames: &["librccl.so.1", "librccl.so"],
    all_to_all: &["ncclAllToAll", "ncclAlltoAll"],
    // ROCm 6.2's RCCL reports NCCL API 2.20 and is the first with ncclCommRegister.
    registration_since: Version::new(2, 20, 0),
    windows_since: Version::new(2, 27, 0),
    mem_alloc_since: Version::new(2, 20, 0),
    gather_since: Version::new(2, 0, 0),
    fp8_reduce_since: None,
};
