//! Automatic registration ([`unicomm_core::Collective::register_auto`]) on NCCL/RCCL: the
//! buffer is a symmetric window of this communicator (where it has none, `ncclCommRegister`ed
//! with it) and `ncclCommRegister`ed with a second communicator over the same ranks (`ncclCommSplit`, created at the first automatic
//! registration, collective like it). A call whose buffers are so registered runs where
//! the [`Policy`] says: on this communicator (window kernels), on the second (the
//! registered path), or on the copy engines. Both communicators take the caller's stream,
//! so ordering holds; the cost is the second communicator's device memory (measured by
//! `unicomm-bench --modes auto`, docs/performance.md).

#![allow(
    unsafe_code,
    reason = "calls the NCCL-API library or the device runtime at its call sites (the architecture test's UNSAFE_FILES lists them)"
)]

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use unicomm_core::registry::RegKind;
use unicomm_core::{Error, Extent, Kind, Op, RawHandle, Result, Slice};

use crate::base::Base;
use crate::copy_engine::region::Region;
use crate::copy_engine::CopyEngine;
use crate::libcomm::Child;
use crate::memory::ApiMemory;
use crate::policy::{Path, Policy};
use crate::sys::calls::{RegHandle, Span};
use crate::sys::runtime::Runtime;

/// What the ranks agreed on at their first automatic registration.
#[derive(Debug)]
struct Agreed {
    /// The thresholds every rank uses.
    policy: Policy,
    /// Whether automatic registrations are shared for the copy engines (every rank wants
    /// it and can).
    copy_engine: bool,
}

/// The second communicator of a rank, over the same ranks (a child of the first: ended
/// with it).
#[derive(Debug)]
struct Second {
    comm: Child,
    /// Automatic handle -> this communicator's `ncclCommRegister` handle.
    regs: Mutex<HashMap<RawHandle, usize>>,
}

// SAFETY: like `LibComm`: the communicator is used only under the first communicator's
// lock (every use goes through its `call`).
unsafe impl Send for Second {}
// SAFETY: as above.
unsafe impl Sync for Second {}

/// A communicator's automatic registrations.
#[derive(Debug, Default)]
pub(crate) struct Auto {
    /// The policy this rank proposes (`set_auto_policy`; else the process's).
    wanted: Mutex<Option<Policy>>,
    agreed: OnceLock<Agreed>,
    second: Mutex<Option<Arc<Second>>>,
    /// Live automatic registrations (so calls without any skip the policy's lookups).
    live: AtomicU32,
    /// Those registered with `ncclCommRegister` where the communicator has no symmetric
    /// window (deregistered as buffers).
    windowless: Mutex<std::collections::HashSet<RawHandle>>,
}

/// `UNICOMM_AUTO_COPY_ENGINE` (`1`, the default, or `0`): whether automatic registrations
/// are shared for the copy-engine path (in a local world: peer access between the devices;
/// one rank per process: the allocation exported to the peers and theirs mapped here). With
/// `0` the policy's copy-engine choices take the registered path.
fn auto_copy_engine() -> Result<bool> {
    unicomm_core::env::switch("UNICOMM_AUTO_COPY_ENGINE", true)
}

use crate::split::SPLIT_SINCE;

impl Auto {
    /// The second communicator, created at the first call (collective: `ncclCommSplit`)
    /// and adopted by the first as its child.
    fn second<R: Runtime>(&self, b: &Base<R>) -> Result<Arc<Second>> {
        if let Some(s) = &*self.second.lock().unwrap_or_else(|e| e.into_inner()) {
            return Ok(s.clone());
        }
        let lc = &b.lc;
        lc.api.require(
            "automatic registration (a second communicator by ncclCommSplit)",
            SPLIT_SINCE,
            lc.api.fns.comm_split.is_some(),
        )?;
        b.not_in_group("creating the second communicator of automatic registration")?;
        let made = crate::split::split_raw(lc, 0, lc.rank as c_int, None)?
            .ok_or_else(|| Error::invalid("comm", "ncclCommSplit gave no communicator"))?;
        let mut slot = self.second.lock().unwrap_or_else(|e| e.into_inner());
        // Registrations are collective and ordered, so two threads of one rank do not
        // create it at once; if they did, the first one kept stays (the other leaks until
        // the process ends rather than being freed while a peer may still use it).
        if let Some(s) = &*slot {
            return Ok(s.clone());
        }
        // SAFETY: split with one color and this rank as its key: this communicator's ranks
        // in its order.
        let comm = unsafe { lc.adopt_child(made) }?;
        let s = Arc::new(Second {
            comm,
            regs: Mutex::new(HashMap::new()),
        });
        *slot = Some(s.clone());
        Ok(s)
    }

