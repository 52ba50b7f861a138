//! Streams and device memory of a NCCL-API backend, over its device [`Runtime`].

#![allow(
    unsafe_code,
    reason = "the owner of device memory and streams: it vouches for the ranges and streams it lends (the architecture test's UNSAFE_FILES lists it)"
)]

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use unicomm_core::{DeviceMemory, DeviceStream, Error, Marker, Result};

use crate::marker::ApiMarker;

use crate::sys::api::Api;
use crate::sys::calls::{DeviceBytes, LibAlloc, StreamRef};
use crate::sys::runtime::Runtime;
use crate::watch::{Watched, Watchers};

/// A stream of a NCCL-API backend. Its host waits have a deadline: that of the
/// communicators that enqueued work on it (`UNICOMM_TIMEOUT_MS` or `set_timeout`), which
/// they poll for asynchronous errors and abort when it passes.
pub struct ApiStream<R: Runtime> {
    pub(crate) dev: usize,
    /// `R::raw_stream(&s)`, read once: the runtime's handle may sit behind a pointer
    /// (cudarc's `Arc<CudaStream>`), one more cache line per call.
    pub(crate) raw: usize,
    pub(crate) watch: Watchers,
    pub(crate) s: R::Stream,
    pub(crate) rt: Arc<R>,
    /// The deadline while no communicator has enqueued work on it.
    pub(crate) timeout: std::time::Duration,
}

impl<R: Runtime> std::fmt::Debug for ApiStream<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} stream on device {}: {:?}", R::NAME, self.dev, self.s)
    }
}

impl<R: Runtime> ApiStream<R> {
    /// Wraps a runtime stream of device `dev` (interop with existing CUDA/HIP code); its
    /// waits take the deadline of `UNICOMM_TIMEOUT_MS` until a communicator uses it.
    pub fn from_runtime(rt: Arc<R>, s: R::Stream, dev: usize) -> Result<Self> {
        Ok(Self::new(rt, s, dev, unicomm_core::env::timeout()?))
    }

    pub(crate) fn new(rt: Arc<R>, s: R::Stream, dev: usize, timeout: std::time::Duration) -> Self {
        ApiStream {
            dev,
            raw: R::raw_stream(&s) as usize,
            watch: Watchers::default(),
            s,
            rt,
            timeout,
        }
    }

    /// The raw handle (`R::raw_stream`), as read when the stream was wrapped.
    pub(crate) fn raw(&self) -> *mut std::ffi::c_void {
        self.raw as *mut std::ffi::c_void
    }

    /// The stream, lent to a library call.
    #[inline]
    pub(crate) fn lend(&self) -> StreamRef<'_> {
        // SAFETY: the runtime's stream, owned by `self` (destroyed with it), live while
        // borrowed.
        unsafe { StreamRef::borrow_raw(self.raw()) }
    }

    /// A communicator enqueues work on this stream: its waits watch it.
    pub(crate) fn watched_by<W: Watched + 'static>(&self, w: &Arc<W>) {
        self.watch.add(w);
    }
    /// The runtime's stream.
    pub fn inner(&self) -> &R::Stream {
        &self.s
    }
    /// The device.
    pub fn device(&self) -> usize {
        self.dev
    }
    /// Blocks until the stream is idle, at most until the deadline (then the communicators
    /// that enqueued work on it are aborted and the error is `Timeout`); an asynchronous
    /// error of one of them ends the wait early, with that error, after aborting them.
    pub fn synchronize(&self) -> Result<()> {
        let what = format!("{} stream on device {}", R::NAME, self.dev);
        self.watch.wait(&what, self.timeout, || {
            self.rt.with_device(self.dev, || self.rt.query(&self.s))
        })?;
        // Idle now: returns at once, with the stream's sticky error if it has one.
        self.rt.synchronize(&self.s)
    }
}

impl<R: Runtime> DeviceStream for ApiStream<R> {
    fn synchronize(&self) -> Result<()> {
        ApiStream::synchronize(self)
    }

    fn query(&self) -> Result<bool> {
        let idle = self.rt.with_device(self.dev, || self.rt.query(&self.s))?;
        self.watch
            .query(&format!("{} stream on device {}", R::NAME, self.dev), idle)
    }

    fn record(&self) -> Result<Marker> {
        let ev = self.rt.with_device(self.dev, || self.rt.record(&self.s))?;
        Ok(Marker::new(ApiMarker {
            ev,
            rt: self.rt.clone(),
            launch: 0,
        }))
    }

