//! A library's device API as backends see it (NCCL's `ncclDevComm`, 2.28+): what a device
//! communicator is asked for ([`DeviceCommRequirements`]), what its creation returns
//! ([`DeviceCommParts`]: the bytes an engine's kernel takes by value, the teams), and the
//! operation of unicomm's own kernel written against it ([`DeviceKernelOp`]). Typed in
//! [`crate::comm::device_api`].

use crate::element::{DataType, ReduceOp};
use crate::info::Version;
use crate::registry::RawHandle;
use crate::{Error, Result};

/// Which layout of the device communicator the device code that takes it was built
/// against: the library fills the struct in that layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceCommLayout {
    /// The loaded library's own layout (NCCL's runtime-version mode, NCCL >= 2.31.2): for
    /// device code compiled against the loaded library's headers at run time (a JIT, or an
    /// engine's nvcc against the same release). Its size is the library's
    /// (`devCommRuntimeVersionSize`), so a binding loaded at run time never depends on the
    /// struct's size at its own build.
    Runtime,
    /// The layout of the headers of `version` (device code built ahead of time against
    /// them), `size` bytes (`sizeof(ncclDevComm)` there). The library must be at least
    /// `version`: NCCL refuses device code newer than itself, and fills older layouts.
    Built {
        /// The release whose headers the device code was built against.
        version: Version,
        /// `sizeof(ncclDevComm)` in those headers.
        size: usize,
    },
}

/// What a device communicator is created with (`ncclDevCommRequirements_t`'s fields that
/// unicomm sets; the others keep NCCL's initializer's values: no GIN, no LL all-to-all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCommRequirements {
    /// The layout the kernels that take it were built against.
    pub layout: DeviceCommLayout,
    /// LSA barriers (`lsaBarrierCount`): one per block that synchronizes with its peers
    /// (an `ncclLsaBarrierSession`'s index is below it).
    pub lsa_barriers: u32,
    /// Whether the LSA team gets a multimem (NVLink SHARP) handle (`lsaMultimem`); only
    /// where [`Properties::multimem`](crate::Properties::multimem) says the communicator has
    /// it.
    pub lsa_multimem: bool,
}

impl DeviceCommRequirements {
    /// `lsa_barriers` barriers in the loaded library's own layout, no multimem.
    pub fn runtime(lsa_barriers: u32) -> Self {
        DeviceCommRequirements {
            layout: DeviceCommLayout::Runtime,
            lsa_barriers,
            lsa_multimem: false,
        }
    }
}

/// A team of ranks as the device API sees it (`ncclTeam_t`): its size, this rank's index in
/// it, and the stride between its members' world ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Team {
    /// The number of ranks in the team.
    pub ranks: usize,
    /// This rank's index in the team.
    pub rank: usize,
    /// The distance between consecutive members' world ranks.
    pub stride: usize,
}

/// A device communicator as a backend made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceCommParts {
    /// The backend's handle (its destruction names it).
    pub handle: RawHandle,
    /// The struct as the library filled it: an engine's kernel takes these bytes by value.
    pub bytes: Vec<u8>,
    /// The layout version the bytes follow.
    pub version: Version,
    /// The world team.
    pub world: Team,
    /// The team of ranks that reach each other's memory by loads and stores (NVLink).
    pub lsa: Team,
}

/// One operation of unicomm's kernel written against the device API (an all-reduce of
/// `count` elements from the window `send` into the window `recv`, both this
/// communicator's, over the device communicator `device_comm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceKernelOp {
    /// The device communicator the kernel takes.
    pub device_comm: RawHandle,
    /// The window read on every rank.
    pub send: RawHandle,
    /// The window written on this rank.
    pub recv: RawHandle,
    /// Elements.
    pub count: usize,
    /// Their type.
    pub dtype: DataType,
    /// The reduction.
    pub op: ReduceOp,
}

/// What a device communicator needs, as refusals name it.
pub(crate) const DEVICE_API_NEEDS: &str =
    "NCCL's device API (ncclDevCommCreate: NCCL >= 2.31.2 in its runtime-version mode)";

/// The types and reductions of unicomm's device-API kernel (as its symmetric kernels').
pub fn check_device_kernel(dtype: DataType, op: ReduceOp) -> Result<()> {
    crate::symmetric::check_symmetric_type(dtype)?;
    crate::symmetric::check_symmetric_op(op)
}

/// The refusal of a device communicator's requirements that no library takes.
pub fn check_requirements(reqs: &DeviceCommRequirements) -> Result<()> {
    if reqs.lsa_barriers == 0 {
        return Err(Error::invalid(
            "lsa_barriers",
            "a device communicator needs at least one LSA barrier (one per block that synchronizes)",
        ));
    }
    if let DeviceCommLayout::Built { size, .. } = reqs.layout {
        if size == 0 || size > MAX_DEV_COMM_BYTES {
            return Err(Error::invalid(
                "size",
                format!("a built layout's size is its headers' sizeof(ncclDevComm), from 1 to {MAX_DEV_COMM_BYTES} bytes (248 at NCCL 2.32.3), not {size}"),
            ));
        }
    }
    Ok(())
}

/// The largest `sizeof(ncclDevComm)` a built layout may claim: a device communicator is a
/// kernel argument of a few hundred bytes (248 at NCCL 2.32.3), and CUDA takes at most
/// 32,764 bytes of a launch's parameters; a page is more than any release needs, and a size
/// past it is refused at once instead of being allocated and handed to the library.
pub const MAX_DEV_COMM_BYTES: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    /// A size no release can have (1 TiB, usize::MAX) is refused before any allocation:
    /// it once aborted the process or panicked the library's helper thread.
    #[test]
    fn a_built_size_no_release_has_is_refused_at_once() {
        let reqs = |size| DeviceCommRequirements {
            layout: DeviceCommLayout::Built {
                version: crate::Version::new(2, 32, 3),
                size,
            },
            lsa_barriers: 1,
            lsa_multimem: false,
        };
        for size in [0, MAX_DEV_COMM_BYTES + 1, 1 << 40, usize::MAX] {
            assert!(
                matches!(
                    check_requirements(&reqs(size)),
                    Err(Error::InvalidArgument { .. })
                ),
                "{size}"
            );
        }
        assert!(check_requirements(&reqs(248)).is_ok());
    }
}