    /// `set_auto_policy`: before the first automatic registration, where the ranks agree
    /// on the policy; afterwards `InvalidArgument`.
    pub(crate) fn set_policy(&self, policy: Policy) -> Result<()> {
        let mut wanted = self.wanted.lock().unwrap_or_else(|e| e.into_inner());
        if self.agreed.get().is_some() {
            return Err(Error::invalid(
                "policy",
                "the ranks agreed on the automatic policy at the first automatic registration; set it before that",
            ));
        }
        *wanted = Some(policy);
        Ok(())
    }

    /// The policy the ranks agreed on, once an automatic registration has been made.
    pub(crate) fn policy(&self) -> Option<&Policy> {
        self.agreed.get().map(|a| &a.policy)
    }

    /// The ranks agree on the automatic policy and on whether automatic registrations are
    /// shared for the copy engines (collective, once, at the first automatic registration).
    /// A call runs on the path the policy picks, so ranks whose policies differ (tune files
    /// written on different machines, `set_auto_policy` on some ranks) would take different
    /// communicators or the copy engines for the same call and wait for each other until
    /// the deadline; ranks that differ on `UNICOMM_AUTO_COPY_ENGINE` would not all enter the
    /// (collective) sharing of each registration. Every rank offers its policy's digest (one
    /// whose policy or variable did not load offers "none") and its copy-engine wish: a
    /// different policy fails the registration on every rank; the copy engines are used
    /// where every rank wants them.
    fn agree<R: Runtime>(&self, b: &Base<R>, ce: &CopyEngine<R>) -> Result<()> {
        if self.agreed.get().is_some() {
            return Ok(());
        }
        // Held until the policy is set, so a `set_auto_policy` meanwhile waits and is refused
        // rather than accepted and ignored.
        let wanted = self.wanted.lock().unwrap_or_else(|e| e.into_inner());
        let mine = match &*wanted {
            Some(p) => Ok(p.clone()),
            None => Policy::current().cloned(),
        };
        let ce_wanted = auto_copy_engine();
        // In a world of one there is nobody to differ from.
        let (mut same, mut ce_everywhere) = (true, true);
        let mut digest = 0;
        if b.lc.world > 1 {
            b.not_in_group("agreeing on the automatic policy")?;
            digest = match (&mine, &ce_wanted) {
                (Ok(p), Ok(_)) => p.digest(),
                _ => u64::MAX,
            };
            let wish = ce.reachable() && matches!(ce_wanted, Ok(true));
            // Max of [d, !d, !wish] is [max d, !min d, !(every rank wishes)].
            let all = b.all_max(&[digest, !digest, u64::from(!wish)])?;
            same = all[0] == digest && !all[1] == digest;
            ce_everywhere = all[2] == 0;
        }
        // This rank's own error first; its peers see "none" and fail with the mismatch.
        let (mine, ce_wanted) = (mine?, ce_wanted?);
        if !same {
            return Err(Error::invalid(
                "policy",
                format!(
                    "rank {}'s automatic policy (UNICOMM_TUNE_FILE or set_auto_policy, digest {digest:016x}) differs from another rank's, or another rank could not load its own (UNICOMM_TUNE_FILE, UNICOMM_AUTO_COPY_ENGINE; that rank's error says why); every rank must use the same thresholds (one tune file for the job)",
                    b.lc.rank
                ),
            ));
        }
        let _ = self.agreed.set(Agreed {
            policy: mine,
            copy_engine: ce_wanted && ce_everywhere,
        });
        drop(wanted);
        Ok(())
    }

