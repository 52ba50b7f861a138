//! unicomm's symmetric kernels on CUDA: the PTX built from `kernels/symmetric.cu` (by
//! `cargo xtask kernels`), loaded into a device's primary context at first use, one
//! function per element type, launched as one thread block; and the control block's host
//! memory the device maps.

#![allow(
    unsafe_code,
    reason = "the CUDA driver's module, launch and host-memory calls"
)]

use std::collections::BTreeMap;
use std::ffi::{c_void, CString};
use std::sync::Mutex;

use cudarc::driver::{result, sys};
use unicomm_core::{DataType, Error, Result};
use unicomm_nccl_api::sys::kernel_args::KernelParams;

use crate::driver_error::cuda_err;
use crate::runtime::CudaRuntime;
use unicomm_nccl_api::Runtime;

/// The kernels' PTX (sm_90, PTX ISA 9.0: CUDA 13.0's driver or newer), built from the
/// source beside it.
pub(crate) const PTX: &str = include_str!("../kernels/symmetric.ptx");
/// Threads of the one block a launch runs (`BLOCK` in the source).
const BLOCK: u32 = 512;

/// The kernels loaded on one device: the module's function per element type.
#[derive(Debug)]
pub(crate) struct Kernels {
    f32: usize,
    f16: usize,
    bf16: usize,
}

/// Each device's kernels, or why they could not be loaded (kept: a device that refuses the
/// module once refuses it again). Primary contexts live as long as the process, and so do
/// the modules loaded into them.
static LOADED: Mutex<BTreeMap<usize, std::result::Result<Kernels, Error>>> =
    Mutex::new(BTreeMap::new());

fn load(cc: Option<(u32, u32)>) -> Result<Kernels> {
    if let Some((major, minor)) = cc.filter(|&(major, _)| major < 9) {
        return Err(Error::unsupported(
            "unicomm's symmetric kernels",
            "a GPU of compute capability 9.0 or newer (the kernels are built for sm_90)",
            format!("compute capability {major}.{minor}"),
        ));
    }
    let image = CString::new(PTX).map_err(|_| Error::invalid("ptx", "a NUL inside the PTX"))?;
    // SAFETY: a NUL-terminated PTX image, loaded into the current context (the caller's
    // `with_device`); the module is never unloaded (the process keeps it).
    let module = unsafe { result::module::load_data(image.as_ptr().cast()) }
        .map_err(|e| cuda_err("cuModuleLoadData (unicomm's symmetric kernels)", e))?;
    let function = |name: &str| -> Result<usize> {
        let n = CString::new(name).map_err(|_| Error::invalid("kernel", name.to_string()))?;
        // SAFETY: `module` was just loaded and is never unloaded.
        unsafe { result::module::get_function(module, n) }
            .map(|f| f as usize)
            .map_err(|e| cuda_err("cuModuleGetFunction", e))
    };
    Ok(Kernels {
        f32: function("unicomm_symmetric_f32")?,
        f16: function("unicomm_symmetric_f16")?,
        bf16: function("unicomm_symmetric_bf16")?,
    })
}

impl Kernels {
    /// Launches the kernel of `dtype` with `params` on `stream`.
    ///
    /// # Safety
    /// `params` keeps [`Runtime::launch_symmetric`]'s
    /// contract; `stream` is a live stream of the context the kernels were loaded in.
    pub(crate) unsafe fn launch(
        &self,
        dtype: DataType,
        params: &KernelParams,
        stream: sys::CUstream,
    ) -> Result<()> {
        let f = match dtype {
            DataType::F32 => self.f32,
            DataType::F16 => self.f16,
            DataType::Bf16 => self.bf16,
            other => {
                return Err(Error::invalid(
                    "dtype",
                    format!("{other}: unicomm's symmetric kernels reduce f32, f16, bf16"),
                ))
            }
        };
        let mut arg = *params;
        let mut args = [(&mut arg as *mut KernelParams).cast::<c_void>()];
        // SAFETY: `f` is a function of the loaded module taking one `Params` by value, whose
        // layout `KernelParams` has (tested); the driver copies the argument at the launch.
        unsafe {
            result::launch_kernel(
                f as sys::CUfunction,
                (1, 1, 1),
                (BLOCK, 1, 1),
                0,
                stream,
                &mut args,
            )
        }
        .map_err(|e| cuda_err("cuLaunchKernel (unicomm's symmetric kernel)", e))
    }
}

impl CudaRuntime {
    /// [`Runtime::launch_symmetric`] on `dev`: the kernels loaded there at first use (sm_90
    /// or newer), the launch on `stream`.
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
        self.with_device(dev, || {
            let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
            // The capability is asked once, at the load (not on every launch).
            let k = loaded
                .entry(dev)
                .or_insert_with(|| load(self.capability(dev)));
            let k = k.as_ref().map_err(Clone::clone)?;
            // SAFETY: the caller's contract; the module was loaded in `dev`'s context.
            unsafe { k.launch(dtype, params, stream) }
        })
    }

    /// The compute capability of `dev` (`(9, 0)` for sm90), where the driver reports it.
    pub(crate) fn capability(&self, dev: usize) -> Option<(u32, u32)> {
        use sys::CUdevice_attribute as A;
        let c = self.context(dev).ok()?;
        let major = c
            .attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
            .ok()?;
        let minor = c
            .attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
            .ok()?;
        Some((u32::try_from(major).ok()?, u32::try_from(minor).ok()?))
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
    use unicomm_core::symmetric::{
        pad_arrival, MAX_SYMMETRIC_WORLD, PAD_COUNT, PAD_EPOCH, PAD_POISON, PAD_ROUND,
    };

    const SOURCE: &str = include_str!("../kernels/symmetric.cu");

    fn define(name: &str) -> String {
        let line = SOURCE
            .lines()
            .find(|l| l.starts_with(&format!("#define {name} ")))
            .unwrap_or_else(|| panic!("no #define {name} in symmetric.cu"));
        line[format!("#define {name} ").len()..].trim().to_string()
    }

    /// The kernel source writes the pad's layout in its own words: they must be comm-core's
    /// (a kernel and the mock disagreeing on a word is silent corruption).
    #[test]
    fn the_kernel_source_keeps_the_contracts_pad_layout() {
        assert_eq!(define("MAX_WORLD"), MAX_SYMMETRIC_WORLD.to_string());
        assert_eq!(define("PAD_EPOCH"), PAD_EPOCH.to_string());
        assert_eq!(define("PAD_ARRIVAL(p)"), "(8 + 4 * (p))");
        assert_eq!(pad_arrival(3), 8 + 4 * 3);
        assert_eq!(define("PAD_COUNT"), "(8 + 4 * MAX_WORLD)");
        assert_eq!(PAD_COUNT, 8 + 4 * MAX_SYMMETRIC_WORLD);
        assert_eq!(define("PAD_ROUND"), "(PAD_COUNT + 8)");
        assert_eq!(PAD_ROUND, PAD_COUNT + 8);
        assert_eq!(define("PAD_POISON"), "(PAD_ROUND + 4)");
        assert_eq!(PAD_POISON, PAD_ROUND + 4);
    }

    /// The PTX holds the three entry points the loader asks for, for sm_90.
    #[test]
    fn the_ptx_has_every_entry_point() {
        for name in [
            "unicomm_symmetric_f32",
            "unicomm_symmetric_f16",
            "unicomm_symmetric_bf16",
        ] {
            assert!(
                super::PTX.contains(&format!(".entry {name}(")),
                "{name} missing"
            );
        }
        assert!(super::PTX.contains(".target sm_90"));
    }
}
