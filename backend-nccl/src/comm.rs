//! The communicator over any NCCL-API library and device runtime: what backend-nccl
//! (NCCL + CUDA) and backend-rccl (RCCL + HIP) both are.

use std::any::Any;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use comm_core::registry::{RegKind, Registry};
use comm_core::{
    Capabilities, Collective, DataType, DeviceMemory, DeviceStream, Error, Op, RawHandle, ReduceOp,
    Result, Version,
};

use crate::api::{Api, NcclComm, UniqueId, WIN_COLL_SYMMETRIC};
use crate::runtime::Runtime;

/// A stream of a NCCL-API backend.
pub struct ApiStream<R: Runtime> {
    pub(crate) s: R::Stream,
    pub(crate) dev: usize,
    rt: Arc<R>,
}

impl<R: Runtime> std::fmt::Debug for ApiStream<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} stream on device {}: {:?}", R::NAME, self.dev, self.s)
    }
}

impl<R: Runtime> ApiStream<R> {
    /// Wraps a runtime stream of device `dev` (interop with existing CUDA/HIP code).
    pub fn from_runtime(rt: Arc<R>, s: R::Stream, dev: usize) -> Self {
        ApiStream { s, dev, rt }
    }
    /// The runtime's stream.
    pub fn inner(&self) -> &R::Stream {
        &self.s
    }
    /// The device.
    pub fn device(&self) -> usize {
        self.dev
    }
    /// Blocks until the stream is idle.
    pub fn synchronize(&self) -> Result<()> {
        self.rt.synchronize(&self.s)
    }
}

impl<R: Runtime> DeviceStream for ApiStream<R> {
    fn synchronize(&self) -> Result<()> {
        self.rt.synchronize(&self.s)
    }
}

enum Owner {
    /// `ncclMemFree` on drop.
    Nccl(Arc<Api>),
    /// The runtime's free on drop.
    Runtime,
    /// Someone else's memory, kept alive by the box (a cudarc slice) or by the caller (raw).
    Borrowed(#[allow(dead_code)] Option<Box<dyn Any + Send + Sync>>),
}

/// Device memory of a NCCL-API backend.
pub struct ApiMemory<R: Runtime> {
    ptr: usize,
    bytes: usize,
    dev: usize,
    owner: Owner,
    rt: Arc<R>,
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
        })
    }

    /// The device.
    pub fn device(&self) -> usize {
        self.dev
    }

    fn range(&self, offset: usize, len: usize, what: &'static str) -> Result<usize> {
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
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        let (ptr, dev) = (self.ptr, self.dev);
        // Errors cannot be reported from drop; a failed free leaks.
        let _ = match &self.owner {
            Owner::Nccl(api) => match api.fns.mem_free {
                // SAFETY: `ptr` came from ncclMemAlloc on `dev`; it is freed once, here.
                Some(free) => self.rt.with_device(dev, || {
                    api.check("ncclMemFree", unsafe { free(ptr as *mut c_void) }, None)
                }),
                None => Ok(()),
            },
            // SAFETY: `ptr` came from the runtime's malloc on `dev`; freed once, here.
            Owner::Runtime => unsafe { self.rt.free(dev, ptr) },
            Owner::Borrowed(_) => Ok(()),
        };
    }
}

impl<R: Runtime> DeviceMemory for ApiMemory<R> {
    type Stream = ApiStream<R>;

    fn byte_len(&self) -> usize {
        self.bytes
    }
    fn address(&self) -> usize {
        self.ptr
    }
    fn write(&self, offset: usize, src: &[u8], stream: &ApiStream<R>) -> Result<()> {
        let dst = self.range(offset, src.len(), "src")?;
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: the range lies inside this allocation of device `dev`.
        unsafe { self.rt.htod(self.dev, dst, src, &stream.s) }
    }
    fn read(&self, offset: usize, dst: &mut [u8], stream: &ApiStream<R>) -> Result<()> {
        let src = self.range(offset, dst.len(), "dst")?;
        if dst.is_empty() {
            return stream.synchronize();
        }
        // SAFETY: the range lies inside this allocation of device `dev`.
        unsafe { self.rt.dtoh(self.dev, dst, src, &stream.s) }
    }
}