    /// `register_auto`: a window here, shared for the copy engines where the ranks agreed
    /// on it, and `ncclCommRegister` on the second communicator.
    pub(crate) fn register<R: Runtime>(
        &self,
        b: &Base<R>,
        ce: &CopyEngine<R>,
        mem: &ApiMemory<R>,
        offset: usize,
        bytes: usize,
    ) -> Result<RawHandle> {
        let lc = &b.lc;
        lc.api.require(
            "automatic registration (ncclCommRegister)",
            lc.api.flavor.registration_since,
            lc.api.fns.comm_register.is_some(),
        )?;
        self.agree(b, ce)?;
        let (h, windowed) = match b.window_register(mem, (offset, bytes), RegKind::Auto) {
            Ok(h) => (h, true),
            // No symmetric window on this communicator (NCCL's NULL window, on every rank
            // alike: NCCL 2.32.3 gives none to ranks it sees on separate hosts; or a library
            // without windows): the buffer registered with this communicator instead, where
            // the window path then runs NCCL's registered kernels and the copy engines,
            // which need a window, give way to the registered path.
            Err(Error::Unsupported { .. }) => {
                let h = b.buffer_register_as(mem, (offset, bytes), RegKind::Auto)?;
                self.windowless
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(h);
                (h, false)
            }
            Err(e) => return Err(e),
        };
        let undo = |e: Error| {
            let _ = self.deregister(b, ce, h);
            e
        };
        let addr = mem.range(offset, bytes, "bytes")?;
        let shared = self.agreed.get().is_some_and(|a| a.copy_engine);
        if ce.reachable() && shared && windowed {
            ce.share_window(b, h, Region { addr, bytes })
                .map_err(undo)?;
        }
        let second = self.second(b).map_err(undo)?;
        if bytes > 0 {
            let buf = Slice { mem, offset, bytes };
            let handle = lc
                .call_lent(|l| {
                    let h = lc
                        .api
                        .comm_register(l.child(second.comm)?.handle(), Span::of(&buf)?)?;
                    // Non-blocking: the handle is written when the call is done.
                    l.settle("ncclCommRegister")?;
                    Ok(h.into_raw())
                })
                .map_err(undo)?;
            let mut regs = second.regs.lock().unwrap_or_else(|e| e.into_inner());
            regs.insert(h, handle);
        }
        self.live.fetch_add(1, Ordering::Relaxed);
        Ok(h)
    }

    /// Ends an automatic registration: the second communicator's registration, then the
    /// window (one step for concurrent callers, like every deregistration).
    pub(crate) fn deregister<R: Runtime>(
        &self,
        b: &Base<R>,
        ce: &CopyEngine<R>,
        h: RawHandle,
    ) -> Result<()> {
        let lc = &b.lc;
        b.registry.release(h, RegKind::Auto, || {
            let second = self
                .second
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(second) = second {
                let taken = second
                    .regs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&h);
                if let Some(rh) = taken {
                    lc.call_lent(|l| {
                        let on = l.child(second.comm)?;
                        // SAFETY: a registration of the second communicator, taken out of
                        // its table above, so deregistered once.
                        let rh = unsafe { RegHandle::from_raw(rh) };
                        lc.api.comm_deregister(on.handle(), rh)
                    })?;
                }
            }
            let windowless = self
                .windowless
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&h);
            match windowless {
                true => b.deregister_raw(h, RegKind::Buffer),
                false => b.deregister_raw(h, RegKind::Auto),
            }
        })?;
        self.live.fetch_sub(1, Ordering::Relaxed);
        ce.forget_window(h);
        Ok(())
    }

    /// Whether no automatic registration is live (the policy has nothing to choose).
    #[inline]
    pub(crate) fn idle(&self) -> bool {
        self.live.load(Ordering::Relaxed) == 0
    }

    /// For a call whose every buffer is registered for the automatic policy: the path the
    /// policy picks for its collective and size (nccl-tests' size), else `None`.
    #[inline]
    pub(crate) fn path<R: Runtime>(
        &self,
        b: &Base<R>,
        op: &Op<'_, ApiMemory<R>>,
    ) -> Result<Option<Path>> {
        // Every collective passes here: without a live automatic registration (the common
        // case) no lock is taken.
        if self.idle() || !op.kind.is_collective() || matches!(op.kind, Kind::Barrier) {
            return Ok(None);
        }
        self.path_of(b, op)
    }

    /// The lookup itself, out of line: only calls while automatic registrations are live.
    #[inline(never)]
    fn path_of<R: Runtime>(&self, b: &Base<R>, op: &Op<'_, ApiMemory<R>>) -> Result<Option<Path>> {
        let world = b.lc.world;
        let (se, re) = op.kind.extents();
        let esize = op.dtype.size();
        let range = |side: Option<Slice<'_, ApiMemory<R>>>, e: Extent| {
            side.map_or((0, 0), |s| {
                (s.address(), e.elems(op.count, world).unwrap_or(0) * esize)
            })
        };
        // Both buffers under one lock: a lookup an engine's every call makes.
        let ranges = [range(op.send, se), range(op.recv, re)];
        if !b.registry.all_covered_by(RegKind::Auto, &ranges)? {
            return Ok(None);
        }
        let per_rank = matches!(
            op.kind,
            Kind::AllGather | Kind::AllToAll | Kind::ReduceScatter { .. }
        );
        let size = op.count * esize * if per_rank { world } else { 1 };
        // A live automatic registration agreed on a policy first.
        Ok(self.agreed.get().map(|a| a.policy.choose(op.kind, size)))
    }

    /// The second communicator's handle, for a call the policy sends there.
    pub(crate) fn second_comm(&self) -> Option<Child> {
        let second = self.second.lock().unwrap_or_else(|e| e.into_inner());
        second.as_ref().map(|s| s.comm)
    }
}
