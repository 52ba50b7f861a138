//! Expert groups run by NCCL EP: the library loaded at the first group (beside the NCCL
//! this communicator runs on), each group opened collectively after the ranks compared
//! their capacities, its dispatch and combine one library call each behind the one door
//! (recorded as unicomm's kernels' are), its teardown on a helper thread within the
//! deadline.

#![allow(
    unsafe_code,
    reason = "hands checked device addresses to NCCL EP's calls (the architecture test's UNSAFE_FILES lists it)"
)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use unicomm_core::registry::RawHandle;
use unicomm_core::symmetric::{Combine, Dispatch, ExpertEngine, ExpertGroupParts, ExpertMode};
use unicomm_core::{DataType, Error, Result};

use crate::base::Base;
use crate::memory::{ApiMemory, ApiStream};
use crate::sys::ep::{EpGroup, EpLibrary, EpSpec};
use crate::sys::runtime::Runtime;

use super::expert::operand;

/// A communicator's NCCL EP groups.
#[derive(Default)]
pub(crate) struct Engines {
    lib: OnceLock<Arc<EpLibrary>>,
    next: AtomicUsize,
    live: Mutex<HashMap<RawHandle, Arc<EpGroup>>>,
}

/// The group's capacities and type as words every rank compares (each with its
/// complement: the maximum of both is the same on every rank only where all agree).
fn agreed_words(g: &ExpertGroupParts) -> Vec<u64> {
    let c = &g.config;
    let words = [
        c.experts as u64,
        c.max_tokens as u64,
        c.hidden as u64,
        c.top_k as u64,
        g.dtype as u64,
    ];
    words.iter().flat_map(|&w| [w, !w]).collect()
}

impl Engines {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<RawHandle, Arc<EpGroup>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The library, loaded at the first group.
    fn library<R: Runtime>(&self, base: &Base<R>) -> Result<Arc<EpLibrary>> {
        if let Some(l) = self.lib.get() {
            return Ok(l.clone());
        }
        let lc = &base.lc;
        let major = lc.rt.driver_version().map(|v| v / 1000);
        let lib = Arc::new(EpLibrary::load(&lc.api, major)?);
        tracing::info!(rank = lc.rank, "expert groups on {lib:?}");
        if std::env::var_os("NCCL_EP_HOME").is_none() {
            // Its kernels are compiled at run time from headers it finds through the variable.
            let home = crate::sys::ep::jit_home(&lib.path);
            let beside = home.map_or(String::new(), |h| format!(" ({} beside it)", h.display()));
            tracing::warn!(
                "NCCL_EP_HOME is not set: NCCL EP's JIT reads its headers from it{beside}"
            );
        }
        Ok(self.lib.get_or_init(|| lib).clone())
    }

    /// Opens NCCL EP's group for `g` (collective): refused before any rank calls the
    /// library where the engine or the group is not one it runs, `Mismatch` on every rank
    /// where the capacities differ.
    pub(crate) fn open<R: Runtime>(
        &self,
        base: &Base<R>,
        g: &ExpertGroupParts,
    ) -> Result<RawHandle> {
        let lc = &base.lc;
        base.not_in_group("expert_group_with")?;
        lc.not_suspended()?;
        if g.engine != ExpertEngine::Library {
            return Err(Error::unsupported(
                format!("expert parallelism on {}", g.engine.name()),
                "NCCL EP",
                "an NCCL communicator's expert library",
            ));
        }
        let plain = g.mask.survivors() == g.mask.world() && g.mode == ExpertMode::LowLatency;
        if g.dtype != DataType::Bf16 || !plain {
            return Err(Error::unsupported(
                "NCCL EP's dispatch and combine",
                "bf16 tokens, low latency and no masked rank (its low-latency algorithm's contract here)",
                format!(
                    "{:?} tokens, {:?}, masked ranks {:?}",
                    g.dtype,
                    g.mode,
                    g.mask.masked()
                ),
            ));
        }
        let words = agreed_words(g);
        let m = base.all_max(&words)?;
        if m != words {
            return Err(Error::Mismatch {
                what: "expert config",
                detail: format!(
                    "rank {}'s NCCL EP group {:?} of {:?}: another rank's differs",
                    lc.rank, g.config, g.dtype
                ),
            });
        }
        let lib = self.library(base)?;
        let spec = EpSpec {
            experts: g.config.experts,
            world: lc.world,
            max_tokens: g.config.max_tokens,
            hidden: g.config.hidden,
            top_k: g.config.top_k,
            dtype: g.dtype,
            timeout: lc.timeout(),
        };
        let comm = lc.raw();
        if comm.is_null() {
            // Ended, or its lock held past twice the deadline: the error says which.
            lc.live_now()?;
            return Err(Error::Timeout {
                what: "the communicator's lock, to open NCCL EP's group".into(),
                after: 2 * lc.timeout(),
            });
        }
        // SAFETY: `comm` is this communicator's live handle (checked just above), of the
        // NCCL the library was loaded beside.
        let group = unsafe { EpGroup::create(lib, &lc.api, comm, spec) }?;
        let handle = RawHandle(self.next.fetch_add(1, Ordering::Relaxed) + 1);
        self.table().insert(handle, Arc::new(group));
        Ok(handle)
    }