const LIVE: u8 = 0;
const GONE: u8 = 1;

/// Handles for zero-byte registrations, which never reach the library (there is nothing
/// to register); they live in the upper half of the address space no library hands out.
static NEXT_EMPTY: AtomicUsize = AtomicUsize::new(usize::MAX / 2);

/// One rank's communicator over an NCCL-API library.
pub struct ApiComm<R: Runtime> {
    api: Arc<Api>,
    rt: Arc<R>,
    comm: NcclComm,
    dev: usize,
    rank: usize,
    world: usize,
    registry: Registry,
    /// 4 device bytes for `barrier` (an all-reduce of one element).
    barrier: ApiMemory<R>,
    /// NCCL communicators must not be called from two threads at once.
    lock: Mutex<()>,
    state: AtomicU8,
}

// SAFETY: an NCCL communicator is not bound to the thread that created it (NCCL's pthread
// and single-thread modes both move them); every call on it goes through `lock`, so it is
// never used by two threads at once, which is NCCL's rule for sharing one between threads.
unsafe impl<R: Runtime> Send for ApiComm<R> {}
// SAFETY: as above: shared access is serialised by `lock`.
unsafe impl<R: Runtime> Sync for ApiComm<R> {}

impl<R: Runtime> std::fmt::Debug for ApiComm<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} rank {}/{} on {} device {}",
            self.api.flavor.library,
            self.rank,
            self.world,
            R::NAME,
            self.dev
        )
    }
}

/// Raw pointer to the first byte of a slice.
fn ptr<R: Runtime>(s: &comm_core::Slice<'_, ApiMemory<R>>) -> *mut c_void {
    s.address() as *mut c_void
}

impl<R: Runtime> ApiComm<R> {
    /// One rank per visible device (or on the first `n`), created from this thread.
    pub fn local(api: Arc<Api>, rt: Arc<R>, n: Option<usize>) -> Result<Vec<Self>> {
        let count = rt.device_count()?;
        let n = n.unwrap_or(count);
        if n > count {
            return Err(Error::NoDevice {
                vendor: R::VENDOR,
                detail: format!("{n} ranks asked for, {count} GPU(s) visible"),
            });
        }
        Self::init_local(api, rt, &(0..n).collect::<Vec<_>>())
    }

