//! unicomm's kernels on CUDA: the PTX built from their CUDA C++ (by `cargo xtask kernels`:
//! the symmetric kernels' in nccl-api, shared with HIP-on-CUDA, the device-API kernel's in
//! `kernels/` here), each module loaded into a device's primary context at first use, one function
//! per element type: the symmetric kernels (one thread block) and the device-API kernel (a
//! block per LSA barrier); and the control block's host memory the device maps.

#![allow(
    unsafe_code,
    reason = "the CUDA driver's module, launch and host-memory calls"
)]

use std::ffi::{c_void, CString};

use cudarc::driver::{result, sys};
use unicomm_core::{DataType, Error, Result};
use unicomm_nccl_api::sys::kernel_args::{
    self, DeviceKernelArgs, KernelParams, Launch, DEVICE_KERNEL_DEV_COMM_BYTES,
};

use crate::dependent::{dependent_launch, launch_dependent};
use crate::driver_error::cuda_err;
use crate::runtime::CudaRuntime;
use unicomm_nccl_api::Runtime;

/// One module of unicomm's kernels: its image (built from the source beside it) and its
/// function per element type.
#[derive(Debug)]
pub(crate) struct Module {
    /// What the errors name.
    what: &'static str,
    /// The driver calls, as the errors name them.
    calls: [&'static str; 2],
    image: Image,
    /// The functions for f32, f16, bf16.
    names: [&'static str; 3],
    /// An empty kernel of the module, where it has one.
    empty: Option<&'static str>,
    /// Whether a grid larger than the device holds at once is shrunk to it (the kernels'
    /// blocks share out any size of work) rather than refused (one block per barrier).
    shrinks: bool,
    /// Whether its kernels wait for the grid before them (`griddepcontrol.wait` first) and
    /// so may be launched with programmatic dependent launch.
    dependent: bool,
}

/// What a module's image is.
#[derive(Debug)]
enum Image {
    /// PTX text (the device-API kernel's: sm_90, ISA 9.0, CUDA 13.0's driver or newer).
    Ptx(&'static str),
    /// A fat binary (the symmetric kernels': SASS for sm_90 and sm_100 and PTX of ISA 8.3,
    /// CUDA 12.3's driver or newer).
    Fatbin(&'static [u8]),
}

/// The symmetric kernels (nccl-api's `kernels/symmetric.cu`, one source for every
/// runtime): one `Params` by value.
pub(crate) const SYMMETRIC: Module = Module {
    what: "unicomm's symmetric kernels",
    calls: [
        "cuModuleLoadData (unicomm's symmetric kernels)",
        "cuLaunchKernel (unicomm's symmetric kernel)",
    ],
    image: Image::Fatbin(kernel_args::SYMMETRIC_IMAGE),
    names: kernel_args::SYMMETRIC_FUNCTIONS,
    empty: Some(kernel_args::SYMMETRIC_EMPTY),
    shrinks: true,
    dependent: true,
};

/// The device-API kernel (`kernels/device_api.cu`): an `ncclDevComm` and its `Args` by value.
pub(crate) const DEVICE_API: Module = Module {
    what: "unicomm's device-API kernel",
    calls: [
        "cuModuleLoadData (unicomm's device-API kernel)",
        "cuLaunchKernel (unicomm's device-API kernel)",
    ],
    image: Image::Ptx(include_str!("../kernels/device_api.ptx")),
    names: [
        "unicomm_device_api_one_shot_f32",
        "unicomm_device_api_one_shot_f16",
        "unicomm_device_api_one_shot_bf16",
    ],
    empty: None,
    shrinks: false,
    dependent: false,
};

/// Threads of a block (`BLOCK` in the sources' launch bounds).
const BLOCK: u32 = kernel_args::SYMMETRIC_BLOCK;

/// A module loaded on one device: its function per element type, and how many of its
/// blocks the device holds at once (its multiprocessors times the blocks of the hungriest
/// function one of them holds): a grid that waits on itself is never launched larger.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kernels {
    /// f32, f16, bf16, then the empty kernel (0 where the module has none).
    functions: [usize; 4],
    resident: u32,
}

fn load(m: &Module, cc: Option<(u32, u32)>, sms: Option<u32>) -> Result<Kernels> {
    if let Some((major, minor)) = cc.filter(|&(major, _)| major < 9) {
        return Err(Error::unsupported(
            m.what,
            "a GPU of compute capability 9.0 or newer (the kernels are built for sm_90)",
            format!("compute capability {major}.{minor}"),
        ));
    }
    // A PTX image is NUL-terminated text; a fat binary is copied to 8-byte aligned memory
    // (its table's alignment; `include_bytes!` promises none).
    let (text, words);
    let at: *const c_void = match m.image {
        Image::Ptx(ptx) => {
            text = CString::new(ptx).map_err(|_| Error::invalid("ptx", "a NUL inside"))?;
            text.as_ptr().cast()
        }
        Image::Fatbin(b) => {
            words = unicomm_nccl_api::sys::fatbin::aligned(b);
            words.as_ptr().cast()
        }
    };
    // SAFETY: a NUL-terminated PTX image or a whole fat binary, alive across the call,
    // loaded into the current context (the caller's `with_device`); the module is never
    // unloaded (the process keeps it).
    let module = unsafe { result::module::load_data(at) }.map_err(|e| cuda_err(m.calls[0], e))?;
    if let (Image::Fatbin(b), Some((major, minor))) = (&m.image, cc) {
        let arch = major * 10 + minor;
        let took = unicomm_nccl_api::sys::fatbin::taken_on(b, arch);
        tracing::info!(
            what = m.what,
            arch,
            image = took.map_or("none".to_string(), |t| t.to_string()),
            "loaded"
        );
    }
    let function = |name: &str| -> Result<usize> {
        let n = CString::new(name).map_err(|_| Error::invalid("kernel", name.to_string()))?;
        // SAFETY: `module` was just loaded and is never unloaded.
        unsafe { result::module::get_function(module, n) }
            .map(|f| f as usize)
            .map_err(|e| cuda_err("cuModuleGetFunction", e))
    };
    let [a, b, c] = m.names;
    let empty = match m.empty {
        Some(e) => function(e)?,
        None => 0,
    };
    let functions = [function(a)?, function(b)?, function(c)?, empty];
    let mut per_sm = u32::MAX;
    for f in &functions[..3] {
        // SAFETY: `f` is a function of the module just loaded (never unloaded).
        let n = unsafe {
            result::occupancy::max_active_block_per_multiprocessor(
                *f as sys::CUfunction,
                BLOCK as i32,
                0,
            )
        }
        .map_err(|e| cuda_err("cuOccupancyMaxActiveBlocksPerMultiprocessor", e))?;
        per_sm = per_sm.min(u32::try_from(n).unwrap_or(0));
    }
    // Without the device's count, one multiprocessor's worth: still co-resident.
    let resident = per_sm.saturating_mul(sms.unwrap_or(1));
    Ok(Kernels {
        functions,
        resident,
    })
}

impl Kernels {
    /// The function of `dtype`.
    fn of(&self, m: &Module, dtype: DataType) -> Result<sys::CUfunction> {
        let i = kernel_args::function_index(dtype, m.what)?;
        Ok(self.functions[i] as sys::CUfunction)
    }
}

impl CudaRuntime {
    /// `m`'s functions on `dev` (the current device), loaded into the runtime's module table
    /// at the first use; the capability is asked once, at the load (not on every launch).
    fn functions(&self, m: &Module, dev: usize) -> Result<Kernels> {
        let mut loaded = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        let k = loaded.entry((m.what, dev)).or_insert_with(|| {
            load(m, self.capability(dev), self.multiprocessors(dev))
                .map(|k| (k.functions, k.resident))
        });
        let (functions, resident) = k.as_ref().copied().map_err(Clone::clone)?;
        Ok(Kernels {
            functions,
            resident,
        })
    }

    /// Launches the symmetric kernels' module's empty kernel on `s` (one thread): the floor
    /// of a launch of these kernels, for benchmarks (the module loaded on `dev` at first
    /// use).
    pub fn launch_empty(&self, dev: usize, s: &crate::runtime::CudaStreamHandle) -> Result<()> {
        self.with_device(dev, || {
            let k = self.functions(&SYMMETRIC, dev)?;
            let f = k.functions[3] as sys::CUfunction;
            let mut args: [*mut c_void; 0] = [];
            // SAFETY: `f` is the module's empty kernel (no parameters), loaded in `dev`'s
            // context; `s` is a live stream of `dev`'s primary context.
            unsafe { result::launch_kernel(f, (1, 1, 1), (1, 1, 1), 0, s.0.cu_stream(), &mut args) }
                .map_err(|e| cuda_err(SYMMETRIC.calls[1], e))
        })
    }

    /// Which image of unicomm's symmetric kernels `dev`'s driver takes, the module loaded
    /// there (at its first use, as a launch would): "SASS for sm_90", or the PTX it
    /// compiles, with what the fat binary holds and the driver it needs.
    pub fn symmetric_kernels_image(&self, dev: usize) -> Result<String> {
        use unicomm_nccl_api::sys::fatbin::{images, taken_on};
        let cc = self.capability(dev);
        self.with_device(dev, || self.functions(&SYMMETRIC, dev).map(drop))?;
        let all = images(kernel_args::SYMMETRIC_IMAGE)?;
        let held: Vec<String> = all.iter().map(|(i, _)| i.to_string()).collect();
        let floor = kernel_args::SYMMETRIC_DRIVER_FLOOR;
        let took = match cc {
            Some((major, minor)) => taken_on(kernel_args::SYMMETRIC_IMAGE, major * 10 + minor)
                .map_or("no image".into(), |t| t.to_string()),
            None => "an image (the device's capability unknown)".into(),
        };
        Ok(format!(
            "{took}, of a fat binary of {} (CUDA driver {}.{} or newer)",
            held.join(", "),
            floor / 1000,
            floor % 1000 / 10
        ))
    }

    /// Launches `m`'s function of `dtype` on `dev` (the module loaded there at first use,
    /// sm_90 or newer), `blocks` blocks of [`BLOCK`] threads, with `args` (each pointing at
    /// one argument's value; the driver copies them at the launch).
    ///
    /// # Safety
    /// `args` are the function's parameters, in its order and layout, and every address
    /// they hold keeps its launcher's contract; `stream` is a live stream of `dev`'s
    /// primary context.
    unsafe fn launch_on(
        &self,
        m: &Module,
        dev: usize,
        dtype: DataType,
        blocks: u32,
        args: &mut [*mut c_void],
        stream: sys::CUstream,
    ) -> Result<()> {
        self.with_device(dev, || {
            let k = self.functions(m, dev)?;
            let f = k.of(m, dtype)?;
            // The same on every rank of one GPU model, so every rank's grid shrinks alike.
            let blocks = match m.shrinks {
                true => blocks.clamp(1, k.resident.max(1)),
                false => blocks,
            };
            if blocks > k.resident {
                return Err(Error::invalid(
                    "blocks",
                    format!(
                        "a grid of {blocks} blocks whose blocks wait on each other, where {} holds {} at once",
                        m.what, k.resident
                    ),
                ));
            }
            if m.dependent && dependent_launch() {
                // SAFETY: as below; the kernel waits for the grid before it first.
                return unsafe { launch_dependent(f, blocks, BLOCK, stream, args) }
                    .map_err(|e| cuda_err(m.calls[1], e));
            }
            // SAFETY: `f` is a function of the module loaded in `dev`'s context; the
            // caller's contract covers `args` and `stream`.
            unsafe { result::launch_kernel(f, (blocks, 1, 1), (BLOCK, 1, 1), 0, stream, args) }
                .map_err(|e| cuda_err(m.calls[1], e))
        })
    }

    /// [`Runtime::launch`] on `dev`: the kernel `launch` names.
    ///
    /// # Safety
    /// The trait's contract; `stream` is a live stream of `dev`'s primary context.
    pub(crate) unsafe fn launch_kind(
        &self,
        dev: usize,
        dtype: DataType,
        launch: Launch<'_>,
        stream: sys::CUstream,
    ) -> Result<()> {
        match launch {
            // SAFETY: the trait's contract is `launch_symmetric_on`'s.
            Launch::Symmetric(params) => unsafe {
                self.launch_symmetric_on(dev, dtype, params, stream)
            },
            Launch::DeviceApi {
                dev_comm,
                args,
                blocks,
            } => {
                // SAFETY: the trait's contract is `launch_device_kernel_on`'s.
                unsafe { self.launch_device_kernel_on(dev, dtype, blocks, dev_comm, args, stream) }
            }
        }
    }

    /// [`Runtime::launch`] of the symmetric kernels on `dev`: the grid its parameters ask for
    /// (within what the device holds at once), one `Params` by value.
    ///
    /// # Safety
    /// The trait's contract; `stream` is a live stream of `dev`'s primary context.
    pub(crate) unsafe fn launch_symmetric_on(
        &self,
        dev: usize,
        dtype: DataType,
        params: &KernelParams,
        stream: sys::CUstream,
    ) -> Result<()> {
        let mut arg = *params;
        let mut args = [(&mut arg as *mut KernelParams).cast::<c_void>()];
        // SAFETY: the symmetric kernels take one `Params` by value, whose layout
        // `KernelParams` has (tested); the caller's contract covers its addresses.
        unsafe { self.launch_on(&SYMMETRIC, dev, dtype, params.blocks, &mut args, stream) }
    }

    /// [`Runtime::launch`] of the device-API kernel on `dev`: `blocks` blocks, the device
    /// communicator's bytes and one `Args` by value.
    ///
    /// # Safety
    /// The trait's contract; `stream` is a live stream of `dev`'s primary context.
    pub(crate) unsafe fn launch_device_kernel_on(
        &self,
        dev: usize,
        dtype: DataType,
        blocks: u32,
        dev_comm: &[u8],
        args: &DeviceKernelArgs,
        stream: sys::CUstream,
    ) -> Result<()> {
        if dev_comm.len() < DEVICE_KERNEL_DEV_COMM_BYTES {
            return Err(Error::invalid(
                "device_comm",
                format!(
                    "{} bytes, the kernel takes {DEVICE_KERNEL_DEV_COMM_BYTES}",
                    dev_comm.len()
                ),
            ));
        }
        let mut arg = *args;
        // The driver only reads the arguments (it copies them at the launch): the struct's
        // bytes are lent as they are, not copied again on the launch path.
        let mut params = [
            dev_comm.as_ptr().cast_mut().cast::<c_void>(),
            (&mut arg as *mut DeviceKernelArgs).cast::<c_void>(),
        ];
        // SAFETY: the kernel takes an `ncclDevComm` (its first
        // DEVICE_KERNEL_DEV_COMM_BYTES bytes, checked above) and one `Args` by value, whose
        // layout `DeviceKernelArgs` has (tested); the caller's contract covers the rest.
        unsafe { self.launch_on(&DEVICE_API, dev, dtype, blocks, &mut params, stream) }
    }

    /// `bytes` of zeroed host memory mapped for `dev`, at one address for the host and the
    /// device (unified addressing).
    pub(crate) fn host_mapped(&self, dev: usize, bytes: usize) -> Result<usize> {
        self.with_device(dev, || {
            let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
            // SAFETY: cuMemHostAlloc in `dev`'s context; zeroed below before any read.
            let p = unsafe { result::malloc_host(bytes.max(1), flags) }
                .map_err(|e| cuda_err("cuMemHostAlloc", e))?;
            // SAFETY: `p` holds `bytes` writable host bytes, just allocated.
            unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, bytes) };
            Ok(p as usize)
        })
    }

    /// Frees what [`CudaRuntime::host_mapped`] returned.
    ///
    /// # Safety
    /// `addr` came from `host_mapped`, is freed once, and no device work uses it.
    pub(crate) unsafe fn free_mapped(&self, addr: usize) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { result::free_host(addr as *mut c_void) }.map_err(|e| cuda_err("cuMemFreeHost", e))
    }
}

