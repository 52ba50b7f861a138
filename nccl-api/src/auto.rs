//! Automatic registration ([`unicomm_core::Collective::register_auto`]) on NCCL/RCCL: the
//! buffer is a symmetric window of this communicator and `ncclCommRegister`ed with a second
//! communicator over the same ranks (`ncclCommSplit`, created at the first automatic
//! registration, collective like it). A call whose buffers are so registered runs where
//! the [`Policy`] says: on this communicator (window kernels), on the second (the
//! registered path), or on the copy engines. Both communicators take the caller's stream,
//! so ordering holds; the cost is the second communicator's device memory (measured by
//! `unicomm-bench --modes auto`, docs/benchmarks.md).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use unicomm_core::registry::RegKind;
use unicomm_core::{Error, Extent, Kind, Op, RawHandle, Result, Slice, Version};

use crate::api::NcclComm;
use crate::comm::ApiComm;
use crate::memory::ApiMemory;
use crate::policy::{Path, Policy};
use crate::runtime::Runtime;
use crate::watchdog::{settle_raw, SendComm};

/// What the ranks agreed on at their first automatic registration.
#[derive(Debug)]
pub(crate) struct Agreed {
    /// The thresholds every rank uses.
    pub(crate) policy: Policy,
    /// Whether automatic registrations are shared for the copy engines (every rank wants
    /// it and can).
    pub(crate) copy_engine: bool,
}

/// Where a call goes.
pub(crate) enum Route {
    /// The copy engines, by this plan.
    CopyEngine(crate::copy_engine::Plan),
    /// The library, on the second communicator (`Some`) or on this one.
    Library(Option<NcclComm>),
}

/// The second communicator of a rank, over the same ranks.
#[derive(Debug)]
pub(crate) struct Shadow {
    pub(crate) comm: NcclComm,
    /// Automatic handle -> this communicator's `ncclCommRegister` handle.
    pub(crate) regs: Mutex<HashMap<RawHandle, usize>>,
}

// SAFETY: like `ApiComm`: the communicator is used only under the owning `ApiComm`'s lock.
unsafe impl Send for Shadow {}
// SAFETY: as above.
unsafe impl Sync for Shadow {}

/// `UNICOMM_AUTO_COPY_ENGINE` (`1`, the default, or `0`): whether automatic registrations
/// are shared for the copy-engine path (in a local world: peer access between the devices;
/// one rank per process: the allocation exported to the peers and theirs mapped here). With
/// `0` the policy's copy-engine choices take the registered path.
fn auto_copy_engine() -> Result<bool> {
    unicomm_core::env::switch("UNICOMM_AUTO_COPY_ENGINE", true)
}

/// `ncclCommSplit` exists from NCCL 2.18.
const SPLIT_SINCE: Version = Version::new(2, 18, 0);

impl<R: Runtime> ApiComm<R> {
    /// The second communicator, created at the first call (collective: `ncclCommSplit`).
    fn shadow(&self) -> Result<Arc<Shadow>> {
        if let Some(s) = &*self.core.shadow.lock().unwrap_or_else(|e| e.into_inner()) {
            return Ok(s.clone());
        }
        let split = self.api.gated(
            "automatic registration (a second communicator by ncclCommSplit)",
            SPLIT_SINCE,
            self.api.fns.comm_split,
        )?;
        self.not_in_group("creating the second communicator of automatic registration")?;
        let rank = self.rank as c_int;
        let comm = self.call(|c| {
            let mut out: NcclComm = std::ptr::null_mut();
            let code = if self.core.nonblocking {
                // SAFETY: a live communicator; `out` receives the new one (written when the
                // call settles, below); NULL config means the parent's settings (nccl.h),
                // non-blocking mode included.
                unsafe { split(c, 0, rank, &mut out, std::ptr::null_mut()) }
            } else {
                // Collective: it waits for the peers on the host; bounded by the deadline.
                let api = self.api.clone();
                let sc = SendComm(c);
                let (code, child) = self.core.bounded_locked(
                    "ncclCommSplit",
                    move || {
                        let sc = sc;
                        let mut out: NcclComm = std::ptr::null_mut();
                        // SAFETY: as above; the caller holds the lock while this runs and
                        // gives the parent up if it does not return in time.
                        let code = unsafe { split(sc.0, 0, rank, &mut out, std::ptr::null_mut()) };
                        (code, SendComm(out))
                    },
                    move |(code, child)| {
                        if code == 0 && !child.0.is_null() {
                            // SAFETY: a communicator made after the caller gave up, aborted once.
                            unsafe { (api.fns.comm_abort)(child.0) };
                        }
                    },
                )?;
                out = child.0;
                code
            };
            self.check("ncclCommSplit", code)?;
            // Non-blocking: the parent's part settles first (then `out` is written).
            self.core.settle_locked("ncclCommSplit")?;
            if out.is_null() {
                return Err(Error::invalid("comm", "ncclCommSplit gave no communicator"));
            }
            if self.core.nonblocking {
                let t = self.core.timeout();
                if let Err(e) = settle_raw(&self.api, out, "ncclCommSplit", t, &|| false) {
                    // SAFETY: the communicator just created, aborted once.
                    unsafe { (self.api.fns.comm_abort)(out) };
                    return Err(e);
                }
            }
            Ok(out)
        })?;
        let s = Arc::new(Shadow {
            comm,
            regs: Mutex::new(HashMap::new()),
        });
        let mut slot = self.core.shadow.lock().unwrap_or_else(|e| e.into_inner());
        // Registrations are collective and ordered, so two threads of one rank do not
        // create it at once; if they did, the first one kept stays (the other leaks until
        // the process ends rather than being freed while a peer may still use it).
        Ok(slot.get_or_insert(s).clone())
    }