    /// Creates the `devs.len()` ranks of a world in this process from one thread
    /// (`ncclCommInitRank` for every device inside one group).
    pub fn init_local(api: Arc<Api>, rt: Arc<R>, devs: &[usize]) -> Result<Vec<Self>> {
        let n = devs.len();
        if n == 0 {
            return Err(Error::invalid("devices", "no device given"));
        }
        let count = rt.device_count()?;
        if let Some(&d) = devs.iter().find(|&&d| d >= count) {
            return Err(Error::NoDevice {
                vendor: R::VENDOR,
                detail: format!("device {d} asked for, {count} visible"),
            });
        }
        let id = api.unique_id()?;
        let mut raw = vec![std::ptr::null_mut(); n];
        // SAFETY: ncclGroupStart has no arguments.
        api.check("ncclGroupStart", unsafe { (api.fns.group_start)() }, None)?;
        let mut first_err = None;
        for (rank, (&dev, slot)) in devs.iter().zip(raw.iter_mut()).enumerate() {
            let r = rt.with_device(dev, || {
                // SAFETY: `slot` receives the communicator; the id is shared by all ranks.
                let code = unsafe { (api.fns.comm_init_rank)(slot, n as c_int, id, rank as c_int) };
                api.check("ncclCommInitRank", code, None)
            });
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        // SAFETY: closes the group opened above.
        let end = api.check("ncclGroupEnd", unsafe { (api.fns.group_end)() }, None);
        if let Some(e) = first_err.or(end.err()) {
            for c in raw.into_iter().filter(|c| !c.is_null()) {
                // SAFETY: a communicator created above, aborted once.
                unsafe { (api.fns.comm_abort)(c) };
            }
            return Err(e);
        }
        raw.into_iter()
            .zip(devs)
            .enumerate()
            .map(|(rank, (c, &dev))| Self::wrap(api.clone(), rt.clone(), c, dev, rank, n))
            .collect()
    }

    /// The explicit form, for one rank per thread or per process: joins the world of
    /// `world` ranks identified by `id` as `rank`, on device `dev`. Blocks until every rank
    /// has called it.
    pub fn init_rank(
        api: Arc<Api>,
        rt: Arc<R>,
        id: UniqueId,
        rank: usize,
        world: usize,
        dev: usize,
    ) -> Result<Self> {
        if rank >= world {
            return Err(Error::invalid(
                "rank",
                format!("{rank} is outside 0..{world}"),
            ));
        }
        let count = rt.device_count()?;
        if dev >= count {
            return Err(Error::NoDevice {
                vendor: R::VENDOR,
                detail: format!("device {dev} asked for, {count} visible"),
            });
        }
        let mut c = std::ptr::null_mut();
        rt.with_device(dev, || {
            // SAFETY: `c` receives the communicator.
            let code =
                unsafe { (api.fns.comm_init_rank)(&mut c, world as c_int, id, rank as c_int) };
            api.check("ncclCommInitRank", code, None)
        })?;
        Self::wrap(api, rt, c, dev, rank, world)
    }

    fn wrap(
        api: Arc<Api>,
        rt: Arc<R>,
        comm: NcclComm,
        dev: usize,
        rank: usize,
        world: usize,
    ) -> Result<Self> {
        let barrier = match rt.malloc(dev, 4) {
            Ok(p) => ApiMemory {
                ptr: p,
                bytes: 4,
                dev,
                owner: Owner::Runtime,
                rt: rt.clone(),
            },
            Err(e) => {
                // SAFETY: the communicator was just created and is not used elsewhere.
                unsafe { (api.fns.comm_destroy)(comm) };
                return Err(e);
            }
        };
        Ok(ApiComm {
            api,
            rt,
            comm,
            dev,
            rank,
            world,
            registry: Registry::new(),
            barrier,
            lock: Mutex::new(()),
            state: AtomicU8::new(LIVE),
        })
    }

    /// The loaded library.
    pub fn api(&self) -> &Arc<Api> {
        &self.api
    }
    /// The device runtime.
    pub fn runtime(&self) -> &Arc<R> {
        &self.rt
    }
    /// The raw `ncclComm_t`, for calling the library directly (the overhead benchmark does,
    /// to compare). Using it while this communicator is used from another thread breaks
    /// NCCL's rule; that is the caller's responsibility.
    pub fn raw_comm(&self) -> NcclComm {
        self.comm
    }

    /// This rank's device.
    pub fn device(&self) -> usize {
        self.dev
    }

    /// Runs `f` on the communicator: not destroyed, not used by another thread, with this
    /// rank's device current.
    fn call<T>(&self, f: impl FnOnce(NcclComm) -> Result<T>) -> Result<T> {
        if self.state.load(Ordering::Acquire) != LIVE {
            return Err(Error::invalid(
                "comm",
                "the communicator was finalized or aborted",
            ));
        }
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.rt.with_device(self.dev, || f(self.comm))
    }

    fn check(&self, call: &'static str, code: c_int) -> Result<()> {
        self.api.check(call, code, Some(self.comm))
    }

    /// NCCL 2.28.9's symmetric-window all-gather, in place, corrupts the ranks' chunks when
    /// a chunk is not a multiple of 4 bytes (measured on 2x H200: f16/bf16/i8/u8 with 1001
    /// elements per rank get garbage from the next 8-byte boundary on; 4- and 8-byte types
    /// and out-of-place calls are right; so is a world of one). Refused as `Unsupported` rather than computed
    /// wrong; see docs/results.md.
    fn check_window_all_gather(
        &self,
        send: &comm_core::Slice<'_, ApiMemory<R>>,
        recv: &comm_core::Slice<'_, ApiMemory<R>>,
        chunk: usize,
    ) -> Result<()> {
        // One rank gathers nothing from peers (and was measured right).
        if self.world == 1 || chunk % 4 == 0 || send.address() != recv.address() + self.rank * chunk
        {
            return Ok(());
        }
        if self.registry.covering(recv.address(), chunk * self.world)? != Some(RegKind::Window) {
            return Ok(());
        }
        Err(Error::unsupported(
            format!("in-place all_gather in a symmetric window with {chunk}-byte chunks"),
            "chunks that are a multiple of 4 bytes (or out of place, or a non-window buffer)",
            format!(
                "{} {}, whose symmetric in-place all-gather corrupts such chunks",
                self.api.flavor.library, self.api.version
            ),
        ))
    }

    fn send_recv(
        &self,
        buf: *mut c_void,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: *mut c_void,
        send: bool,
    ) -> Result<()> {
        let pair = self.api.fns.send.zip(self.api.fns.recv);
        let (s, r) = self
            .api
            .gated("point-to-point send/recv", Version::new(2, 7, 0), pair)?;
        // SAFETY: device pointers of this rank's memory holding `count` elements (checked by
        // the caller); the stream belongs to this device.
        let code = unsafe {
            if send {
                s(buf, count, dtype.nccl(), peer as c_int, self.comm, stream)
            } else {
                r(buf, count, dtype.nccl(), peer as c_int, self.comm, stream)
            }
        };
        self.check(if send { "ncclSend" } else { "ncclRecv" }, code)
    }

    /// Registers `mem[offset..offset+bytes]` through `call` (which gets the communicator and
    /// the address, and returns the library's handle) and records it; zero bytes never reach
    /// the library (there is nothing to register).
    fn register_range(
        &self,
        mem: &ApiMemory<R>,
        offset: usize,
        bytes: usize,
        kind: RegKind,
        call: impl FnOnce(NcclComm, *mut c_void) -> Result<*mut c_void>,
    ) -> Result<RawHandle> {
        self.check_memory(mem)?;
        let addr = mem.range(offset, bytes, "bytes")?;
        let h = if bytes == 0 {
            RawHandle(NEXT_EMPTY.fetch_add(1, Ordering::Relaxed))
        } else {
            RawHandle(self.call(|c| call(c, addr as *mut c_void))? as usize)
        };
        self.registry.insert(h, addr, bytes, kind)?;
        Ok(h)
    }

    /// Deregisters a live handle of `kind` with `f` (`ncclCommDeregister` or
    /// `ncclCommWindowDeregister`), then forgets it.
    fn deregister_handle(
        &self,
        handle: RawHandle,
        kind: RegKind,
        name: &'static str,
        f: Option<unsafe extern "C" fn(NcclComm, *mut c_void) -> c_int>,
    ) -> Result<()> {
        self.registry.check(handle, kind)?;
        if handle.0 < usize::MAX / 2 {
            let f =
                f.ok_or_else(|| Error::invalid("handle", format!("the library has no {name}")))?;
            // SAFETY: a live handle of this kind of this communicator (checked above),
            // deregistered once.
            self.call(|c| self.check(name, unsafe { f(c, handle.0 as *mut c_void) }))?;
        }
        self.registry.remove(handle, kind)
    }

    fn group<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        // SAFETY: no arguments.
        self.api.check(
            "ncclGroupStart",
            unsafe { (self.api.fns.group_start)() },
            None,
        )?;
        let r = f();
        // SAFETY: closes the group opened above.
        let end = self.api.check(
            "ncclGroupEnd",
            unsafe { (self.api.fns.group_end)() },
            Some(self.comm),
        );
        let r = r?;
        end?;
        Ok(r)
    }