    /// Releases a group: local; the library's teardown waits for the device on a helper
    /// thread within the deadline.
    pub(crate) fn close<R: Runtime>(&self, base: &Base<R>, handle: RawHandle) -> Result<()> {
        let g = self
            .table()
            .remove(&handle)
            .ok_or_else(|| unknown(handle))?;
        let (rt, dev) = (base.lc.rt.clone(), base.lc.dev);
        let what = format!("NCCL EP's group on device {dev}");
        crate::wait::released(what, base.lc.timeout(), move || {
            rt.synchronize_device(dev)?;
            drop(g);
            Ok(())
        });
        Ok(())
    }

    fn get(&self, handle: RawHandle) -> Result<Arc<EpGroup>> {
        self.table()
            .get(&handle)
            .cloned()
            .ok_or_else(|| unknown(handle))
    }

    /// A dispatch by the library, every operand checked against the sizes it moves.
    pub(crate) fn dispatch<R: Runtime>(
        &self,
        base: &Base<R>,
        d: &Dispatch<'_, ApiMemory<R>>,
        stream: &ApiStream<R>,
    ) -> Result<()> {
        let g = self.get(d.group.recv)?;
        if d.fp8.is_some() {
            return Err(Error::unsupported(
                "an FP8 dispatch",
                "unicomm's kernels",
                "NCCL EP",
            ));
        }
        let s = g.spec();
        let t = s.dtype;
        let rows = s.local() * s.world * s.max_tokens;
        let a = [
            operand(base, &d.tokens, d.n.checked_mul(s.hidden), t, "tokens")?,
            operand(base, &d.ids, d.n.checked_mul(s.top_k), DataType::I32, "ids")?,
            operand(base, &d.out, rows.checked_mul(s.hidden), t, "out")?,
            operand(base, &d.counts, Some(s.local()), DataType::I32, "counts")?,
        ];
        stream.watched_by(&base.lc);
        let raw = R::raw_stream(stream.inner());
        let a = a.map(|x| x as usize);
        // SAFETY: every address is this rank's memory holding the sizes the call moves
        // (checked above), kept by the caller's borrows until the stream's work ends.
        unsafe { g.dispatch(&base.lc.api, a, d.n, raw) }
    }

    /// A combine by the library, in the last dispatch's routing.
    pub(crate) fn combine<R: Runtime>(
        &self,
        base: &Base<R>,
        c: &Combine<'_, ApiMemory<R>>,
        stream: &ApiStream<R>,
    ) -> Result<()> {
        let g = self.get(c.group.recv)?;
        let s = g.spec();
        let t = s.dtype;
        let rows = s.local() * s.world * s.max_tokens;
        let a = [
            operand(
                base,
                &c.expert_out,
                rows.checked_mul(s.hidden),
                t,
                "expert_out",
            )?,
            operand(
                base,
                &c.weights,
                c.n.checked_mul(s.top_k),
                DataType::F32,
                "weights",
            )?,
            operand(base, &c.out, c.n.checked_mul(s.hidden), t, "out")?,
        ];
        stream.watched_by(&base.lc);
        let raw = R::raw_stream(stream.inner());
        let a = a.map(|x| x as usize);
        // SAFETY: as in `dispatch`.
        unsafe { g.combine(&base.lc.api, a, c.n, raw) }
    }
}

fn unknown(handle: RawHandle) -> Error {
    Error::invalid(
        "group",
        format!("{handle:?} is not an NCCL EP group of this communicator"),
    )
}