    fn launch_marker(&self) -> Result<Marker> {
        let (ev, handle) = self.rt.launch_event(self.dev)?;
        Ok(Marker::new(ApiMarker {
            ev,
            rt: self.rt.clone(),
            launch: handle,
        }))
    }

    fn wait(&self, marker: &Marker) -> Result<()> {
        let m = marker
            .inner()
            .as_any()
            .downcast_ref::<ApiMarker<R>>()
            .ok_or_else(|| Error::invalid("marker", "a marker of another backend"))?;
        // cudaStreamWaitEvent / hipStreamWaitEvent: device-side, the host does not wait.
        self.rt.wait_event(self.dev, &self.s, &m.ev)
    }

    fn launch_host_fn(&self, f: Box<dyn FnOnce() + Send + 'static>) -> Result<()> {
        // A captured host function would run at every replay, and `f` runs once (its box is
        // freed after the first run): refused, never replayed into freed memory.
        if self.rt.capturing(&self.s)? {
            return Err(unicomm_core::Error::invalid(
                "stream",
                "a host function enqueued while the stream captures a graph: it would run at every replay, and a host function runs once",
            ));
        }
        // The runtime makes the device current for its own call.
        self.rt.launch_host_fn(self.dev, &self.s, f)
    }

    type Graph = ApiGraph<R>;

    fn begin_capture(&self) -> Result<()> {
        self.rt.begin_capture(self.dev, &self.s)
    }

    fn end_capture(&self) -> Result<ApiGraph<R>> {
        let g = self.rt.end_capture(self.dev, &self.s)?;
        Ok(ApiGraph {
            g,
            rt: self.rt.clone(),
            dev: self.dev,
        })
    }

    fn capturing(&self) -> Result<bool> {
        self.rt.capturing(&self.s)
    }
}

/// A graph captured on a NCCL-API backend's stream (a CUDA or HIP graph), instantiated.
pub struct ApiGraph<R: Runtime> {
    g: R::Graph,
    rt: Arc<R>,
    dev: usize,
}

impl<R: Runtime> std::fmt::Debug for ApiGraph<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} graph on device {}", R::NAME, self.dev)
    }
}

impl<R: Runtime> unicomm_core::DeviceGraph for ApiGraph<R> {
    type Stream = ApiStream<R>;

    fn launch(&self, stream: &ApiStream<R>) -> Result<()> {
        if stream.dev != self.dev {
            return Err(unicomm_core::Error::invalid(
                "stream",
                format!(
                    "a graph captured on device {} launched on a stream of device {}",
                    self.dev, stream.dev
                ),
            ));
        }
        self.rt.launch_graph(self.dev, &self.g, &stream.s)
    }
}

pub(crate) enum Owner {
    /// `ncclMemFree` on drop.
    Nccl(Arc<Api>),
    /// The runtime's free on drop.
    Runtime,
    /// Someone else's memory, kept alive by the box (a cudarc slice) or by the caller (raw).
    Borrowed(
        #[expect(dead_code, reason = "held only to keep the owner alive until drop")]
        Option<Box<dyn Any + Send + Sync>>,
    ),
}

/// Device memory of a NCCL-API backend.
pub struct ApiMemory<R: Runtime> {
    pub(crate) ptr: usize,
    pub(crate) bytes: usize,
    pub(crate) dev: usize,
    pub(crate) owner: Owner,
    pub(crate) rt: Arc<R>,
    /// The allocating communicator's deadline in milliseconds: how long a drop waits for the
    /// device before the free (`None`: lent memory, or `UNICOMM_TIMEOUT_MS`).
    pub(crate) deadline: Option<Arc<AtomicU64>>,
    /// The lender's stream, where its owner frees it in stream order (a cudarc slice's):
    /// a collective on another stream orders this one after itself ([`ApiMemory::lent_on`]).
    pub(crate) home: Option<R::Stream>,
}

impl<R: Runtime> std::fmt::Debug for ApiMemory<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} memory {:#x} ({} bytes) on device {}",
            R::NAME,
            self.ptr,
            self.bytes,
            self.dev
        )
    }
}

