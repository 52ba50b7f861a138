//! What the fake-library tests share: building the fake, reading its call counters, a host
//! "device" runtime, and the two vendors' flavours pointed at the fake.
#![allow(dead_code, reason = "each test binary uses some of the helpers")]

use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, OnceLock};

use unicomm_core::{Comm, Result};
use unicomm_nccl_api::{Api, ApiComm, Flavor, Runtime};

/// Builds the fake in one flavour (once per test binary) and returns the library's path.
pub fn fake(feature: &str) -> PathBuf {
    static BUILT: OnceLock<std::sync::Mutex<Vec<(String, PathBuf)>>> = OnceLock::new();
    let built = BUILT.get_or_init(Default::default);
    let mut b = built.lock().unwrap();
    if let Some((_, p)) = b.iter().find(|(f, _)| f == feature) {
        return p.clone();
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-nccl");
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fake-nccl-{feature}"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--offline",
            "--features",
            feature,
            "--manifest-path",
        ])
        .arg(dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .status()
        .expect("run cargo to build the fake NCCL");
    assert!(st.success(), "building the fake NCCL ({feature}) failed");
    let p = target.join("debug/libunicomm_fake_nccl.so");
    b.push((feature.to_string(), p.clone()));
    p
}

pub fn calls(api_path: &Path, name: &str) -> c_int {
    // SAFETY: the fake, already loaded by the test; unicommFakeCalls takes a C string.
    unsafe {
        let lib = libloading::Library::new(api_path).unwrap();
        let f: libloading::Symbol<unsafe extern "C" fn(*const std::ffi::c_char) -> c_int> =
            lib.get(b"unicommFakeCalls\0").unwrap();
        let n = std::ffi::CString::new(name).unwrap();
        f(n.as_ptr())
    }
}

/// Makes the fake's `ncclCommAbort` wait while `held` is above 0 (at most 20 s), as NCCL's
/// abort waits for what holds it (the device, the graphs that captured the communicator's
/// work); `held` must be a static (the library keeps the pointer).
pub fn aborts_wait_while(api_path: &Path, held: &'static std::sync::atomic::AtomicUsize) {
    // SAFETY: the fake's test control in the library the test loaded (kept loaded by it),
    // handed a pointer that lives as long as the process.
    unsafe {
        let lib = libloading::Library::new(api_path).unwrap();
        let f: libloading::Symbol<unsafe extern "C" fn(*const std::sync::atomic::AtomicUsize)> =
            lib.get(b"unicommFakeAbortWaitsFor\0").unwrap();
        f(held);
    }
}

/// How long `release` (the graphs' release of a communicator whose abort `held` holds)
/// took, with `held` let go `after` from now on another thread.
pub fn released_after(
    held: &'static std::sync::atomic::AtomicUsize,
    after: std::time::Duration,
    release: impl FnOnce(),
) -> std::time::Duration {
    let go = std::thread::spawn(move || {
        std::thread::sleep(after);
        held.store(0, std::sync::atomic::Ordering::SeqCst);
    });
    let t = std::time::Instant::now();
    release();
    let waited = t.elapsed();
    go.join().unwrap();
    waited
}

/// The fake library's all-to-all and all-gather calls so far: unchanged across an operation
/// means the copy-engine path moved the data, not the library.
pub fn library_moves(api_path: &Path) -> (c_int, c_int) {
    (
        calls(api_path, "ncclAlltoAll"),
        calls(api_path, "ncclAllGather"),
    )
}

