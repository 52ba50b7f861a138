//! The runtime's export and import of device memory on a real GPU (the copy-engine path
//! across processes): in one process, between two processes on one GPU (`Pair`), and
//! through `init_rank` communicators.

#![allow(
    unsafe_code,
    reason = "the copy-engine path's building blocks driven directly on a GPU"
)]

use unicomm_core::{Comm, Error, Result};

use super::{thread_world, Gpu};
use unicomm_nccl_api::Runtime;

/// The runtime's export and import (the copy-engine path across processes): a buffer
/// from the library's allocator, exported and mapped again in this process, shows the same
/// bytes and takes writes; unmapped after.
pub fn export_import_round_trip<R: Runtime>(g: &Gpu<R>) -> Result<()> {
    use unicomm_core::backend::DeviceMemory;
    let cs = g.comms(1)?;
    let c = &cs[0];
    let (rt, dev) = (c.backend().runtime().clone(), c.backend().device());
    let st = c.create_stream()?;
    let n = 1 << 20;
    let mut a = c.alloc::<u32>(n)?;
    a.copy_from_host(&(0..n as u32).collect::<Vec<u32>>(), &st)?;
    st.synchronize()?;
    let addr = a.memory().address();
    let x = rt.export_memory(dev, addr)?;
    assert!(
        x.base <= addr && addr + 4 * n <= x.base + x.size,
        "{x:?} for {addr:#x}"
    );
    let va = rt.import_memory(dev, std::os::fd::AsFd::as_fd(&x.fd), x.size)?;
    let at = va + (addr - x.base);
    let b = c.alloc::<u32>(n)?;
    // SAFETY: `at` maps `a`'s 4n bytes (checked above); `b` holds 4n bytes; both live
    // until the stream is synchronized below.
    unsafe { rt.copy_async(dev, b.memory().address(), at, 4 * n, st.inner()) }?;
    assert_eq!(b.copy_to_host(&st)?, (0..n as u32).collect::<Vec<u32>>());
    let ones = c.alloc::<u32>(n)?;
    let mut ones = ones;
    ones.copy_from_host(&vec![1u32; n], &st)?;
    // SAFETY: as above, the other way: written through the mapping.
    unsafe { rt.copy_async(dev, at, ones.memory().address(), 4 * n, st.inner()) }?;
    assert_eq!(a.copy_to_host(&st)?, vec![1u32; n]);
    // SAFETY: the mapping made above, idle (the stream was synchronized by copy_to_host).
    unsafe { rt.unmap_imported(dev, va, x.size) }?;
    Ok(())
}

/// The variable that makes a re-run of the test binary the second process of a [`Pair`]
/// (its value: the exchange's job, in hex).
const IPC_CHILD: &str = "UNICOMM_GPU_TEST_IPC_CHILD";

/// The two processes of a test on one GPU: the test re-runs its own binary as the second
/// process (`test` is its libtest name) and the two swap exported memory through the
/// exchange the copy-engine path uses (abstract Unix sockets, `SCM_RIGHTS`, agreement). One
/// deadline bounds the whole test.
#[cfg(target_os = "linux")]
pub(crate) struct Pair {
    /// 0 in the process the test harness started, 1 in the one it started itself.
    pub(crate) me: usize,
    pub(crate) deadline: std::time::Instant,
    listener: unicomm_nccl_api::testing::Listener,
    kid: Option<std::process::Child>,
}

