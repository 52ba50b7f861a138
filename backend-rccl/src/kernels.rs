//! unicomm's symmetric kernels on HIP: the module loaded into a device at first use, one
//! function per element type, and the control block's host memory the device maps. The
//! image is the one source's PTX (nccl-api's `kernels/symmetric.cu`): a HIP runtime on an
//! NVIDIA GPU (HIP-on-CUDA) loads it as CUDA does; an AMD GPU refuses it, and the kernels
//! are then `Unsupported` naming why (no build for AMD GPUs yet: it needs hipcc and a code
//! object per architecture).

#![allow(
    unsafe_code,
    reason = "the HIP runtime's module, launch and host-memory calls"
)]

use std::collections::BTreeMap;
use std::ffi::{c_void, CString};
use std::sync::Mutex;

use unicomm_core::{DataType, Error, Result};
use unicomm_nccl_api::sys::kernel_args::{
    self, KernelParams, SYMMETRIC_BLOCK, SYMMETRIC_FUNCTIONS, SYMMETRIC_IMAGE,
};
use unicomm_nccl_api::Runtime;

use crate::load::HipRuntime;
use crate::sys::{HipKernels, HipModule, HipStream, HIP_HOST_MALLOC_PORTABLE_MAPPED};

/// What the errors name.
const WHAT: &str = "unicomm's symmetric kernels";

/// Each device's functions (f32, f16, bf16), or why the module could not be loaded there
/// (kept: a device that refuses the module once refuses it again). Modules live as long
/// as the process.
static LOADED: Mutex<BTreeMap<usize, std::result::Result<[usize; 3], Error>>> =
    Mutex::new(BTreeMap::new());

impl HipRuntime {
    /// The module and host-memory calls, or `Unsupported` naming them.
    fn kernel_calls(&self) -> Result<HipKernels> {
        self.fns.kernels.ok_or_else(|| {
            Error::unsupported(
                WHAT,
                "hipHostMalloc, hipHostGetDevicePointer, hipModuleLoadData, hipModuleGetFunction and hipModuleLaunchKernel in the HIP runtime",
                format!("libamdhip64 at {} lacks one", self.path),
            )
        })
    }

    /// The module loaded into the current device: its functions, or why not. A runtime
    /// that refuses the image (an AMD GPU) answers `Unsupported`, naming its error.
    fn load(&self, k: &HipKernels) -> Result<[usize; 3]> {
        let image = unicomm_nccl_api::sys::fatbin::aligned(SYMMETRIC_IMAGE);
        let mut module: HipModule = std::ptr::null_mut();
        // SAFETY: a whole fat binary, alive across the call, loaded into the current device;
        // never unloaded.
        let r = unsafe { (k.module_load_data)(&mut module, image.as_ptr().cast()) };
        if let Err(e) = self.check("hipModuleLoadData", r) {
            return Err(Error::unsupported(
                WHAT,
                "a GPU that loads their image (NVIDIA, sm_90 or newer, through HIP-on-CUDA); AMD GPUs need a code object built by hipcc, not built yet",
                format!("the runtime at {} refused the image: {e}", self.path),
            ));
        }
        let mut out = [0usize; 3];
        for (slot, name) in out.iter_mut().zip(SYMMETRIC_FUNCTIONS) {
            let n = CString::new(name).map_err(|_| Error::invalid("kernel", name))?;
            let mut f: HipModule = std::ptr::null_mut();
            // SAFETY: `module` was just loaded and is never unloaded.
            self.check("hipModuleGetFunction", unsafe {
                (k.module_get_function)(&mut f, module, n.as_ptr())
            })?;
            *slot = f as usize;
        }
        Ok(out)
    }

    /// [`Runtime::launch`] of the symmetric kernels on `dev`: one block (HIP's occupancy call
    /// is not wired, so no grid is known to be co-resident), one `Params` by value.
    ///
    /// # Safety
    /// The trait's contract; `stream` is a live stream of `dev`.
    pub(crate) unsafe fn launch_symmetric_on(
        &self,
        dev: usize,
        dtype: DataType,
        params: &KernelParams,
        stream: HipStream,
    ) -> Result<()> {
        let k = self.kernel_calls()?;
        let i = kernel_args::function_index(dtype, WHAT)?;
        self.with_device(dev, || {
            let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
            let fns = loaded.entry(dev).or_insert_with(|| self.load(&k));
            let f = fns.as_ref().map_err(Clone::clone)?[i] as HipModule;
            let mut arg = *params;
            let mut args = [(&mut arg as *mut KernelParams).cast::<c_void>()];
            let b = SYMMETRIC_BLOCK;
            // SAFETY: `f` is a function of the module loaded on `dev`, taking one `Params`
            // by value (the layout `KernelParams` has, tested in nccl-api); the caller's
            // contract covers its addresses and `stream`.
            let r = unsafe {
                (k.module_launch_kernel)(
                    f,
                    1,
                    1,
                    1,
                    b,
                    1,
                    1,
                    0,
                    stream,
                    args.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            };
            self.check("hipModuleLaunchKernel (unicomm's symmetric kernel)", r)
        })
    }

    /// `bytes` of zeroed host memory mapped for `dev`, at one address for the host and the
    /// device (unified addressing: a runtime that maps it elsewhere is `Unsupported`).
    pub(crate) fn host_mapped(&self, dev: usize, bytes: usize) -> Result<usize> {
        let k = self.kernel_calls()?;
        self.with_device(dev, || {
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: hipHostMalloc on `dev`; zeroed below before any read.
            self.check("hipHostMalloc", unsafe {
                (k.host_malloc)(&mut p, bytes.max(1), HIP_HOST_MALLOC_PORTABLE_MAPPED)
            })?;
            let mut d: *mut c_void = std::ptr::null_mut();
            // SAFETY: `p` is mapped host memory just allocated.
            let r = unsafe { (k.host_get_device_pointer)(&mut d, p, 0) };
            if r != crate::sys::HIP_SUCCESS || d != p {
                // SAFETY: allocated above, unused, freed once.
                let _ = unsafe { (k.host_free)(p) };
                self.check("hipHostGetDevicePointer", r)?;
                return Err(Error::unsupported(
                    WHAT,
                    "host memory at one address for the host and the device (unified addressing)",
                    format!("device address {d:p} for host address {p:p}"),
                ));
            }
            // SAFETY: `p` holds `bytes` writable host bytes, just allocated.
            unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, bytes) };
            Ok(p as usize)
        })
    }

    /// Frees what [`HipRuntime::host_mapped`] returned.
    ///
    /// # Safety
    /// `addr` came from `host_mapped`, is freed once, and no device work uses it.
    pub(crate) unsafe fn free_mapped(&self, addr: usize) -> Result<()> {
        let k = self.kernel_calls()?;
        // SAFETY: the caller's contract.
        self.check("hipHostFree", unsafe { (k.host_free)(addr as *mut c_void) })
    }
}