impl<R: Runtime> ApiMemory<R> {
    /// Wraps device memory owned elsewhere; `keep` (if any) is dropped with this value.
    ///
    /// # Safety
    /// `ptr..ptr+bytes` is device memory of `dev` that stays allocated while this value (and
    /// any work enqueued on it) lives.
    pub unsafe fn borrowed(
        rt: Arc<R>,
        dev: usize,
        ptr: usize,
        bytes: usize,
        keep: Option<Box<dyn Any + Send + Sync>>,
    ) -> Result<Self> {
        if ptr == 0 && bytes != 0 {
            return Err(Error::invalid(
                "ptr",
                "a NULL device pointer with a non-zero size",
            ));
        }
        if ptr.checked_add(bytes).is_none() {
            return Err(Error::invalid("bytes", "pointer + size overflows"));
        }
        Ok(ApiMemory {
            ptr,
            bytes,
            dev,
            owner: Owner::Borrowed(keep),
            rt,
            deadline: None,
            home: None,
        })
    }

    /// This lent memory's owner frees it in stream order on `home` (a cudarc slice's
    /// stream): a collective on another stream then makes `home` wait for it, so that the
    /// owner's free follows the collective even where the caller leaked what waited for it
    /// (a `Completion` or a `Graph` forgotten); a capture on another stream is refused.
    pub fn lent_on(mut self, home: R::Stream) -> Self {
        self.home = Some(home);
        self
    }

    /// [`ApiMemory::borrowed`] for `len` elements of `T` at `ptr` (what the backends'
    /// `lend_raw` functions lend), the size checked for overflow.
    ///
    /// # Safety
    /// As [`ApiMemory::borrowed`], for `len` elements of `T`.
    pub unsafe fn borrowed_elems<T: unicomm_core::Element>(
        rt: Arc<R>,
        dev: usize,
        ptr: usize,
        len: usize,
    ) -> Result<Self> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::invalid("len", format!("{len} elements overflow the address space"))
        })?;
        // SAFETY: forwarded from the caller.
        unsafe { Self::borrowed(rt, dev, ptr, bytes, None) }
    }

    /// The device.
    pub fn device(&self) -> usize {
        self.dev
    }

    pub(crate) fn range(&self, offset: usize, len: usize, what: &'static str) -> Result<usize> {
        match offset.checked_add(len) {
            Some(end) if end <= self.bytes => Ok(self.ptr + offset),
            _ => Err(Error::invalid(
                what,
                format!(
                    "bytes {offset}..+{len} are outside the {}-byte allocation",
                    self.bytes
                ),
            )),
        }
    }
}

impl<R: Runtime> Drop for ApiMemory<R> {
    /// An owned allocation is freed once the device's work is done with it: the device is
    /// synchronized first (`cudaFree`'s own rule; `ncclMemFree` unmaps virtual memory, which
    /// does not wait), so work still writing it (a collective of a completion handle that was
    /// forgotten, an eager call not yet waited for) never writes memory given back. The wait
    /// runs on a helper thread within the deadline (`UNICOMM_TIMEOUT_MS`); past it the drop
    /// returns and the helper frees the memory once the device is idle (never, if its work
    /// never ends: leaked, not freed under it).
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        let owner = std::mem::replace(&mut self.owner, Owner::Borrowed(None));
        if let Owner::Borrowed(_) = owner {
            return;
        }
        let (ptr, dev, rt) = (self.ptr, self.dev, self.rt.clone());
        let free = move || -> Result<()> {
            let idle = rt.synchronize_device(dev);
            let freed = match owner {
                Owner::Nccl(api) => rt.with_device(dev, || {
                    // SAFETY: `ptr` came from ncclMemAlloc on `dev`; it is freed once, here,
                    // after the device's work (synchronized above).
                    api.mem_free(unsafe { LibAlloc::from_raw(ptr) })
                }),
                // SAFETY: `ptr` came from the runtime's malloc on `dev`; freed once, here.
                Owner::Runtime => unsafe { rt.free(dev, ptr) },
                Owner::Borrowed(_) => Ok(()),
            };
            idle.and(freed)
        };
        let bound = match &self.deadline {
            Some(ms) => std::time::Duration::from_millis(ms.load(Ordering::Relaxed)),
            None => unicomm_core::env::timeout().unwrap_or(std::time::Duration::from_secs(600)),
        };
        let what = format!("device memory {ptr:#x} on device {dev}");
        crate::wait::released(what, bound, free);
    }
}

