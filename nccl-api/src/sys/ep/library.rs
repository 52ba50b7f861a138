//! Loading NCCL EP: where it is looked for, the entry points unicomm calls, the version
//! gates (its own release and the NCCL it was built against).

#![allow(
    unsafe_code,
    reason = "calls the NCCL EP library (the architecture test's UNSAFE_FILES lists it)"
)]

use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};

use unicomm_core::{Error, Result, Version};

use super::abi::{
    CombineOutputs, DispatchOutputs, GroupConfig, HandleConfig, Inputs, LayoutInfo, Tensor,
    API_VERSION, EP_LIBRARY_VAR, EP_NCCL_SINCE, EP_SINCE,
};
use crate::sys::api::{Api, NcclComm, NcclResult, RawStream};
use crate::sys::search::{env_dirs, open_library, python_wheel_dirs, Search};

type Handle = *mut c_void;
type Group = *mut c_void;

/// The entry points unicomm calls (`nccl_ep.h`).
#[derive(Debug)]
pub(crate) struct Fns {
    pub(crate) get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    pub(crate) create_group:
        unsafe extern "C" fn(*mut Group, NcclComm, *const GroupConfig) -> NcclResult,
    pub(crate) group_destroy: unsafe extern "C" fn(Group) -> NcclResult,
    pub(crate) init_handle: unsafe extern "C" fn(
        *mut Handle,
        Group,
        c_int,
        *const HandleConfig,
        c_int,
        *const Tensor,
    ) -> NcclResult,
    pub(crate) update_handle:
        unsafe extern "C" fn(Handle, *const Tensor, *const LayoutInfo, RawStream) -> NcclResult,
    pub(crate) handle_destroy: unsafe extern "C" fn(Handle) -> NcclResult,
    pub(crate) dispatch: unsafe extern "C" fn(
        Handle,
        *const Inputs,
        *const DispatchOutputs,
        *const LayoutInfo,
        *const c_void,
        RawStream,
    ) -> NcclResult,
    pub(crate) combine: unsafe extern "C" fn(
        Handle,
        *const Inputs,
        *const CombineOutputs,
        *const c_void,
        RawStream,
    ) -> NcclResult,
}

/// One loaded NCCL EP library.
pub struct EpLibrary {
    /// Where it was loaded from.
    pub path: String,
    /// `ncclEpGetVersion`.
    pub version: Version,
    pub(crate) fns: Fns,
    // Last: the library outlives the function pointers above.
    _lib: libloading::Library,
}

impl std::fmt::Debug for EpLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NCCL EP {} at {}", self.version, self.path)
    }
}

/// Where the library is looked for: the variable, then `NCCL_EP_HOME/lib/cuXX` (the
/// folder its JIT reads its headers from) and NVIDIA's wheel's folder, each for the
/// driver's CUDA major (`cu13` from a CUDA 13 driver, else `cu12`), then the system
/// loader's sonames.
pub fn search(cuda_major: Option<u32>) -> Search {
    let cu = match cuda_major {
        Some(m) if m >= 13 => "cu13",
        _ => "cu12",
    };
    let lib = format!("lib/{cu}");
    let mut dirs = env_dirs(&[("NCCL_EP_HOME", lib.as_str())]);
    dirs.extend(python_wheel_dirs(&format!("nccl/ep/{lib}")));
    Search {
        library: "NCCL EP",
        env_var: EP_LIBRARY_VAR,
        dirs,
        names: &["libnccl_ep.so", "libnccl_ep.so.0"],
    }
}

/// `Unsupported` unless the NCCL loaded is one NCCL EP was built for.
pub fn check_nccl(nccl: &Api) -> Result<()> {
    if nccl.flavor.library == "NCCL" && nccl.version >= EP_NCCL_SINCE {
        return Ok(());
    }
    Err(Error::unsupported(
        "NCCL EP (expert-parallel dispatch and combine)",
        format!("NCCL {EP_NCCL_SINCE} or newer (the release NCCL EP 0.1.0 was built against)"),
        format!("{} {}", nccl.flavor.library, nccl.version),
    ))
}

/// `Unsupported` unless `v` is a release whose structures are the ones bound here.
pub fn check_version(v: Version) -> Result<()> {
    if v >= EP_SINCE && v.major == 0 {
        return Ok(());
    }
    Err(Error::unsupported(
        "NCCL EP (expert-parallel dispatch and combine)",
        format!("NCCL EP {EP_SINCE} to 0.x (nccl_ep.h of API version {API_VERSION})"),
        format!("NCCL EP {v}"),
    ))
}

/// Decodes `ncclEpGetVersion`'s `MAJOR*10000+MINOR*100+PATCH`.
pub const fn version_of_code(code: c_int) -> Version {
    let c = if code < 0 { 0 } else { code as u32 };
    Version::new(c / 10000, (c % 10000) / 100, c % 100)
}

impl EpLibrary {
    /// The library beside `nccl` (checked first: an NCCL it was not built for is refused
    /// before anything is loaded), searched for the driver's CUDA major.
    pub fn load(nccl: &Api, cuda_major: Option<u32>) -> Result<EpLibrary> {
        check_nccl(nccl)?;
        let lib = search(cuda_major).load(EpLibrary::open)?;
        check_version(lib.version)?;
        Ok(lib)
    }

    /// Loads the library at `path` and reads its version.
    pub fn open(path: &Path) -> Result<EpLibrary> {
        let lib = open_library("NCCL EP", path)?;
        let shown = path.display().to_string();
        let missing = |symbol: &'static str| Error::MissingSymbol {
            library: "NCCL EP",
            path: shown.clone(),
            symbol,
        };
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: the field's type is the symbol's signature in nccl_ep.h.
                let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) };
                *s.map_err(|_| missing($name))?
            }};
        }
        let fns = Fns {
            get_version: sym!("ncclEpGetVersion"),
            create_group: sym!("ncclEpCreateGroup"),
            group_destroy: sym!("ncclEpGroupDestroy"),
            init_handle: sym!("ncclEpInitHandle"),
            update_handle: sym!("ncclEpUpdateHandle"),
            handle_destroy: sym!("ncclEpHandleDestroy"),
            dispatch: sym!("ncclEpDispatch"),
            combine: sym!("ncclEpCombine"),
        };
        let mut code: c_int = 0;
        // SAFETY: ncclEpGetVersion writes one int.
        let r = unsafe { (fns.get_version)(&mut code) };
        if r != 0 {
            return Err(Error::LibraryNotFound {
                library: "NCCL EP",
                tried: vec![format!("{shown}: ncclEpGetVersion answered {r}")],
            });
        }
        Ok(EpLibrary {
            path: shown,
            version: version_of_code(code),
            fns,
            _lib: lib,
        })
    }
}

/// The wheel's device headers for its JIT (`NCCL_EP_HOME`), beside a library found in a
/// wheel's `lib/cuXX/`: `None` elsewhere.
pub fn jit_home(library: &str) -> Option<PathBuf> {
    let home = Path::new(library).parent()?.parent()?.parent()?;
    home.join("include/nccl_ep")
        .is_dir()
        .then(|| home.to_path_buf())
}
