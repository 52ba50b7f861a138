//! The modes: how buffers are prepared and calls made.

use clap::ValueEnum;
use unicomm_nccl_api::policy::Path;

/// How buffers are prepared and calls made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Plain buffers (`ncclMemAlloc`).
    Plain,
    /// Buffers registered with `ncclCommRegister`.
    Registered,
    /// Buffers in symmetric windows.
    Window,
    /// The NCCL call through the function table, no unicomm layer (GPU backends).
    Raw,
    /// `raw` on buffers registered with `ncclCommRegister` (through unicomm, once): the
    /// registered path called by hand.
    RawRegistered,
    /// `raw` on buffers in symmetric windows: the window path called by hand.
    RawWindow,
    /// The copy-engine path (windows; all_to_all and all_gather; ranks in one process).
    Ce,
    /// Buffers registered for the automatic policy: each call takes the path the policy
    /// picks for its collective and size.
    Auto,
    /// unicomm's one-shot all-reduce over symmetric memory (all_reduce, out of place).
    OneShot,
    /// unicomm's two-shot all-reduce over symmetric memory.
    TwoShot,
    /// unicomm's Lamport all-reduce over symmetric memory.
    Lamport,
    /// unicomm's one-shot all-reduce written against NCCL's device API, on windows
    /// (NCCL >= 2.32.3; all_reduce, out of place).
    DeviceApi,
    /// unicomm's fused all-reduce + residual add + RMSNorm (one-shot), over rows of the
    /// decode preset's hidden size: the step that ends a tensor-parallel decoder layer.
    Fused,
    /// `fused` with its result also quantized to FP8 (e4m3) by a device scale.
    FusedFp8,
}

impl Mode {
    /// The name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Registered => Path::Registered.name(),
            Mode::Window => Path::Window.name(),
            Mode::Raw => "raw",
            Mode::RawRegistered => "raw-registered",
            Mode::RawWindow => "raw-window",
            Mode::Ce => Path::CopyEngine.name(),
            Mode::Auto => "auto",
            Mode::DeviceApi => "device-api",
            Mode::Fused => "fused",
            Mode::FusedFp8 => "fused-fp8",
            Mode::OneShot | Mode::TwoShot | Mode::Lamport => {
                self.symmetric().map_or("?", |a| a.name())
            }
        }
    }

    /// The symmetric kernel a mode runs (`one-shot`, `two-shot`, `lamport`).
    pub fn symmetric(self) -> Option<unicomm::SymmetricAlgorithm> {
        match self {
            Mode::OneShot => Some(unicomm::SymmetricAlgorithm::OneShot),
            Mode::TwoShot => Some(unicomm::SymmetricAlgorithm::TwoShot),
            Mode::Lamport => Some(unicomm::SymmetricAlgorithm::Lamport),
            _ => None,
        }
    }

    /// The fused modes (`fused`, `fused-fp8`): whether the FP8 output is asked, or `None`.
    pub fn fused(self) -> Option<bool> {
        match self {
            Mode::Fused => Some(false),
            Mode::FusedFp8 => Some(true),
            _ => None,
        }
    }

    /// A mode of unicomm's own kernels (symmetric memory or NCCL's device API): a float
    /// all_reduce by sum, max or min, out of place.
    pub fn own_kernel(self) -> bool {
        self.symmetric().is_some() || self.fused().is_some() || self == Mode::DeviceApi
    }

    /// A mode of unicomm's kernels over symmetric memory (not built for HIP yet).
    pub fn on_symmetric_memory(self) -> bool {
        self.symmetric().is_some() || self.fused().is_some()
    }

    /// The NCCL call made by hand through the function table (`raw`, `raw-registered`,
    /// `raw-window`): the ways of calling NCCL that unicomm's modes are measured against.
    pub fn is_raw(self) -> bool {
        matches!(self, Mode::Raw | Mode::RawRegistered | Mode::RawWindow)
    }
}