#[cfg(test)]
mod tests {
    use super::Image;

    /// Each module's PTX (the fat binary's, for the symmetric kernels) holds the three
    /// entry points the loader asks for, for sm_90.
    #[test]
    fn each_ptx_has_every_entry_point() {
        for m in [&super::SYMMETRIC, &super::DEVICE_API] {
            let ptx = match m.image {
                Image::Ptx(p) => p.to_string(),
                Image::Fatbin(b) => {
                    let all = unicomm_nccl_api::sys::fatbin::images(b).unwrap();
                    let ptx = all.iter().find(|(i, _)| {
                        matches!(i, unicomm_nccl_api::sys::fatbin::FatImage::Ptx { .. })
                    });
                    String::from_utf8_lossy(&b[ptx.unwrap().1.clone()]).into_owned()
                }
            };
            for name in m.names {
                assert!(ptx.contains(&format!(".entry {name}(")), "{name} missing");
            }
            assert!(ptx.contains(".target sm_90"), "{}", m.what);
        }
    }

    fn device_api_ptx() -> &'static str {
        match super::DEVICE_API.image {
            Image::Ptx(p) => p,
            Image::Fatbin(_) => "",
        }
    }

    /// The device-API kernel's fault and reduction codes are nccl-api's (the control block
    /// and the argument it shares with the symmetric kernels): each `#define FAULT_*` is its
    /// Rust twin, and the reduction reads max and min by `op_code`'s values.
    #[test]
    fn the_device_api_kernels_codes_are_their_rust_twins() {
        use unicomm_core::ReduceOp;
        use unicomm_nccl_api::sys::kernel_args::{fault, op_code};
        let src = include_str!("../kernels/device_api.cu");
        let defines: Vec<(&str, u32)> = src
            .lines()
            .filter_map(|l| l.strip_prefix("#define FAULT_"))
            .map(|l| {
                let mut w = l.split_whitespace();
                let name = w.next().unwrap_or("");
                (
                    name,
                    w.next().and_then(|v| v.parse().ok()).unwrap_or(u32::MAX),
                )
            })
            .collect();
        assert_eq!(
            defines,
            vec![("ABORTED", fault::ABORTED), ("BARRIER", fault::BARRIER)]
        );
        let (max, min) = (op_code(ReduceOp::Max), op_code(ReduceOp::Min));
        assert!(src.contains(&format!(
            "op == {max} ? fmaxf(a, b) : op == {min} ? fminf(a, b)"
        )));
    }

    /// The device-API kernel takes an `ncclDevComm` of the size nccl-api checks
    /// (`DEVICE_KERNEL_DEV_COMM_BYTES`: the source asserts `sizeof(ncclDevComm)` is it) and
    /// then its `Args` (`DeviceKernelArgs`' 64 bytes): the launch passes exactly these.
    #[test]
    fn the_device_api_kernel_takes_the_sizes_the_launch_passes() {
        use unicomm_nccl_api::sys::kernel_args::DEVICE_KERNEL_DEV_COMM_BYTES as BYTES;
        let src = include_str!("../kernels/device_api.cu");
        assert!(src.contains(&format!("sizeof(ncclDevComm) == {BYTES}")));
        for name in super::DEVICE_API.names {
            let params = format!(".param .align 8 .b8 {name}_param_0[{BYTES}],\n\t.param .align 8 .b8 {name}_param_1[64]");
            assert!(device_api_ptx().contains(&params), "{name}: {params}");
        }
        assert_eq!(
            std::mem::size_of::<unicomm_nccl_api::sys::kernel_args::DeviceKernelArgs>(),
            64
        );
    }

    /// The device-API kernel reports into the same control block as the symmetric kernels:
    /// its `Control` and fault codes must be nccl-api's (a fault read with another layout or
    /// code would be reported as another error, or not at all).
    #[test]
    fn the_device_api_kernel_reports_in_the_control_block_s_layout() {
        use unicomm_nccl_api::sys::kernel_args::fault;
        let src = include_str!("../kernels/device_api.cu");
        assert!(src.contains(&format!("#define FAULT_ABORTED {}", fault::ABORTED)));
        assert!(src.contains(&format!("#define FAULT_BARRIER {}", fault::BARRIER)));
        assert!(src.contains(
            "struct Control {\n  unsigned int abort, fault, rank, epoch;\n  unsigned long long detail;\n};"
        ));
    }
}