#[cfg(target_os = "linux")]
impl Pair {
    /// This process's side: in the first process, starts the second and waits (until the
    /// deadline) for its socket.
    pub(crate) fn start(test: &str) -> Result<Pair> {
        use std::time::{Duration, Instant};
        let child = std::env::var(IPC_CHILD).ok();
        let me = usize::from(child.is_some());
        let seed: Vec<u8> = match &child {
            Some(h) => (0..h.len() / 2)
                .filter_map(|i| u8::from_str_radix(h.get(2 * i..2 * i + 2)?, 16).ok())
                .collect(),
            None => format!("{:?}{}", Instant::now(), std::process::id()).into_bytes(),
        };
        let job = unicomm_nccl_api::testing::Job::from_id(&seed);
        let listener = unicomm_nccl_api::testing::Listener::bind(job, 0, me)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut kid = None;
        if me == 0 {
            let hex: String = seed.iter().map(|b| format!("{b:02x}")).collect();
            let exe = std::env::current_exe().map_err(|e| Error::invalid("test", e.to_string()))?;
            kid = Some(
                std::process::Command::new(exe)
                    .args(["--exact", test, "--test-threads=1", "--nocapture"])
                    .env(IPC_CHILD, hex)
                    .spawn()
                    .map_err(|e| {
                        Error::invalid("test", format!("starting the second process: {e}"))
                    })?,
            );
            // The child's listener must exist before the exchange (the copy-engine path has a
            // barrier collective for this).
            let name = format!("@{}", job.name(0, 1));
            while !std::fs::read_to_string("/proc/net/unix").is_ok_and(|t| t.contains(&name)) {
                if Instant::now() >= deadline {
                    return Err(Error::invalid(
                        "test",
                        "the second process never bound its socket",
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(Pair {
            me,
            deadline,
            listener,
            kid,
        })
    }

    /// Offers `bytes` of this process's memory at `addr` (of device `dev`, from the library's
    /// allocator) and maps the peer's offer: `(mapping, offset of its bytes in it, size)`.
    pub(crate) fn swap<R: Runtime>(
        &self,
        rt: &R,
        dev: usize,
        addr: usize,
        bytes: usize,
    ) -> Result<(usize, usize, usize)> {
        let x = rt.export_memory(dev, addr)?;
        let offer = unicomm_nccl_api::testing::Offer {
            size: x.size as u64,
            offset: (addr - x.base) as u64,
            bytes: bytes as u64,
        };
        let mut mapped = None;
        let agreed = unicomm_nccl_api::testing::exchange(
            &self.listener,
            2,
            Some((offer, std::os::fd::AsFd::as_fd(&x.fd))),
            self.deadline,
            |_, o, fd| {
                let va = rt.import_memory(dev, fd, o.size as usize)?;
                mapped = Some((va, o.offset as usize, o.size as usize));
                Ok(())
            },
        )?;
        assert!(
            agreed,
            "process {}: the two processes did not agree",
            self.me
        );
        Ok(mapped.expect("the peer's memory was mapped"))
    }

    /// In the first process: waits (until the deadline) for the second to pass.
    pub(crate) fn finish(self) -> Result<()> {
        use std::time::Duration;
        let Some(mut k) = self.kid else {
            return Ok(());
        };
        let status = loop {
            if let Some(s) = k
                .try_wait()
                .map_err(|e| Error::invalid("test", e.to_string()))?
            {
                break s;
            }
            if std::time::Instant::now() >= self.deadline {
                let _ = k.kill();
                return Err(Error::invalid("test", "the second process did not finish"));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "the second process failed: {status}");
        Ok(())
    }
}

/// Memory exported in one process and mapped in another (`Pair`), on the same GPU, so one
/// GPU suffices. Each process reads the other's bytes through its mapping; the child then
/// writes through it and the parent sees the write.
#[cfg(target_os = "linux")]
pub fn export_import_across_processes<R: Runtime>(g: &Gpu<R>, test: &str) -> Result<()> {
    use unicomm_core::backend::DeviceMemory;
    let pair = Pair::start(test)?;
    let me = pair.me;
    let cs = g.comms(1)?;
    let c = &cs[0];
    let (rt, dev) = (c.backend().runtime().clone(), c.backend().device());
    let st = c.create_stream()?;
    let n = 1 << 20;
    let mine = |r: usize| 7 * r as u32 + 1;
    let mut a = c.alloc::<u32>(n)?;
    a.copy_from_host(&vec![mine(me); n], &st)?;
    st.synchronize()?;
    let (va, off, size) = pair.swap(&*rt, dev, a.memory().address(), 4 * n)?;
    let b = c.alloc::<u32>(n)?;
    // SAFETY: `va + off` maps the peer's 4n bytes (its offer); `b` holds 4n bytes; both stay
    // alive until the stream is synchronized by copy_to_host.
    unsafe { rt.copy_async(dev, b.memory().address(), va + off, 4 * n, st.inner()) }?;
    assert_eq!(
        b.copy_to_host(&st)?,
        vec![mine(1 - me); n],
        "process {me} read its peer"
    );
    if me == 1 {
        let mut w = c.alloc::<u32>(n)?;
        w.copy_from_host(&vec![99; n], &st)?;
        // SAFETY: as above, written through the mapping; synchronized below.
        unsafe { rt.copy_async(dev, va + off, w.memory().address(), 4 * n, st.inner()) }?;
        st.synchronize()?;
    }
    // SAFETY: the mapping made above, idle (the stream was synchronized).
    unsafe { rt.unmap_imported(dev, va, size) }?;
    if me == 0 {
        pair.finish()?;
        assert_eq!(
            a.copy_to_host(&st)?,
            vec![99; n],
            "the child's write through its mapping"
        );
    }
    Ok(())
}

/// The copy-engine path for ranks joined with `init_rank` (one per thread here; the same
/// code serves one per process): windows are exported, swapped over the exchange and
/// mapped; all_to_all and all_gather take the path (counted) and move exact data.
pub fn copy_engine_init_rank<R: Runtime>(g: &Gpu<R>) -> Result<()> {
    let w = thread_world(g)?;
    let id = (g.vendor.unique_id)()?;
    let init = g.vendor.init_rank;
    let n = 1001; // elements per rank: not a multiple of anything convenient
    let out: Vec<Result<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..w)
            .map(|r| {
                s.spawn(move || -> Result<u64> {
                    let c = Comm::from_backend(init(id, r, w, r)?);
                    assert!(c.capabilities().copy_engine);
                    c.set_copy_engine(true)?;
                    let st = c.create_stream()?;
                    let mut send = c.alloc::<u32>(w * n)?;
                    let data: Vec<u32> = (0..w * n).map(|i| (r * 1_000_000 + i) as u32).collect();
                    send.copy_from_host(&data, &st)?;
                    let mut recv = c.register_window(c.alloc::<u32>(w * n)?)?;
                    for _ in 0..3 {
                        c.all_to_all(&send, &mut recv, &st)?;
                    }
                    let got = recv.copy_to_host(&st)?;
                    for p in 0..w {
                        for i in 0..n {
                            assert_eq!(
                                got[p * n + i],
                                (p * 1_000_000 + r * n + i) as u32,
                                "all_to_all rank {r} from {p} at {i}"
                            );
                        }
                    }
                    c.all_gather(&send.slice(..n)?, &mut recv, &st)?;
                    let got = recv.copy_to_host(&st)?;
                    for p in 0..w {
                        for i in 0..n {
                            assert_eq!(
                                got[p * n + i],
                                (p * 1_000_000 + i) as u32,
                                "all_gather rank {r} from {p} at {i}"
                            );
                        }
                    }
                    let took = c.backend().copy_engine_calls();
                    // The ranks' mechanism: signals wherever the runtime has them (the
                    // default), nothing to wait for in a world of one.
                    let want = if w == 1 {
                        unicomm_nccl_api::CopyEngineSync::Alone
                    } else if unicomm_nccl_api::testing::wanted()?
                        == unicomm_nccl_api::CopyEngineSync::Barrier
                        || !(g.vendor.runtime)()?.stream_memory_ops(r)
                    {
                        unicomm_nccl_api::CopyEngineSync::Barrier
                    } else {
                        unicomm_nccl_api::CopyEngineSync::Signals
                    };
                    assert_eq!(c.backend().copy_engine_sync(), Some(want), "rank {r}");
                    c.deregister_window(recv)?;
                    drop(send);
                    c.finalize()?;
                    Ok(took)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    for o in out {
        assert_eq!(
            o?, 4,
            "every all_to_all and the all_gather took the copy-engine path"
        );
    }
    Ok(())
}
