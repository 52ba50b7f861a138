//! unicomm's GPU tests (not published): the conformance suite over real GPUs and the tests
//! every NCCL-API library must pass, one test file per area (`tests/`), each generic over
//! the vendor through one value, [`GPU`]: NCCL on CUDA with `--features nccl`, RCCL on HIP
//! with `--features rccl` (one vendor per build). Run by `cargo xtask test --vendor
//! cuda|rocm` or the GPU bundle. Without the vendor's GPU every test fails with `NoDevice`
//! or `LibraryNotFound`: nothing is skipped. Without either feature the test files are
//! empty (the workspace's CPU tests build them, and run none).

#![deny(unsafe_code)]

use std::sync::Mutex;

use unicomm_conformance::{Case, CaseFn, Failure, Harness};
use unicomm_core::{Comm, Error, ReduceOp, Result, Version};

use unicomm_nccl_api::{Api, ApiComm, Runtime, UniqueId};

/// Test functions that each run one of this crate's checks on the vendor's GPUs: `name =>
/// check;` (or `check("arg")`), the check called with [`GPU`] and the arguments, its
/// attributes and doc comment kept.
#[macro_export]
macro_rules! on_gpu {
    ($($(#[$m:meta])* $name:ident => $check:ident $(($($arg:expr),*))?;)*) => {
        $(
            $(#[$m])*
            #[test]
            fn $name() -> unicomm_core::Result<()> {
                $crate::$check(&$crate::GPU $($(, $arg)*)?)
            }
        )*
    };
}

#[cfg(feature = "nccl")]
/// NCCL on CUDA.
pub static NCCL: Gpu<unicomm_nccl::CudaRuntime> = Gpu::new(Vendor {
    backend: "nccl",
    library: "NCCL",
    local_comms: unicomm_nccl::local_comms,
    unique_id: unicomm_nccl::unique_id,
    init_rank: unicomm_nccl::init_rank,
    api: unicomm_nccl::nccl,
    runtime: unicomm_nccl::cuda,
});

#[cfg(feature = "rccl")]
/// RCCL on HIP.
pub static RCCL: Gpu<unicomm_rccl::HipRuntime> = Gpu::new(Vendor {
    backend: "rccl",
    library: "RCCL",
    local_comms: unicomm_rccl::local_comms,
    unique_id: unicomm_rccl::unique_id,
    init_rank: unicomm_rccl::init_rank,
    api: unicomm_rccl::rccl,
    runtime: unicomm_rccl::hip,
});

/// The vendor this build tests (NCCL where both features are on).
#[cfg(feature = "nccl")]
pub use NCCL as GPU;
/// The vendor this build tests.
#[cfg(all(feature = "rccl", not(feature = "nccl")))]
pub use RCCL as GPU;

mod ipc;
mod signals;
mod signals_cases;
#[cfg(target_os = "linux")]
pub use ipc::export_import_across_processes;
pub use ipc::{copy_engine_init_rank, export_import_round_trip};
pub use signals::{signals_order_two_streams, signals_released_by_the_host};
#[cfg(target_os = "linux")]
pub use signals_cases::signals_across_processes;
pub use signals_cases::{signals_latency_on_one_gpu, signals_replay_in_a_graph, Capture};

/// What a vendor crate hands the harness: its entry points.
pub struct Vendor<R: Runtime> {
    /// "nccl" or "rccl" (`Capabilities::backend`).
    pub backend: &'static str,
    /// "NCCL" or "RCCL" (`Error::Library::library`).
    pub library: &'static str,
    /// `n` communicators on the first `n` GPUs, from this thread.
    pub local_comms: fn(Option<usize>) -> Result<Vec<ApiComm<R>>>,
    /// A new unique id.
    pub unique_id: fn() -> Result<UniqueId>,
    /// One rank of a world, on one GPU.
    pub init_rank: fn(UniqueId, usize, usize, usize) -> Result<ApiComm<R>>,
    /// The loaded library.
    pub api: fn() -> Result<std::sync::Arc<Api>>,
    /// The device runtime.
    pub runtime: fn() -> Result<std::sync::Arc<R>>,
}

/// One world of communicators kept by the harness, by size.
type World<R> = (usize, Vec<Comm<ApiComm<R>>>);

/// The conformance harness over a vendor's GPUs: one world per size, created once and kept
/// (communicator creation takes long); a lock keeps two cases off the GPUs at once.
pub struct Gpu<R: Runtime> {
    vendor: Vendor<R>,
    worlds: Mutex<Vec<World<R>>>,
}

impl<R: Runtime> Gpu<R> {
    /// The harness for `vendor`.
    pub const fn new(vendor: Vendor<R>) -> Self {
        Gpu {
            vendor,
            worlds: Mutex::new(Vec::new()),
        }
    }

    /// `n` fresh communicators.
    pub fn comms(&self, n: usize) -> Result<Vec<Comm<ApiComm<R>>>> {
        Ok((self.vendor.local_comms)(Some(n))?
            .into_iter()
            .map(Comm::from_backend)
            .collect())
    }
}

/// Elements per rank of a per-rank collective's case (as the suite shapes it).
impl<R: Runtime> Harness for Gpu<R> {
    type C = ApiComm<R>;

    fn with_comms(
        &self,
        world: usize,
        f: &mut CaseFn<'_, ApiComm<R>>,
    ) -> std::result::Result<(), Failure> {
        let mut worlds = self.worlds.lock().unwrap_or_else(|e| e.into_inner());
        if !worlds.iter().any(|(w, _)| *w == world) {
            worlds.push((world, self.comms(world)?));
        }
        match worlds.iter().find(|(w, _)| *w == world) {
            Some((_, comms)) => f(comms),
            None => Err(Failure::msg("world vanished")),
        }
    }

    /// NCCL 2.28's symmetric in-place all-gather with chunks that are not a multiple of 4
    /// bytes is refused by the shared layer (it corrupts data; measured on 1x H200); the same
    /// check applies to RCCL, which reports the NCCL API it implements.
    fn unsupported(&self, case: &Case) -> bool {
        refuses(self.vendor.backend, case)
    }
}

/// The world size of the specific tests: `UNICOMM_GPU_WORLD` (the run script sets it to the
/// machine's GPU count), 1..=1024, default 2. A machine with fewer GPUs fails them with
/// `NoDevice`; a bad value is `InvalidArgument` naming the variable.
pub fn world() -> Result<usize> {
    let n = unicomm_core::env::whole_number("UNICOMM_GPU_WORLD", 2, 1..=1024, "GPUs")?;
    Ok(n as usize)
}

/// [`world`] for the tests that start one `init_rank` per thread: `NoDevice` at once when
/// the machine has fewer GPUs (a rank whose GPU is missing fails, and its peers would wait
/// for it in `ncclCommInitRank` until the deadline).
pub(crate) fn thread_world<R: Runtime>(g: &Gpu<R>) -> Result<usize> {
    let w = world()?;
    let n = (g.vendor.runtime)()?.device_count()?;
    if w > n {
        return Err(Error::NoDevice {
            vendor: R::NAME,
            detail: format!("UNICOMM_GPU_WORLD={w} ranks need {w} GPUs, {n} visible"),
        });
    }
    Ok(w)
}

/// The suite's process groups (split, the mesh, gather/scatter, the variable-size
/// exchanges, scaled sums, fp8, ordering between streams) on one communicator per GPU of
/// [`world`], one thread each.
pub fn groups<R: Runtime>(g: &Gpu<R>) -> std::result::Result<(), Failure> {
    let w = thread_world(g)?;
    let refused = |check: &str| refuses_group_check(g.vendor.backend, check, w);
    unicomm_conformance::run_groups_refusing(&g.comms(w)?, &refused)
}

/// Runs `f` on one thread per communicator; results in rank order.
pub fn each<C: unicomm_core::Collective, T: Send>(
    cs: &[Comm<C>],
    f: impl Fn(&Comm<C>) -> T + Sync,
) -> Vec<T> {
    let f = &f;
    match unicomm_core::each_rank(cs, |c| Ok::<T, std::convert::Infallible>(f(c))) {
        Ok(v) => v,
        Err(never) => match never {},
    }
}

/// The loaded library's capabilities are reported truthfully.
pub fn capabilities<R: Runtime>(g: &Gpu<R>) -> Result<()> {
    let cs = g.comms(1)?;
    let caps = cs[0].capabilities();
    println!("{caps:?}");
    assert_eq!(caps.backend, g.vendor.backend);
    assert!(caps.version >= Version::new(2, 0, 0));
    // NCCL 2.28 (and RCCL reporting it) have every feature.
    if caps.version >= Version::new(2, 28, 0) {
        assert!(caps.registration && caps.windows && caps.native_all_to_all && caps.mem_alloc);
    }
    Ok(())
}

/// Registration rules: a foreign registration and a double deregistration are errors.
pub fn registration_rules<R: Runtime>(g: &Gpu<R>) -> Result<()> {
    use unicomm_core::Collective;
    // Two worlds of one rank each: b is "another communicator" for a's registration.
    let (ca, cb) = (g.comms(1)?, g.comms(1)?);
    let (a, b) = (&ca[0], &cb[0]);
    let reg = a.register(a.alloc::<f32>(1024)?)?;
    assert!(b.deregister(reg).is_err());
    let mem = a.backend().alloc(4096)?;
    let h = a.backend().register(&mem, 0, 4096)?;
    a.backend().deregister(h)?;
    assert!(matches!(
        a.backend().deregister(h),
        Err(Error::InvalidArgument { .. })
    ));
    Ok(())
}

/// One thread per GPU, each joining with the shared unique id (`ncclCommInitRank`).
pub fn init_rank_per_thread<R: Runtime>(g: &Gpu<R>) -> Result<()> {
    let w = thread_world(g)?;
    let id = (g.vendor.unique_id)()?;
    let init = g.vendor.init_rank;
    let out: Vec<Result<f64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..w)
            .map(|r| {
                s.spawn(move || {
                    let c = Comm::from_backend(init(id, r, w, r)?);
                    let st = c.create_stream()?;
                    let mut b = c.alloc::<f64>(10)?;
                    b.copy_from_host(&[r as f64 + 1.0; 10], &st)?;
                    c.all_reduce_in_place(&mut b, ReduceOp::Prod, &st)?;
                    let v = b.copy_to_host(&st)?[9];
                    drop(b);
                    c.finalize()?;
                    Ok(v)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let want: f64 = (1..=w).map(|r| r as f64).product();
    for o in out {
        assert_eq!(o?, want);
    }
    Ok(())
}

/// Windows: registered collectively, used, deregistered; a NULL window would be
/// `Unsupported`, which fails this test on a machine that should support them.
pub fn windows<R: Runtime>(g: &Gpu<R>) -> Result<()> {
    let w = world()?;
    let cs = g.comms(w)?;
    let out = each(&cs, |c| -> Result<f32> {
        let st = c.create_stream()?;
        let mut b = c.alloc::<f32>(1 << 16)?;
        b.copy_from_host(&vec![2.0; 1 << 16], &st)?;
        st.synchronize()?;
        let mut win = c.register_window(b)?;
        c.all_reduce_in_place(&mut win, ReduceOp::Sum, &st)?;
        let v = win.copy_to_host(&st)?[100];
        c.deregister_window(win)?;
        Ok(v)
    });
    for o in out {
        assert_eq!(o?, 2.0 * w as f32);
    }
    Ok(())
}

/// Window and automatic registration inside `Comm::group` are refused before NCCL sees
/// them (NCCL would defer them to the group's end and write their out-parameter after the
/// call returned); the communicator stays usable: both work outside, and a collective
/// inside a group still runs.
pub fn registration_in_group_refused<R: Runtime>(g: &Gpu<R>) -> Result<()> {
    let w = world()?;
    let cs = g.comms(w)?;
    let out = each(&cs, |c| -> Result<f32> {
        let refused = c.group(|| {
            let win = c
                .register_window(c.alloc::<f32>(256)?)
                .map_err(|e| e.error)?;
            c.deregister_window(win).map(|_| ())
        });
        assert!(
            matches!(&refused, Err(Error::InvalidArgument { .. })),
            "window inside a group: {refused:?}"
        );
        let refused = c.group(|| {
            c.register_auto(c.alloc::<f32>(256)?)
                .map(|_| ())
                .map_err(|e| e.error)
        });
        assert!(
            matches!(&refused, Err(Error::InvalidArgument { .. })),
            "automatic registration inside a group: {refused:?}"
        );
        let st = c.create_stream()?;
        let mut win = c.register_window(c.alloc::<f32>(256)?)?;
        win.copy_from_host(&[1.5; 256], &st)?;
        c.group(|| c.all_reduce_in_place(&mut win, ReduceOp::Sum, &st))?;
        let v = win.copy_to_host(&st)?[255];
        c.deregister_window(win)?;
        Ok(v)
    });
    for o in out {
        assert_eq!(o?, 1.5 * w as f32);
    }
    Ok(())
}
/// A failing result code becomes `Error::Library` with the code, its name and the
/// library's own message.
pub fn errors_carry_code<R: Runtime>(g: &Gpu<R>) -> Result<()> {
    let api = (g.vendor.api)()?;
    match api.check("ncclAllReduce", 4, None) {
        Err(Error::Library {
            library,
            code,
            name,
            message,
            ..
        }) => {
            assert_eq!(
                (library, code, name),
                (g.vendor.library, 4, "ncclInvalidArgument")
            );
            assert!(!message.is_empty(), "ncclGetErrorString gave nothing");
            println!("as the library says it: {message}");
            Ok(())
        }
        other => Err(Error::invalid(
            "check",
            format!("expected Library, got {other:?}"),
        )),
    }
}

/// The cases `backend` ("nccl", "rccl") refuses by design
/// ([`unicomm_conformance::refused_by_design`]): for RCCL also every reduction of the 8-bit
/// floats (RCCL's fp8 on MI300 is the FNUZ encoding, and unicomm refuses rather than
/// reinterpret OCP bytes; moving fp8 works). NCCL on the GPU machine (2.28.9, sm90) reduces
/// fp8.
pub fn refuses(backend: &str, case: &Case) -> bool {
    unicomm_conformance::refused_by_design(case, backend != "rccl")
}

/// The process-group checks `backend` refuses by design on a world of `world` ranks.
pub fn refuses_group_check(backend: &str, check: &str, world: usize) -> bool {
    unicomm_conformance::group_check_refused_by_design(check, world, backend != "rccl")
}
