//! What a backend says of its library and its device: [`Version`], [`Capabilities`],
//! [`DeviceInfo`] (re-exported by [`crate::backend`]).

/// A library version, as `ncclGetVersion` reports it (`major*10000 + minor*100 + patch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Version {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
}

impl Version {
    /// A version from its parts.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Version {
            major,
            minor,
            patch,
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// What the loaded library and device can do. Returned by `Comm::capabilities`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// The backend: "mock", "nccl" or "rccl".
    pub backend: &'static str,
    /// Where the collective library was loaded from ("built-in" for the mock).
    pub library_path: String,
    /// The collective library's version (the NCCL API version for RCCL).
    pub version: Version,
    /// Ordinary user-buffer registration (`ncclCommRegister`, NCCL >= 2.19).
    pub registration: bool,
    /// Symmetric windows (`ncclCommWindowRegister`, NCCL >= 2.27).
    pub windows: bool,
    /// A native all-to-all call (`ncclAlltoAll` / RCCL's `ncclAllToAll`); without it
    /// all-to-all is grouped send/recv.
    pub native_all_to_all: bool,
    /// Collectives may be captured into graphs and replayed ([`crate::graph::Graph`]): CUDA
    /// graphs on NCCL, HIP graphs on RCCL (where the HIP runtime has the graph calls), the
    /// mock's recorded work.
    pub graph_capture: bool,
    /// Allocation through the library (`ncclMemAlloc`, cuMem-backed).
    pub mem_alloc: bool,
    /// The copy-engine path for all-to-all, all-to-all-v and all-gather (`set_copy_engine`): symmetric
    /// windows, and peers' memory reachable (ranks in one process, or one rank per process
    /// on one host with exportable cuMem/hipMem memory, agreed per window).
    pub copy_engine: bool,
    /// `ncclCommSplit` (NCCL >= 2.18, RCCL since ROCm 6.0); without it [`Collective::split`](crate::Collective::split)
    /// creates the child from a fresh unique id among its members.
    pub native_split: bool,
    /// `ncclGather`/`ncclScatter` (NCCL >= 2.28.3, RCCL); without them, grouped send/recv.
    pub native_gather_scatter: bool,
    /// A native all-to-all-v (RCCL's `ncclAllToAllv`); without it, grouped send/recv.
    pub native_all_to_all_v: bool,
    /// Reductions of the 8-bit floats (NCCL >= 2.24 on sm90 or newer); moving them works on
    /// every version.
    pub fp8_reduce: bool,
    /// `ReduceOp::PreMulSum` (`ncclRedOpCreatePreMulSum`, NCCL >= 2.11, RCCL ROCm 5.2).
    pub pre_mul_sum: bool,
    /// unicomm's work with counts on the device: `all_to_all_vdev` and expert
    /// parallelism's dispatch and combine (the mock; the GPUs once their kernels are built).
    pub device_counts: bool,
    /// Expert parallelism's high-throughput dispatch (`ExpertMode::HighThroughput`: packed
    /// rows, the counts exchanged first): the mock, and NCCL where unicomm's kernels load.
    pub packed_dispatch: bool,
}

/// The device a rank drives, as a benchmark reports it (nccl-tests' `device`,
/// `device_hex`, `device_info`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device's index among those this process sees (`None`: not a GPU).
    pub index: Option<usize>,
    /// The device's name ("NVIDIA H200"), or what stands for it.
    pub name: String,
    /// Its PCI bus id (`0000:1b:00`), where the runtime reports one.
    pub pci_bus_id: Option<String>,
}