/// While set, every host stream reports work still running (a peer that never arrives).
/// The compute capability the host "device" reports, as `major * 10 + minor` (0: none).
pub static COMPUTE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
pub static HANG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the host runtime can export memory to "other processes" (the copy-engine path
/// for one rank per process); and how many imports and unmaps it saw.
pub static EXPORT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
pub static IMPORTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
pub static UNMAPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

thread_local! {
    /// Whether the host runtime offers stream memory operations (the copy-engine path's
    /// signals) to this thread's rank; on by default, as on CUDA 12+.
    pub static MEM_OPS: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}
/// Whether the host runtime signals peers by writes (`Runtime::signal_by_write`); off by
/// default (copies), as on HIP.
pub static BY_WRITE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Word copies (4-byte copies: signals by copy) and writes of 1 (probes, signals by
/// write) the host runtime performed.
pub static WORD_COPIES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
pub static ONE_WRITES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Signal waits the host runtime performed, and writes (re-arms and probes).
pub static WAITS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Signal waits in progress (a stream held on the device).
pub static WAITING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Stream waits for an event the host runtime was asked for.
pub static EVENT_WAITS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Device-wide waits the host runtime completed (before an owned allocation's free).
pub static DEVICE_SYNCS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Host memory standing in for a device.
#[derive(Debug)]
pub struct Host;

/// A host "stream", numbered so that two of them are told apart (`raw_stream`).
#[derive(Debug)]
pub struct HostStream(usize);

/// The device-API kernel launches the host runtime was asked for: the device
/// communicator's bytes, the operands, the blocks (it runs none: the host has no GPU).
pub static DEVICE_LAUNCHES: std::sync::Mutex<
    Vec<(
        Vec<u8>,
        unicomm_nccl_api::sys::kernel_args::DeviceKernelArgs,
        u32,
    )>,
> = std::sync::Mutex::new(Vec::new());
/// While set, the host runtime gives mapped host memory (a control block) as a GPU
/// runtime does; otherwise it has none, as HIP today.
pub static MAPPED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static NEXT_STREAM: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

/// The host stream of number `raw` (another handle to the same "stream").
pub fn host_stream(raw: usize) -> HostStream {
    HostStream(raw)
}

impl Runtime for Host {
    const NAME: &'static str = "host";
    const VENDOR: &'static str = "host";
    type Stream = HostStream;
    type Graph = std::convert::Infallible;
    fn alloc_host_mapped(&self, _dev: usize, bytes: usize) -> Result<usize> {
        if !MAPPED.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(unicomm_core::Error::unsupported(
                "unicomm's symmetric kernels",
                "CUDA on sm_90 or newer (the kernels' PTX, backend-nccl/kernels)",
                "host: no build of them for this runtime",
            ));
        }
        // Leaked: a control block lives as long as its communicator, and the tests are short.
        Ok(Box::into_raw(vec![0u64; bytes.div_ceil(8)].into_boxed_slice()) as *mut u64 as usize)
    }
    unsafe fn free_host_mapped(&self, _addr: usize) -> Result<()> {
        Ok(())
    }
    unsafe fn launch(
        &self,
        _dev: usize,
        _dtype: unicomm_core::DataType,
        launch: unicomm_nccl_api::sys::kernel_args::Launch<'_>,
        _s: &HostStream,
    ) -> Result<()> {
        use unicomm_nccl_api::sys::kernel_args::Launch;
        let Launch::DeviceApi {
            dev_comm,
            args,
            blocks,
        } = launch
        else {
            return Err(unicomm_core::Error::unsupported(
                "unicomm's symmetric kernels",
                "a runtime with a build of them",
                "the host runtime",
            ));
        };
        DEVICE_LAUNCHES
            .lock()
            .unwrap()
            .push((dev_comm.to_vec(), *args, blocks));
        Ok(())
    }
    fn device_count(&self) -> Result<usize> {
        Ok(1)
    }
    fn with_device<T>(&self, _: usize, f: impl FnOnce() -> Result<T>) -> Result<T> {
        f()
    }
    fn create_stream(&self, _: usize) -> Result<HostStream> {
        Ok(HostStream(NEXT_STREAM.fetch_add(1, SeqCst)))
    }
    fn raw_stream(s: &HostStream) -> *mut c_void {
        s.0 as *mut c_void
    }
    fn synchronize(&self, _: &HostStream) -> Result<()> {
        Ok(())
    }
    fn query(&self, _: &HostStream) -> Result<bool> {
        // A stuck "device" while a test says so (the deadline tests).
        Ok(!HANG.load(std::sync::atomic::Ordering::SeqCst))
    }
    fn synchronize_device(&self, _: usize) -> Result<()> {
        // The stuck "device" holds a device-wide wait until a test unsticks it.
        while HANG.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        DEVICE_SYNCS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
    fn malloc(&self, _: usize, bytes: usize) -> Result<usize> {
        Ok(Box::into_raw(vec![0u8; bytes].into_boxed_slice()) as *mut u8 as usize)
    }
    unsafe fn free(&self, _: usize, _ptr: usize) -> Result<()> {
        // Leaked: the size is not known here, and the tests are short.
        Ok(())
    }
    unsafe fn htod(&self, _: usize, dst: usize, src: &[u8], _: &HostStream) -> Result<()> {
        // SAFETY: `dst` holds `src.len()` bytes (trait contract).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }
    unsafe fn dtoh(&self, _: usize, dst: &mut [u8], src: usize, _: &HostStream) -> Result<()> {
        // SAFETY: `src` holds `dst.len()` bytes (trait contract).
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
    fn describe(&self) -> String {
        "host".into()
    }
    type Event = std::time::Instant;
    fn record(&self, _: &HostStream) -> Result<std::time::Instant> {
        // The host stream is synchronous: its work is done when enqueued.
        Ok(std::time::Instant::now())
    }
    fn event_done(&self, _: &std::time::Instant) -> Option<bool> {
        Some(true)
    }
    fn elapsed_ms(&self, a: &std::time::Instant, b: &std::time::Instant) -> Result<f64> {
        Ok(b.saturating_duration_since(*a).as_secs_f64() * 1e3)
    }
    fn launch_event(&self, _: usize) -> Result<(std::time::Instant, usize)> {
        // A handle the fake only tells from null.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0x1000);
        Ok((std::time::Instant::now(), NEXT.fetch_add(16, SeqCst)))
    }
    fn wait_event(&self, _: usize, _: &HostStream, _: &std::time::Instant) -> Result<()> {
        EVENT_WAITS.fetch_add(1, SeqCst);
        Ok(())
    }
    fn mem_info(&self, _: usize) -> Result<(usize, usize)> {
        Ok((0, 0))
    }
    fn compute_capability(&self, _: usize) -> Option<(u32, u32)> {
        let c = COMPUTE.load(SeqCst);
        (c != 0).then_some((c / 10, c % 10))
    }
    fn enable_peer_access(&self, _: usize, _: usize) -> Result<()> {
        Ok(())
    }
    fn export_memory(&self, _: usize, addr: usize) -> Result<unicomm_nccl_api::runtime::Exported> {
        if !EXPORT.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(unicomm_core::Error::unsupported(
                "export",
                "EXPORT",
                "this test",
            ));
        }
        // A memfd carrying the address: host "devices" share one address space, so the
        // importer maps nothing and gets the address back.
        let fd = nix::sys::memfd::memfd_create(
            c"unicomm-host-export",
            nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
        )
        .map_err(|e| unicomm_core::Error::invalid("memfd", e.to_string()))?;
        nix::unistd::write(&fd, &addr.to_le_bytes())
            .map_err(|e| unicomm_core::Error::invalid("memfd", e.to_string()))?;
        Ok(unicomm_nccl_api::runtime::Exported {
            fd,
            base: addr,
            size: 1 << 20,
        })
    }
    fn import_memory(&self, _: usize, fd: std::os::fd::BorrowedFd<'_>, _: usize) -> Result<usize> {
        let mut b = [0u8; 8];
        nix::sys::uio::pread(fd, &mut b, 0)
            .map_err(|e| unicomm_core::Error::invalid("memfd", e.to_string()))?;
        IMPORTS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(usize::from_le_bytes(b))
    }
    unsafe fn unmap_imported(&self, _: usize, _: usize, _: usize) -> Result<()> {
        UNMAPS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
    unsafe fn copy_async(
        &self,
        _: usize,
        dst: usize,
        src: usize,
        bytes: usize,
        _: &HostStream,
    ) -> Result<()> {
        if bytes == 4 && dst.is_multiple_of(4) && src.is_multiple_of(4) {
            // A word copy may be a signal that another rank's thread is waiting on: atomic,
            // so the waiter's loads see it without a data race (the copy engine's write).
            // SAFETY: the trait contract: both words are live, aligned (checked).
            let v = unsafe { (*(src as *const std::sync::atomic::AtomicU32)).load(SeqCst) };
            // SAFETY: as above.
            unsafe { (*(dst as *const std::sync::atomic::AtomicU32)).store(v, SeqCst) };
            WORD_COPIES.fetch_add(1, SeqCst);
            return Ok(());
        }
        // SAFETY: the trait contract: both ranges are live for `bytes`.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    }
    fn stream_memory_ops(&self, _: usize) -> bool {
        MEM_OPS.with(|m| m.get())
    }
    fn signal_by_write(&self, _: usize) -> bool {
        BY_WRITE.load(SeqCst)
    }
    unsafe fn wait_value32(&self, _: usize, addr: usize, value: u32, _: &HostStream) -> Result<()> {
        // The host stream is synchronous: the wait blocks the enqueuing thread until a peer
        // thread writes the word (with a deadline, so a broken protocol fails the test).
        WAITS.fetch_add(1, SeqCst);
        WAITING.fetch_add(1, SeqCst);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        // SAFETY: the trait contract: an aligned live word.
        let w = unsafe { &*(addr as *const std::sync::atomic::AtomicU32) };
        let mut r = Ok(());
        while w.load(SeqCst) != value {
            if std::time::Instant::now() > deadline {
                r = Err(unicomm_core::Error::Timeout {
                    what: format!("host wait for {value} at {addr:#x}"),
                    after: std::time::Duration::from_secs(20),
                });
                break;
            }
            std::thread::yield_now();
        }
        WAITING.fetch_sub(1, SeqCst);
        r
    }
    unsafe fn write_value32(
        &self,
        _: usize,
        addr: usize,
        value: u32,
        _: &HostStream,
    ) -> Result<()> {
        // SAFETY: the trait contract: an aligned live word.
        unsafe { (*(addr as *const std::sync::atomic::AtomicU32)).store(value, SeqCst) };
        if value == 1 {
            ONE_WRITES.fetch_add(1, SeqCst);
        }
        Ok(())
    }
}

pub fn nccl_like(dir: PathBuf) -> Vec<PathBuf> {
    vec![dir]
}

/// The two vendors' flavours as the library defines them (one table: the symbol names and
/// version floors these tests gate on are the real ones).
pub use unicomm_nccl_api::flavor::{NCCL, RCCL};

/// NCCL's (or RCCL's) flavour pointed at the fake; `no_a2a`: without a native all-to-all,
/// to force the grouped send/recv fallback.
pub fn flavors(no_a2a: bool, rccl: bool) -> &'static Flavor {
    let base: &Flavor = if rccl { &RCCL } else { &NCCL };
    let f = Flavor {
        library: base.library,
        env_var: "UNICOMM_FAKE_UNUSED",
        dirs: || nccl_like("/nonexistent".into()),
        sonames: base.sonames,
        all_to_all: if no_a2a { &[] } else { base.all_to_all },
        registration_since: base.registration_since,
        windows_since: base.windows_since,
        mem_alloc_since: base.mem_alloc_since,
        gather_since: base.gather_since,
        fp8_reduce_since: base.fp8_reduce_since,
    };
    Box::leak(Box::new(f))
}

pub fn comm(flavor: &'static Flavor, path: &Path) -> Comm<ApiComm<Host>> {
    let api = Arc::new(Api::open(flavor, path).expect("load the fake"));
    let mut v = ApiComm::init_local(api, Arc::new(Host), &[0]).expect("init");
    Comm::from_backend(v.remove(0))
}

/// `w` ranks on threads, each joined with `init_rank` (as one rank per process would be;
/// the fake's barrier worlds, `FAKE_NCCL_BARRIER_WORLDS=1`), each running `f(rank, comm)`:
/// what each returned, in rank order.
pub fn on_ranks<T: Send>(
    flavor: &'static Flavor,
    path: &Path,
    w: usize,
    f: impl Fn(usize, Comm<ApiComm<Host>>) -> T + Sync,
) -> Vec<T> {
    let api = Arc::new(Api::open(flavor, path).expect("load the fake"));
    let id = api.unique_id().unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..w)
            .map(|r| {
                let (api, f) = (api.clone(), &f);
                s.spawn(move || {
                    f(
                        r,
                        Comm::from_backend(
                            ApiComm::init_rank(api, Arc::new(Host), id, r, w, 0).unwrap(),
                        ),
                    )
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

/// The median of each mode's rounds of `n` calls, in nanoseconds per call (the timing
/// benchmarks).
pub fn medians_ns(t: &mut [Vec<std::time::Duration>], n: u32) -> Vec<f64> {
    t.iter_mut()
        .map(|v| {
            v.sort();
            v[v.len() / 2].as_nanos() as f64 / f64::from(n)
        })
        .collect()
}

/// The smallest all-reduce: the first two f32 of `$a` summed into `$b`'s on `$st` (8 bytes,
/// the size the window and the call-cost tests use). The call's result.
#[macro_export]
macro_rules! sum_two {
    ($c:expr, $a:expr, $b:expr, $st:expr) => {
        $c.all_reduce(
            &$a.slice(..2).unwrap(),
            &mut $b.slice_mut(..2).unwrap(),
            unicomm_core::ReduceOp::Sum,
            $st,
        )
    };
}