// SAFETY: every constructor makes or is promised device memory of `dev` for the value's
// life: the runtime's or the library's allocator, or `borrowed`'s contract.
unsafe impl<R: Runtime> DeviceBytes for ApiMemory<R> {}

impl<R: Runtime> DeviceMemory for ApiMemory<R> {
    type Stream = ApiStream<R>;

    /// An owned allocation's drop waits for the device first; lent memory is its owner's.
    fn outlives_its_work(&self) -> bool {
        !matches!(self.owner, Owner::Borrowed(_))
    }

    fn byte_len(&self) -> usize {
        self.bytes
    }
    fn address(&self) -> usize {
        self.ptr
    }
    fn write(&self, offset: usize, src: &[u8], stream: &ApiStream<R>) -> Result<()> {
        self.same_device(stream)?;
        let dst = self.range(offset, src.len(), "src")?;
        if src.is_empty() {
            return Ok(());
        }
        // The work before the copy first, with the deadline: the copy itself then runs at
        // once (it must complete before `src` is released; it cannot be abandoned).
        stream.synchronize()?;
        // SAFETY: the range lies inside this allocation of device `dev`.
        unsafe { self.rt.htod(self.dev, dst, src, &stream.s) }
    }
    fn read(&self, offset: usize, dst: &mut [u8], stream: &ApiStream<R>) -> Result<()> {
        self.same_device(stream)?;
        let src = self.range(offset, dst.len(), "dst")?;
        // The work before the copy first, with the deadline (as for `write`).
        stream.synchronize()?;
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: the range lies inside this allocation of device `dev`.
        unsafe { self.rt.dtoh(self.dev, dst, src, &stream.s) }
    }
    fn copy_from(
        &self,
        offset: usize,
        src: &ApiMemory<R>,
        src_offset: usize,
        bytes: usize,
        stream: &ApiStream<R>,
    ) -> Result<()> {
        self.same_device(stream)?;
        src.same_device(stream)?;
        let d = self.range(offset, bytes, "dst")?;
        let s = src.range(src_offset, bytes, "src")?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: both ranges lie inside allocations of the stream's device (checked), as a
        // collective's buffers do for the work enqueued on them.
        unsafe { self.rt.copy_async(self.dev, d, s, bytes, &stream.s) }
    }
}

impl<R: Runtime> ApiMemory<R> {
    /// `bytes` of device memory for collectives: `ncclMemAlloc` where the library has it
    /// (cuMem memory, what registration's zero-copy paths and exports need), else the
    /// runtime's (NCCL < 2.19, RCCL before ROCm 6.2: registration still works where the
    /// library has it). Zero bytes allocate nothing.
    pub(crate) fn alloc(
        api: &Arc<Api>,
        rt: Arc<R>,
        dev: usize,
        deadline: Arc<AtomicU64>,
        bytes: usize,
    ) -> Result<Self> {
        let (ptr, owner) = match bytes {
            0 => (0, Owner::Runtime),
            _ if api.has_mem_alloc() => (
                rt.with_device(dev, || api.mem_alloc(bytes))?.into_raw(),
                Owner::Nccl(api.clone()),
            ),
            _ => return Self::from_runtime_malloc(rt, dev, deadline, bytes),
        };
        Ok(ApiMemory {
            ptr,
            bytes,
            dev,
            owner,
            rt,
            deadline: Some(deadline),
            home: None,
        })
    }

    /// `bytes` of device memory from the runtime (`cuMemAlloc` / `hipMalloc`), not the
    /// library: the communicator's own small buffers, and allocations where the library
    /// cannot allocate. Freed on drop.
    pub(crate) fn from_runtime_malloc(
        rt: Arc<R>,
        dev: usize,
        deadline: Arc<AtomicU64>,
        bytes: usize,
    ) -> Result<Self> {
        let ptr = rt.malloc(dev, bytes)?;
        Ok(ApiMemory {
            ptr,
            bytes,
            dev,
            deadline: Some(deadline),
            home: None,
            owner: Owner::Runtime,
            rt,
        })
    }

    /// Copies are ordered on a stream of the memory's own device.
    fn same_device(&self, stream: &ApiStream<R>) -> Result<()> {
        if stream.dev == self.dev {
            Ok(())
        } else {
            Err(Error::invalid(
                "stream",
                format!(
                    "a stream of device {} used for memory of device {}",
                    stream.dev, self.dev
                ),
            ))
        }
    }
}
