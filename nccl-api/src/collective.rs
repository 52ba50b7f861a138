//! [`Collective`] for [`ApiComm`]: each operation of the contract as one NCCL-API call.

use std::ffi::{c_int, c_void};

use unicomm_core::registry::RegKind;
use unicomm_core::{Capabilities, Collective, Error, Kind, Op, RawHandle, Result};

use crate::api::NcclComm;
use crate::auto::Route;
use crate::check::CallPath;
use crate::comm::ApiComm;
use crate::copy_engine::GROUP_DEPTH;
use crate::memory::{ApiMemory, ApiStream, Owner};
use crate::runtime::Runtime;
use crate::watchdog::GROUP_MEMBERS;

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
            copy_engine: self.ce.reachable() && self.api.has_windows(),
        }
    }

    fn create_stream(&self) -> Result<ApiStream<R>> {
        let st = ApiStream::new(
            self.rt.clone(),
            self.rt.create_stream(self.dev)?,
            self.dev,
            self.core.timeout(),
        );
        st.watched_by(&self.core);
        Ok(st)
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
        ApiMemory::from_runtime_malloc(rt, dev, bytes)
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
            // Non-blocking: the handle is written when the call is done.
            self.core.settle_locked("ncclCommRegister")?;
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
        let h = self.window_register(mem, offset, bytes, RegKind::Window)?;
        if self.ce.enabled.load(std::sync::atomic::Ordering::Relaxed) {
            let addr = mem.range(offset, bytes, "bytes")?;
            if let Err(e) = self.share_window(h, addr, bytes) {
                let _ = self.deregister_window(h);
                return Err(e);
            }
        }
        Ok(h)
    }

    fn deregister_window(&self, handle: RawHandle) -> Result<()> {
        let f = self.api.fns.window_deregister;
        self.deregister_handle(handle, RegKind::Window, "ncclCommWindowDeregister", f)?;
        self.forget_window(handle);
        Ok(())
    }

    fn register_auto(&self, mem: &ApiMemory<R>, offset: usize, bytes: usize) -> Result<RawHandle> {
        self.register_auto_impl(mem, offset, bytes)
    }

    fn deregister_auto(&self, handle: RawHandle) -> Result<()> {
        self.deregister_auto_impl(handle)
    }

    fn device_memory(&self) -> Result<(usize, usize)> {
        self.rt.mem_info(self.dev)
    }

    fn device_info(&self) -> Result<unicomm_core::DeviceInfo> {
        let (name, pci_bus_id) = self.rt.device_info(self.dev)?;
        Ok(unicomm_core::DeviceInfo {
            index: Some(self.dev),
            name,
            pci_bus_id,
        })
    }

    // Inlined into the caller (the facade's dispatch): one function, one return path, from
    // the dispatch to the library call (fewer cold code lines after the library's enqueue).
    #[inline]
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
        op.check(self.world)?;
        stream.watched_by(&self.core);
        // UNICOMM_CHECK_COLLECTIVES=1: the ranks compare the call and its route first; a
        // rank whose call is refused here still takes part, so its peers do not wait.
        let route = self.route(&op);
        let path = match &route {
            Err(_) => CallPath::Refused,
            Ok(Route::CopyEngine(_)) => CallPath::CopyEngine,
            Ok(Route::Library(Some(_))) => CallPath::Second,
            Ok(Route::Library(None)) => CallPath::Library,
        };
        let checked = self.check_collective(&op, path, stream);
        let route = route?;
        checked?;
        let shadow = match route {
            Route::CopyEngine(plan) => return self.run_copy_engine(plan, &stream.s),
            Route::Library(shadow) => shadow,
        };
        // The communicator the call goes to (`call` checks this one's state either way).
        let on = |main: NcclComm| shadow.unwrap_or(main);
        let st = stream.raw();
        let (count, dt) = (op.count, op.dtype.nccl());
        let (s, r) = (
            op.send_address() as *mut c_void,
            op.recv_address() as *mut c_void,
        );
        let fns = &self.api.fns;
        // SAFETY (every call below): `op.check` proved each pointer is this rank's device
        // memory holding what the call reads or writes for `count` elements of the type, on
        // this communicator's device, with roots and peers in range; the stream belongs to
        // the same device; `call` holds the communicator's lock.
        match op.kind {
            Kind::AllReduce { op } => self.call(|c| {
                let c = on(c);
                // SAFETY: see the comment above the match.
                let code = unsafe { (fns.all_reduce)(s, r, count, dt, op.nccl(), c, st) };
                self.check("ncclAllReduce", code)
            }),
            Kind::Broadcast { root } => self.call(|c| {
                let c = on(c);
                // SAFETY: see the comment above the match.
                let code = unsafe { (fns.broadcast)(s, r, count, dt, root as c_int, c, st) };
                self.check("ncclBroadcast", code)
            }),
            Kind::Reduce { op, root } => self.call(|c| {
                let c = on(c);
                // SAFETY: see the comment above the match.
                let code =
                    unsafe { (fns.reduce)(s, r, count, dt, op.nccl(), root as c_int, c, st) };
                self.check("ncclReduce", code)
            }),
            Kind::AllGather => {
                let (send, recv) = op.pair()?;
                // Only this communicator's window kernels have the defect; the second
                // communicator sees an ordinary registration.
                if shadow.is_none() {
                    self.check_window_all_gather(&send, &recv, count * op.dtype.size())?;
                }
                self.call(|c| {
                    let c = on(c);
                    // SAFETY: see the comment above the match.
                    let code = unsafe { (fns.all_gather)(s, r, count, dt, c, st) };
                    self.check("ncclAllGather", code)
                })
            }
            Kind::ReduceScatter { op } => self.call(|c| {
                let c = on(c);
                // SAFETY: see the comment above the match.
                let code = unsafe { (fns.reduce_scatter)(s, r, count, dt, op.nccl(), c, st) };
                self.check("ncclReduceScatter", code)
            }),
            Kind::AllToAll => match self.api.all_to_all {
                Some(a2a) => self.call(|c| {
                    let c = on(c);
                    // SAFETY: see the comment above the match.
                    let code = unsafe { a2a(s, r, count, dt, c, st) };
                    self.check("ncclAlltoAll", code)
                }),
                // No native all-to-all (NCCL < 2.28): one send and one receive per peer in a
                // group, as nccl-tests' alltoall does.
                None => {
                    let b = count * op.dtype.size();
                    self.call(|_| {
                        self.group(|| {
                            for p in 0..self.world {
                                let (ps, pr) =
                                    (s.wrapping_byte_add(p * b), r.wrapping_byte_add(p * b));
                                self.send_recv(ps, count, op.dtype, p, st, true)?;
                                self.send_recv(pr, count, op.dtype, p, st, false)?;
                            }
                            Ok(())
                        })
                    })
                }
            },
            Kind::Send { peer } => {
                self.call(|_| self.send_recv(s, count, op.dtype, peer, st, true))
            }
            Kind::Recv { peer } => {
                self.call(|_| self.send_recv(r, count, op.dtype, peer, st, false))
            }
            Kind::Barrier => self.barrier_on(st),
        }
    }

    fn group_start(&self) -> Result<()> {
        // SAFETY: no arguments.
        let code = unsafe { (self.api.fns.group_start)() };
        self.api.check("ncclGroupStart", code, None)?;
        GROUP_DEPTH.with(|d| d.set(d.get() + 1));
        Ok(())
    }

    fn group_end(&self) -> Result<()> {
        let depth = GROUP_DEPTH.with(|d| {
            d.set(d.get().saturating_sub(1));
            d.get()
        });
        // SAFETY: no arguments; NCCL reports a group_end without group_start as an error.
        let code = unsafe { (self.api.fns.group_end)() };
        let end = self.check("ncclGroupEnd", code);
        if depth > 0 {
            return end;
        }
        // The outermost end launched the group: in non-blocking mode every communicator it
        // called settles before the caller may wait on a stream (NCCL's rule).
        let members = GROUP_MEMBERS.with(|m| std::mem::take(&mut *m.borrow_mut()));
        end?;
        members
            .iter()
            .try_for_each(|m| m.settle("ncclGroupEnd (non-blocking)"))
    }

    fn poll_async_error(&self) -> Result<()> {
        let _g = self.core.locked()?;
        self.core.async_error_locked()
    }

    fn set_timeout(&self, timeout: std::time::Duration) -> Result<()> {
        let t = unicomm_core::env::check_timeout("timeout", timeout)?;
        self.core
            .timeout_ms
            .store(t.as_millis() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn timeout(&self) -> Option<std::time::Duration> {
        Some(self.core.timeout())
    }

    fn set_copy_engine(&self, on: bool) -> Result<()> {
        self.copy_engine_switch(on)
    }

    fn finalize(&mut self) -> Result<()> {
        self.destroy(true)
    }

    fn abort(&self) -> Result<()> {
        self.destroy(false)
    }
}