    fn destroy(&mut self, finalize: bool) -> Result<()> {
        if self.state.swap(GONE, Ordering::AcqRel) != LIVE {
            return Ok(());
        }
        let (api, comm) = (self.api.clone(), self.comm);
        self.rt.with_device(self.dev, || {
            if finalize {
                if let Some(f) = api.fns.comm_finalize {
                    // SAFETY: a live communicator, finalized once.
                    api.check("ncclCommFinalize", unsafe { f(comm) }, Some(comm))?;
                }
                // SAFETY: a live communicator, destroyed once.
                api.check(
                    "ncclCommDestroy",
                    unsafe { (api.fns.comm_destroy)(comm) },
                    None,
                )
            } else {
                // SAFETY: a live communicator, aborted once.
                api.check("ncclCommAbort", unsafe { (api.fns.comm_abort)(comm) }, None)
            }
        })
    }
}

impl<R: Runtime> Drop for ApiComm<R> {
    fn drop(&mut self) {
        // Registrations borrow the typed communicator, so none is alive here; a raw user
        // may have left some: deregister them before the communicator goes (NCCL: after
        // destroy, deregistering is a use-after-free).
        for h in self.registry.handles(RegKind::Buffer) {
            let _ = self.deregister(h);
        }
        let _ = self.destroy(true);
    }
}

