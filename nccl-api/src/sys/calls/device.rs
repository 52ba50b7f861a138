//! The calls of NCCL's device API on the host (NCCL >= 2.31.2 in the layout unicomm fills):
//! a device communicator's creation and end, the world and LSA teams, and the size of the
//! runtime layout (`devCommRuntimeVersionSize` of `ncclCommQueryProperties`).

use std::ffi::c_void;

use unicomm_core::device_api::Team;
use unicomm_core::{Error, Result};

use super::gates::{DEVICE_COMM_SINCE, PROPERTIES_SINCE};
use super::handles::Handle;
use crate::sys::api::Api;
use crate::sys::config::RawProperties;
use crate::sys::device_api::{code, RawDevCommRequirements};
use crate::sys::target::PROPERTIES_TITLE;

/// What the refusals name.
const DEVICE_COMM_TITLE: &str = "a device communicator (ncclDevCommCreate)";

/// A device communicator's struct as the library filled it, owned: only
/// [`Api::dev_comm_create`] makes one, [`Api::dev_comm_destroy`] consumes it, so the library
/// is never handed bytes it did not write.
#[derive(Debug)]
pub struct OwnedDevComm {
    /// 8-byte words (the struct's alignment), at a fixed heap address (a non-blocking
    /// communicator writes them when the call settles).
    words: Box<[u64]>,
    bytes: usize,
}

impl OwnedDevComm {
    /// The struct's bytes (what a kernel takes by value).
    pub fn bytes(&self) -> Vec<u8> {
        self.words
            .iter()
            .flat_map(|w| w.to_ne_bytes())
            .take(self.bytes)
            .collect()
    }
}

impl Api {
    /// `ncclDevCommCreate` into `bytes` of zeroed memory (the size of the layout `reqs`
    /// names), settled by the caller for a non-blocking communicator before the struct is
    /// read. NCCL >= 2.31.2.
    pub fn dev_comm_create(
        &self,
        comm: Handle<'_>,
        reqs: &RawDevCommRequirements,
        bytes: usize,
    ) -> Result<OwnedDevComm> {
        let f = self.gated(
            DEVICE_COMM_TITLE,
            DEVICE_COMM_SINCE,
            self.fns.dev_comm_create,
        )?;
        self.gated(
            DEVICE_COMM_TITLE,
            DEVICE_COMM_SINCE,
            self.fns.dev_comm_destroy,
        )?;
        if bytes < 16 {
            return Err(Error::invalid(
                "size",
                format!("{bytes} bytes cannot hold a device communicator (its header alone is 16)"),
            ));
        }
        let mut out = OwnedDevComm {
            words: vec![0u64; bytes.div_ceil(8)].into_boxed_slice(),
            bytes,
        };
        let at = out.words.as_mut_ptr().cast::<c_void>();
        // SAFETY: a live communicator; `reqs` is NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER's
        // layout for the version it tells (its size, magic, no requirement lists) and lives
        // across the call; `at` holds `bytes` (at least the layout's size, rounded up to 8)
        // writable bytes that stay at their address until `out` is dropped.
        let code = unsafe { f(comm.raw, (reqs as *const RawDevCommRequirements).cast(), at) };
        self.done("ncclDevCommCreate", code, Some(comm.raw))?;
        Ok(out)
    }

    /// `ncclDevCommDestroy`: deregisters the library's resource window (collective).
    pub fn dev_comm_destroy(&self, comm: Handle<'_>, dc: OwnedDevComm) -> Result<()> {
        let f = self.gated(
            DEVICE_COMM_TITLE,
            DEVICE_COMM_SINCE,
            self.fns.dev_comm_destroy,
        )?;
        // SAFETY: a live communicator and a struct its `ncclDevCommCreate` filled (the only
        // maker of an OwnedDevComm), destroyed once (consumed).
        let code = unsafe { f(comm.raw, dc.words.as_ptr().cast()) };
        self.done("ncclDevCommDestroy", code, Some(comm.raw))
    }

    /// `ncclTeamWorld` and `ncclTeamLsa` (NCCL >= 2.31.2 here, the device API's release).
    pub fn teams(&self, comm: Handle<'_>) -> Result<(Team, Team)> {
        let w = self.gated(DEVICE_COMM_TITLE, DEVICE_COMM_SINCE, self.fns.team_world)?;
        let l = self.gated(DEVICE_COMM_TITLE, DEVICE_COMM_SINCE, self.fns.team_lsa)?;
        // SAFETY: a live communicator; both return a struct of three ints by value.
        let (world, lsa) = unsafe { (w(comm.raw), l(comm.raw)) };
        Ok((world.team(), lsa.team()))
    }

    /// `devCommRuntimeVersionSize` (`ncclCommQueryProperties`): the bytes of the runtime
    /// layout's struct. NCCL >= 2.31.2.
    pub fn dev_comm_runtime_size(&self, comm: Handle<'_>) -> Result<usize> {
        self.gated(
            DEVICE_COMM_TITLE,
            DEVICE_COMM_SINCE,
            self.fns.dev_comm_create,
        )?;
        let f = self.gated(
            PROPERTIES_TITLE,
            PROPERTIES_SINCE,
            self.fns.comm_query_properties,
        )?;
        let mut p = RawProperties::new(code(self.version));
        // SAFETY: a live communicator; `p` is initialised as NCCL_COMM_PROPERTIES_INITIALIZER
        // (its size, magic and a version no newer than the library's) and lives across the call.
        let r = unsafe { f(comm.raw, (&mut p as *mut RawProperties).cast()) };
        self.check("ncclCommQueryProperties", r, Some(comm.raw))?;
        p.runtime_dev_comm_size().ok_or_else(|| {
            Error::unsupported(
                "a device communicator in the runtime layout",
                "devCommRuntimeVersionSize (NCCL >= 2.31.2)",
                format!("{} {} reported none", self.flavor.library, self.version),
            )
        })
    }
}
