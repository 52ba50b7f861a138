//! NCCL's device API on an NCCL-API communicator: device communicators
//! (`ncclDevCommCreate` in the layout asked for, kept until their end) and unicomm's own
//! kernel written against it (`backend-nccl/kernels/device_api.cu`: the one-shot all-reduce
//! over the LSA pointers of two windows, between NCCL's LSA barriers), launched with the
//! stream watched, so a peer that never comes ends at the deadline by the communicator's
//! abort (NCCL's barriers watch its abort flag).

#![allow(
    unsafe_code,
    reason = "launches unicomm's device-API kernel on NCCL's windows through the runtime (the architecture test's UNSAFE_FILES lists it)"
)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use unicomm_core::device_api::{
    check_device_kernel, check_requirements, DeviceCommLayout, DeviceCommParts,
    DeviceCommRequirements, DeviceKernelOp,
};
use unicomm_core::registry::RawHandle;
use unicomm_core::{Error, Result, Version};

use crate::base::Base;
use crate::memory::ApiStream;
use crate::sys::calls::OwnedDevComm;
use crate::sys::device_api::{RawDevCommRequirements, REQUIREMENTS_LAYOUT};
use crate::sys::kernel_args::{
    DeviceKernelArgs, DEVICE_KERNEL_DEV_COMM_BYTES, DEVICE_KERNEL_HEADERS, DEVICE_KERNEL_MAX_BLOCKS,
};
use crate::sys::runtime::Runtime;

/// One device communicator as this rank holds it.
#[derive(Debug)]
struct Record {
    owned: OwnedDevComm,
    /// What a kernel takes by value.
    bytes: Vec<u8>,
    /// The layout's release.
    version: Version,
    lsa_barriers: u32,
    /// Whether every rank is in this rank's LSA team (the kernel reduces over it).
    lsa_is_world: bool,
}

/// A communicator's device communicators.
#[derive(Default)]
pub(crate) struct DeviceComms {
    next: AtomicUsize,
    live: Mutex<HashMap<RawHandle, Record>>,
}

/// The layout's release and size: the runtime layout's from the library, a built one's as
/// named (NCCL fills a layout no newer than itself; unicomm fills requirements from 2.31.2's
/// layout on).
fn layout_of<R: Runtime>(
    base: &Base<R>,
    reqs: &DeviceCommRequirements,
) -> Result<(Version, usize)> {
    let api = &base.lc.api;
    match reqs.layout {
        DeviceCommLayout::Runtime => {
            let size = base.lc.call(|c| api.dev_comm_runtime_size(c.handle()))?;
            Ok((api.version, size))
        }
        DeviceCommLayout::Built { version, size } => {
            if version < REQUIREMENTS_LAYOUT {
                return Err(Error::unsupported(
                    "a device communicator in an older release's layout",
                    format!("device code built against NCCL >= {REQUIREMENTS_LAYOUT}'s headers"),
                    format!("headers of {version}"),
                ));
            }
            api.require(
                &format!("a device communicator for code built against NCCL {version}'s headers"),
                version,
                api.fns.dev_comm_create.is_some(),
            )?;
            Ok((version, size))
        }
    }
}

impl DeviceComms {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<RawHandle, Record>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `create_device_comm` (collective): the layout's size, `ncclDevCommCreate` (a blocking
    /// communicator's on a helper thread under the deadline: it waits for the peers), the
    /// teams.
    pub(crate) fn create<R: Runtime>(
        &self,
        base: &Base<R>,
        reqs: &DeviceCommRequirements,
    ) -> Result<DeviceCommParts> {
        check_requirements(reqs)?;
        base.not_in_group("a device communicator (ncclDevCommCreate)")?;
        let lc = &base.lc;
        lc.not_suspended()?;
        let (version, size) = layout_of(base, reqs)?;
        // NCCL refuses a communicator without symmetric memory support with a bare
        // "invalid usage": its properties say so first, as a typed refusal.
        let props = lc.call(|c| lc.api.comm_query_properties(c.handle()))?;
        if !props.device_api {
            return Err(Error::unsupported(
                "a device communicator",
                "a communicator with symmetric memory support (NCCL's deviceApiSupport: cuMem, P2P or NVLink between every rank)",
                format!("{} {} reports none for this communicator", lc.api.flavor.library, lc.api.version),
            ));
        }
        let (reqs_c, library) = (*reqs, lc.api.version);
        let owned = lc.call_lent(|l| {
            if lc.nonblocking {
                let raw = RawDevCommRequirements::new(&reqs_c, library);
                let dc = lc.api.dev_comm_create(l.comm()?.handle(), &raw, size)?;
                // Non-blocking: the struct is written when the call is done.
                l.settle("ncclDevCommCreate")?;
                return Ok(dc);
            }
            let api = lc.api.clone();
            l.bounded(
                "ncclDevCommCreate",
                move |h| {
                    let raw = RawDevCommRequirements::new(&reqs_c, library);
                    api.dev_comm_create(h, &raw, size)
                },
                |_| {},
            )?
        })?;
        let (world, lsa) = lc.call(|c| lc.api.teams(c.handle()))?;
        let bytes = owned.bytes();
        let handle = RawHandle(self.next.fetch_add(1, Ordering::Relaxed) + 1);
        let record = Record {
            owned,
            bytes: bytes.clone(),
            version,
            lsa_barriers: reqs.lsa_barriers,
            lsa_is_world: lsa.ranks == lc.world,
        };
        self.table().insert(handle, record);
        Ok(DeviceCommParts {
            handle,
            bytes,
            version,
            world,
            lsa,
        })
    }