impl<R: Runtime> Collective for ApiComm<R> {
    type Stream = ApiStream<R>;
    type Memory = ApiMemory<R>;

    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: if self.api.flavor.library == "RCCL" {
                "rccl"
            } else {
                "nccl"
            },
            library_path: self.api.path.clone(),
            version: self.api.version,
            registration: self.api.has_registration(),
            windows: self.api.has_windows(),
            native_all_to_all: self.api.all_to_all.is_some(),
            graph_capture: true,
            mem_alloc: self.api.has_mem_alloc(),
        }
    }

    fn create_stream(&self) -> Result<ApiStream<R>> {
        Ok(ApiStream {
            s: self.rt.create_stream(self.dev)?,
            dev: self.dev,
            rt: self.rt.clone(),
        })
    }

    fn alloc(&self, bytes: usize) -> Result<ApiMemory<R>> {
        let (rt, dev) = (self.rt.clone(), self.dev);
        if bytes == 0 {
            return Ok(ApiMemory {
                ptr: 0,
                bytes: 0,
                dev,
                owner: Owner::Runtime,
                rt,
            });
        }
        if let Some(alloc) = self.api.fns.mem_alloc.filter(|_| self.api.has_mem_alloc()) {
            let mut p = std::ptr::null_mut();
            self.rt.with_device(dev, || {
                // SAFETY: ncclMemAlloc writes one pointer, on the current device.
                self.api
                    .check("ncclMemAlloc", unsafe { alloc(&mut p, bytes) }, None)
            })?;
            return Ok(ApiMemory {
                ptr: p as usize,
                bytes,
                dev,
                owner: Owner::Nccl(self.api.clone()),
                rt,
            });
        }
        // Libraries without ncclMemAlloc (NCCL < 2.19, RCCL before ROCm 6.2): plain device
        // memory; registration still works where the library has it.
        let p = self.rt.malloc(dev, bytes)?;
        Ok(ApiMemory {
            ptr: p,
            bytes,
            dev,
            owner: Owner::Runtime,
            rt,
        })
    }

    fn check_memory(&self, mem: &ApiMemory<R>) -> Result<()> {
        if mem.dev == self.dev {
            Ok(())
        } else {
            Err(Error::invalid(
                "buffer",
                format!(
                    "memory of device {}, used by the communicator of device {}",
                    mem.dev, self.dev
                ),
            ))
        }
    }

    fn register(&self, mem: &ApiMemory<R>, offset: usize, bytes: usize) -> Result<RawHandle> {
        let fns = &self.api.fns;
        let f = self.api.gated(
            "user-buffer registration (ncclCommRegister)",
            self.api.flavor.registration_since,
            fns.comm_register.filter(|_| fns.comm_deregister.is_some()),
        )?;
        self.register_range(mem, offset, bytes, RegKind::Buffer, |c, addr| {
            let mut h = std::ptr::null_mut();
            // SAFETY: `addr..addr+bytes` is device memory of this rank; `h` receives the handle.
            self.check("ncclCommRegister", unsafe { f(c, addr, bytes, &mut h) })?;
            Ok(h)
        })
    }

    fn deregister(&self, handle: RawHandle) -> Result<()> {
        let f = self.api.fns.comm_deregister;
        self.deregister_handle(handle, RegKind::Buffer, "ncclCommDeregister", f)
    }

    fn register_window(
        &self,
        mem: &ApiMemory<R>,
        offset: usize,
        bytes: usize,
    ) -> Result<RawHandle> {
        let fns = &self.api.fns;
        let f = self.api.gated(
            "symmetric windows (ncclCommWindowRegister)",
            self.api.flavor.windows_since,
            fns.window_register
                .filter(|_| fns.window_deregister.is_some()),
        )?;
        self.register_range(mem, offset, bytes, RegKind::Window, |c, addr| {
            let mut w = std::ptr::null_mut();
            // SAFETY: `addr..addr+bytes` is device memory of this rank; `w` receives the window.
            self.check("ncclCommWindowRegister", unsafe {
                f(c, addr, bytes, &mut w, WIN_COLL_SYMMETRIC)
            })?;
            if w.is_null() {
                // NCCL returns success and no window where symmetric memory is unsupported.
                return Err(Error::unsupported(
                    "symmetric window",
                    "symmetric-memory support (cuMem memory from ncclMemAlloc, NVLink or a supported transport)",
                    format!("{} {} returned a NULL window", self.api.flavor.library, self.api.version),
                ));
            }
            Ok(w)
        })
    }

    fn deregister_window(&self, handle: RawHandle) -> Result<()> {
        let f = self.api.fns.window_deregister;
        self.deregister_handle(handle, RegKind::Window, "ncclCommWindowDeregister", f)
    }

    fn enqueue(&self, op: Op<'_, ApiMemory<R>>, stream: &ApiStream<R>) -> Result<()> {
        if stream.dev != self.dev {
            return Err(Error::invalid(
                "stream",
                format!(
                    "a stream of device {} used by the communicator of device {}",
                    stream.dev, self.dev
                ),
            ));
        }
        op.check_bounds(self.world)?;
        let st = R::raw_stream(&stream.s);
        let w = self.world;
        let fns = &self.api.fns;
        match op {
            Op::AllReduce {
                send,
                recv,
                count,
                dtype,
                op,
            } => {
                // SAFETY: both ranges hold `count` elements of this rank's device memory.
                self.call(|c| {
                    self.check("ncclAllReduce", unsafe {
                        (fns.all_reduce)(
                            ptr(&send),
                            ptr(&recv),
                            count,
                            dtype.nccl(),
                            op.nccl(),
                            c,
                            st,
                        )
                    })
                })
            }
            Op::Broadcast {
                send,
                recv,
                count,
                dtype,
                root,
            } => {
                // SAFETY: as above.
                self.call(|c| {
                    self.check("ncclBroadcast", unsafe {
                        (fns.broadcast)(
                            ptr(&send),
                            ptr(&recv),
                            count,
                            dtype.nccl(),
                            root as c_int,
                            c,
                            st,
                        )
                    })
                })
            }
            Op::Reduce {
                send,
                recv,
                count,
                dtype,
                op,
                root,
            } => {
                // SAFETY: as above.
                self.call(|c| {
                    self.check("ncclReduce", unsafe {
                        (fns.reduce)(
                            ptr(&send),
                            ptr(&recv),
                            count,
                            dtype.nccl(),
                            op.nccl(),
                            root as c_int,
                            c,
                            st,
                        )
                    })
                })
            }
            Op::AllGather {
                send,
                recv,
                count,
                dtype,
            } => {
                self.check_window_all_gather(&send, &recv, count * dtype.size())?;
                // SAFETY: send holds `count`, recv `count * world` elements.
                self.call(|c| {
                    self.check("ncclAllGather", unsafe {
                        (fns.all_gather)(ptr(&send), ptr(&recv), count, dtype.nccl(), c, st)
                    })
                })
            }
            Op::ReduceScatter {
                send,
                recv,
                count,
                dtype,
                op,
            } => {
                // SAFETY: send holds `count * world`, recv `count` elements.
                self.call(|c| {
                    self.check("ncclReduceScatter", unsafe {
                        (fns.reduce_scatter)(
                            ptr(&send),
                            ptr(&recv),
                            count,
                            dtype.nccl(),
                            op.nccl(),
                            c,
                            st,
                        )
                    })
                })
            }
            Op::AllToAll {
                send,
                recv,
                count,
                dtype,
            } => {
                if let Some(a2a) = self.api.all_to_all {
                    // SAFETY: both hold `count * world` elements.
                    return self.call(|c| {
                        self.check("ncclAlltoAll", unsafe {
                            a2a(ptr(&send), ptr(&recv), count, dtype.nccl(), c, st)
                        })
                    });
                }
                // No native all-to-all (NCCL < 2.28): one send and one receive per peer in a
                // group, as nccl-tests' alltoall does.
                let b = count * dtype.size();
                self.call(|_| {
                    self.group(|| {
                        for p in 0..w {
                            self.send_recv(
                                (send.address() + p * b) as *mut c_void,
                                count,
                                dtype,
                                p,
                                st,
                                true,
                            )?;
                            self.send_recv(
                                (recv.address() + p * b) as *mut c_void,
                                count,
                                dtype,
                                p,
                                st,
                                false,
                            )?;
                        }
                        Ok(())
                    })
                })
            }
            Op::Send {
                buf,
                count,
                dtype,
                peer,
            } => self.call(|_| self.send_recv(ptr(&buf), count, dtype, peer, st, true)),
            Op::Recv {
                buf,
                count,
                dtype,
                peer,
            } => self.call(|_| self.send_recv(ptr(&buf), count, dtype, peer, st, false)),
            Op::Barrier => {
                let b = self.barrier.ptr as *mut c_void;
                // SAFETY: the communicator's own 4-byte buffer, one f32 element, in place.
                self.call(|c| {
                    self.check("ncclAllReduce", unsafe {
                        (fns.all_reduce)(b, b, 1, DataType::F32.nccl(), ReduceOp::Sum.nccl(), c, st)
                    })
                })
            }
        }
    }

    fn group_start(&self) -> Result<()> {
        // SAFETY: no arguments.
        self.api.check(
            "ncclGroupStart",
            unsafe { (self.api.fns.group_start)() },
            None,
        )
    }

    fn group_end(&self) -> Result<()> {
        // SAFETY: no arguments; NCCL reports a group_end without group_start as an error.
        self.api.check(
            "ncclGroupEnd",
            unsafe { (self.api.fns.group_end)() },
            Some(self.comm),
        )
    }

    fn finalize(&mut self) -> Result<()> {
        self.destroy(true)
    }

    fn abort(&mut self) -> Result<()> {
        self.destroy(false)
    }
}