    /// The thresholds this communicator's automatic registrations use, in place of
    /// `UNICOMM_TUNE_FILE` or the built-in defaults (an engine that ships its own tuning).
    /// Before the first automatic registration, where the ranks agree on the policy: every
    /// rank must set the same one (else that registration fails on every rank); afterwards
    /// `InvalidArgument`.
    pub fn set_auto_policy(&self, policy: Policy) -> Result<()> {
        let mut wanted = self.wanted_policy.lock().unwrap_or_else(|e| e.into_inner());
        if self.agreed.get().is_some() {
            return Err(Error::invalid(
                "policy",
                "the ranks agreed on the automatic policy at the first automatic registration; set it before that",
            ));
        }
        *wanted = Some(policy);
        Ok(())
    }

    /// The automatic policy the ranks agreed on, once an automatic registration has been
    /// made.
    pub fn auto_policy(&self) -> Option<&Policy> {
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
    fn agree_policy(&self) -> Result<()> {
        if self.agreed.get().is_some() {
            return Ok(());
        }
        // Held until the policy is set, so a `set_auto_policy` meanwhile waits and is refused
        // rather than accepted and ignored.
        let wanted = self.wanted_policy.lock().unwrap_or_else(|e| e.into_inner());
        let mine = match &*wanted {
            Some(p) => Ok(p.clone()),
            None => Policy::current().cloned(),
        };
        let ce = auto_copy_engine();
        // In a world of one there is nobody to differ from.
        let (mut same, mut ce_everywhere) = (true, true);
        let mut digest = 0;
        if self.world > 1 {
            self.not_in_group("agreeing on the automatic policy")?;
            digest = match (&mine, &ce) {
                (Ok(p), Ok(_)) => p.digest(),
                _ => u64::MAX,
            };
            let wish = self.ce.reachable() && matches!(ce, Ok(true));
            // Max of [d, !d, !wish] is [max d, !min d, !(every rank wishes)].
            let all = self.all_max(&[digest, !digest, u64::from(!wish)])?;
            same = all[0] == digest && !all[1] == digest;
            ce_everywhere = all[2] == 0;
        }
        // This rank's own error first; its peers see "none" and fail with the mismatch.
        let (mine, ce) = (mine?, ce?);
        if !same {
            return Err(Error::invalid(
                "policy",
                format!(
                    "rank {}'s automatic policy (UNICOMM_TUNE_FILE or set_auto_policy, digest {digest:016x}) differs from another rank's, or another rank could not load its own (UNICOMM_TUNE_FILE, UNICOMM_AUTO_COPY_ENGINE; that rank's error says why); every rank must use the same thresholds (one tune file for the job)",
                    self.rank
                ),
            ));
        }
        let _ = self.agreed.set(Agreed {
            policy: mine,
            copy_engine: ce && ce_everywhere,
        });
        drop(wanted);
        Ok(())
    }

    /// `register_auto`: a window here, shared for the copy engines in a local world, and
    /// `ncclCommRegister` on the second communicator.
    pub(crate) fn register_auto_impl(
        &self,
        mem: &ApiMemory<R>,
        offset: usize,
        bytes: usize,
    ) -> Result<RawHandle> {
        let reg = self.api.gated(
            "automatic registration (ncclCommRegister)",
            self.api.flavor.registration_since,
            self.api.fns.comm_register,
        )?;
        self.agree_policy()?;
        let h = self.window_register(mem, offset, bytes, RegKind::Auto)?;
        let undo = |e: Error| {
            let _ = self.deregister_auto_impl(h);
            e
        };
        let addr = mem.range(offset, bytes, "bytes")?;
        let shared = self.agreed.get().is_some_and(|a| a.copy_engine);
        if self.ce.reachable() && shared {
            self.share_window(h, addr, bytes).map_err(undo)?;
        }
        let sh = self.shadow().map_err(undo)?;
        if bytes > 0 {
            let handle = self
                .call(|_| {
                    let mut out = std::ptr::null_mut();
                    // SAFETY: `addr..addr+bytes` is this rank's device memory (checked by
                    // `range`); `out` receives the handle; the second communicator is live
                    // (destroyed only with this one, under the lock `call` holds).
                    let code = unsafe { reg(sh.comm, addr as *mut c_void, bytes, &mut out) };
                    self.check("ncclCommRegister", code)?;
                    self.core.settle_locked("ncclCommRegister")?;
                    Ok(out as usize)
                })
                .map_err(undo)?;
            sh.regs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(h, handle);
        }
        self.autos.fetch_add(1, Ordering::Relaxed);
        Ok(h)
    }

    /// Ends an automatic registration: the second communicator's registration, then the
    /// window (one step for concurrent callers, like every deregistration).
    pub(crate) fn deregister_auto_impl(&self, h: RawHandle) -> Result<()> {
        self.registry.release(h, RegKind::Auto, || {
            let sh = self
                .core
                .shadow
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(sh) = sh {
                let taken = sh.regs.lock().unwrap_or_else(|e| e.into_inner()).remove(&h);
                if let (Some(rh), Some(dereg)) = (taken, self.api.fns.comm_deregister) {
                    self.call(|_| {
                        // SAFETY: a live registration of the second communicator, taken out
                        // of its table above, so deregistered once.
                        let code = unsafe { dereg(sh.comm, rh as *mut c_void) };
                        self.check("ncclCommDeregister", code)
                    })?;
                }
            }
            self.window_deregister_raw(h)
        })?;
        self.autos.fetch_sub(1, Ordering::Relaxed);
        self.forget_window(h);
        Ok(())
    }

    /// For a call whose every buffer is registered for the automatic policy: the path the
    /// policy picks for its collective and size (nccl-tests' size), else `None`.
    #[inline]
    pub(crate) fn auto_path(&self, op: &Op<'_, ApiMemory<R>>) -> Result<Option<Path>> {
        // Every collective passes here: without a live automatic registration (the common
        // case) no lock is taken.
        if self.autos.load(Ordering::Relaxed) == 0
            || !op.kind.is_collective()
            || op.kind == Kind::Barrier
        {
            return Ok(None);
        }
        self.auto_path_of(op)
    }

    /// The lookup itself, out of line: only calls while automatic registrations are live.
    #[inline(never)]
    fn auto_path_of(&self, op: &Op<'_, ApiMemory<R>>) -> Result<Option<Path>> {
        let (se, re) = op.kind.extents();
        let esize = op.dtype.size();
        let range = |side: Option<Slice<'_, ApiMemory<R>>>, e: Extent| {
            side.map_or((0, 0), |s| {
                (
                    s.address(),
                    e.elems(op.count, self.world).unwrap_or(0) * esize,
                )
            })
        };
        // Both buffers under one lock: a lookup an engine's every call makes.
        let ranges = [range(op.send, se), range(op.recv, re)];
        if !self.registry.all_covered_by(RegKind::Auto, &ranges)? {
            return Ok(None);
        }
        let per_rank = matches!(
            op.kind,
            Kind::AllGather | Kind::AllToAll | Kind::ReduceScatter { .. }
        );
        let size = op.count * esize * if per_rank { self.world } else { 1 };
        // A live automatic registration agreed on a policy first.
        Ok(self.agreed.get().map(|a| a.policy.choose(op.kind, size)))
    }

    /// Where `op` goes: for buffers registered for the automatic policy, the path it picks
    /// for this size (the copy engines where they can take it, else the registered path);
    /// otherwise the copy engines where the path is on and the output is a shared window,
    /// else the library on this communicator.
    #[inline]
    pub(crate) fn route(&self, op: &Op<'_, ApiMemory<R>>) -> Result<Route> {
        Ok(match self.auto_path(op)? {
            Some(Path::CopyEngine) => match self.copy_engine_plan(op, true)? {
                Some(plan) => Route::CopyEngine(plan),
                // Not possible here (a group, one rank per process): the registered path.
                None => Route::Library(self.shadow_comm()),
            },
            Some(Path::Registered) => Route::Library(self.shadow_comm()),
            Some(Path::Window) => Route::Library(None),
            None => match self.copy_engine_plan(op, false)? {
                Some(plan) => Route::CopyEngine(plan),
                None => Route::Library(None),
            },
        })
    }

    /// The second communicator's handle, for a call the policy sends there.
    pub(crate) fn shadow_comm(&self) -> Option<NcclComm> {
        self.core.shadow_handle()
    }
}