    /// `destroy_device_comm`: taken out of the table; the device's work waited for (within
    /// the deadline: NCCL unmaps the resource window's peers' memory at once, read in its
    /// `symWindowDestroy`, and a kernel still running may be using it), then
    /// `ncclDevCommDestroy` (a blocking communicator's under the deadline).
    pub(crate) fn destroy<R: Runtime>(&self, base: &Base<R>, handle: RawHandle) -> Result<()> {
        let rec = self
            .table()
            .remove(&handle)
            .ok_or_else(|| unknown(handle))?;
        let lc = &base.lc;
        let (rt, dev) = (lc.rt.clone(), lc.dev);
        let what = "the device's work before ncclDevCommDestroy";
        crate::wait::bounded(
            what,
            lc.timeout(),
            move || rt.synchronize_device(dev),
            |_| {},
        )??;
        lc.call_lent(|l| {
            if lc.nonblocking {
                lc.api.dev_comm_destroy(l.comm()?.handle(), rec.owned)?;
                return l.settle("ncclDevCommDestroy");
            }
            let api = lc.api.clone();
            let owned = rec.owned;
            l.bounded(
                "ncclDevCommDestroy",
                move |h| api.dev_comm_destroy(h, owned),
                |_| {},
            )?
        })
    }

    /// unicomm's device-API kernel on `stream`: the device communicator of the kernel's
    /// layout, both windows this communicator's and holding the count, every rank in one
    /// LSA team; one block per LSA barrier (at most 32).
    pub(crate) fn launch<R: Runtime>(
        &self,
        base: &Base<R>,
        control: usize,
        op: DeviceKernelOp,
        stream: &ApiStream<R>,
    ) -> Result<()> {
        let lc = &base.lc;
        base.ready_for_kernel(stream)?;
        check_device_kernel(op.dtype, op.op)?;
        if op.count == 0 {
            return Ok(()); // every rank's count is the same: none launches
        }
        let table = self.table();
        let rec = table
            .get(&op.device_comm)
            .ok_or_else(|| unknown(op.device_comm))?;
        kernel_takes(rec)?;
        let bytes = op
            .count
            .checked_mul(op.dtype.size())
            .ok_or_else(|| Error::invalid("count", format!("{} elements overflow", op.count)))?;
        base.with_window(op.send, |_, size| holds("send", size, bytes))?;
        base.with_window(op.recv, |_, size| holds("recv", size, bytes))?;
        let args = DeviceKernelArgs {
            send: op.send.0 as u64,
            send_off: 0,
            recv: op.recv.0 as u64,
            recv_off: 0,
            count: op.count as u64,
            control: control as u64,
            timeout_ns: u64::try_from(lc.timeout().as_nanos()).unwrap_or(u64::MAX),
            op: crate::sys::kernel_args::op_code(op.op),
            rank: lc.rank as u32,
        };
        let blocks = rec.lsa_barriers.min(DEVICE_KERNEL_MAX_BLOCKS);
        stream.watched_by(lc);
        // SAFETY: `rec.bytes` is a live device communicator's struct of the kernel's layout
        // (checked above) with `lsa_barriers` >= `blocks`; both windows are live windows of
        // this communicator holding `count` elements (checked above). A window's
        // deregistration is collective and ordered after this rank's stream work by
        // NCCL; the device communicator's end deregisters its resources likewise.
        unsafe {
            let launch = crate::sys::kernel_args::Launch::DeviceApi {
                dev_comm: &rec.bytes,
                args: &args,
                blocks,
            };
            lc.rt.launch(lc.dev, op.dtype, launch, stream.inner())
        }
    }
}

/// What unicomm's kernel needs of a device communicator: the layout of the headers it was
/// built against (asked for by name, or the runtime layout of exactly that release), and
/// every rank in one LSA team.
fn kernel_takes(rec: &Record) -> Result<()> {
    if rec.version != DEVICE_KERNEL_HEADERS || rec.bytes.len() < DEVICE_KERNEL_DEV_COMM_BYTES {
        return Err(Error::unsupported(
            "unicomm's device-API kernel",
            format!(
                "a device communicator in NCCL {DEVICE_KERNEL_HEADERS}'s layout \
                 (DeviceCommLayout::Built {{ version: {DEVICE_KERNEL_HEADERS}, size: {DEVICE_KERNEL_DEV_COMM_BYTES} }}, \
                 on NCCL >= {DEVICE_KERNEL_HEADERS})"
            ),
            format!("one in {}'s layout ({} bytes)", rec.version, rec.bytes.len()),
        ));
    }
    if !rec.lsa_is_world {
        return Err(Error::unsupported(
            "unicomm's device-API kernel",
            "every rank in one LSA team (one NVLink domain)",
            "ranks in several LSA teams",
        ));
    }
    Ok(())
}

fn holds(what: &'static str, size: usize, bytes: usize) -> Result<()> {
    if bytes > size {
        return Err(Error::invalid(
            what,
            format!("a window of {size} bytes cannot hold {bytes}"),
        ));
    }
    Ok(())
}

fn unknown(handle: RawHandle) -> Error {
    Error::invalid(
        "handle",
        format!("{handle:?} is not a live device communicator of this communicator"),
    )
}
