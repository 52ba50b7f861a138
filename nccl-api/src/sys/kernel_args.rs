//! unicomm's symmetric kernels as every runtime loads them, and what they take
//! (`nccl-api/kernels/symmetric.cu`'s `Params` and `Control`, field for field): the fat
//! binary built from the source beside it (`cargo xtask kernels`), the launch's argument,
//! passed by value, and the communicator's control block in host memory the device maps
//! (the host's abort word and the first fault a kernel reports). One source for every
//! runtime: CUDA loads the image, and so does HIP on an NVIDIA GPU (HIP-on-CUDA).

use unicomm_core::symmetric::{MAX_SYMMETRIC_WORLD, SIGNATURE_WORDS};

/// The symmetric kernels as a CUDA fat binary, built from `kernels/symmetric.cu` by `cargo
/// xtask kernels`: SASS for each of [`SYMMETRIC_SASS`] (assembled by CUDA 12.8's `ptxas`)
/// and the PTX, declared at ISA [`SYMMETRIC_PTX_ISA`], for newer GPUs; so it loads on the
/// drivers of [`SYMMETRIC_DRIVER_FLOOR`] and newer (nvcc 13's own PTX, ISA 9.0, needed a
/// CUDA 13 driver, r580). Its table: [`fatbin::images`](super::fatbin::images).
pub const SYMMETRIC_IMAGE: &[u8] = include_bytes!("../../kernels/symmetric.fatbin");

/// The GPU architectures [`SYMMETRIC_IMAGE`] holds SASS for (H100/H200, B200).
pub const SYMMETRIC_SASS: [u32; 2] = [90, 100];

/// The PTX ISA of [`SYMMETRIC_IMAGE`]'s PTX: the lowest that CUDA 12.8's `ptxas` accepts for
/// what nvcc 13 emits (`used_bytes_mask` is 8.3's).
pub const SYMMETRIC_PTX_ISA: (u32, u32) = (8, 3);

/// The oldest CUDA driver that takes every image of [`SYMMETRIC_IMAGE`], as
/// `cuDriverGetVersion` says it (12.3, driver r545: PTX ISA 8.3 is CUDA 12.3's). On sm_90
/// and sm_100 the driver takes the SASS, which does not need its PTX compiler.
pub const SYMMETRIC_DRIVER_FLOOR: i32 = 12030;

/// The symmetric kernels' functions for f32, f16 and bf16.
pub const SYMMETRIC_FUNCTIONS: [&str; 3] = [
    "unicomm_symmetric_f32",
    "unicomm_symmetric_f16",
    "unicomm_symmetric_bf16",
];

/// The empty kernel of the same module: the floor of a launch (unicomm-bench's `--floor`).
pub const SYMMETRIC_EMPTY: &str = "unicomm_symmetric_empty";

/// The place of `dtype`'s function in a kernel module's table (f32, f16, bf16: the order of
/// [`SYMMETRIC_FUNCTIONS`] and of the device-API kernel's); another type is refused naming
/// `what` (the kernels).
pub fn function_index(dtype: unicomm_core::DataType, what: &str) -> unicomm_core::Result<usize> {
    use unicomm_core::DataType;
    match dtype {
        DataType::F32 => Ok(0),
        DataType::F16 => Ok(1),
        DataType::Bf16 => Ok(2),
        other => Err(unicomm_core::Error::invalid(
            "dtype",
            format!("{other}: {what} reduce f32, f16, bf16"),
        )),
    }
}

/// A reduction's code in a kernel's argument (`OP_*` in the kernel sources): 0 sum, 1 max,
/// 2 min (the kernels take no other; the callers check it first).
pub fn op_code(op: unicomm_core::ReduceOp) -> u32 {
    match op {
        unicomm_core::ReduceOp::Max => 1,
        unicomm_core::ReduceOp::Min => 2,
        _ => 0,
    }
}

/// Threads of a symmetric kernel's one block (`BLOCK` in the source's launch bounds).
pub const SYMMETRIC_BLOCK: u32 = 512;

/// The algorithm code of a launch (`ALG_*` in the kernel source).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum KernelAlgorithm {
    /// Every rank's data read and reduced between two barriers.
    OneShot = 0,
    /// Reduce-scatter and all-gather by peer loads.
    TwoShot = 1,
    /// Lamport's poison, no barrier.
    Lamport = 2,
    /// A barrier on the signal pads alone.
    Barrier = 3,
}

/// One launch's argument (`Params`): every rank's data and pad, the operands, the control
/// block, the deadline, the sizes, the codes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelParams {
    /// Each rank's data at its address in this process (0 past the world).
    pub peers: [u64; MAX_SYMMETRIC_WORLD],
    /// Each rank's signal pad.
    pub pads: [u64; MAX_SYMMETRIC_WORLD],
    /// This rank's result.
    pub out: u64,
    /// The fused norm's residual (0 without it).
    pub residual: u64,
    /// The fused norm's weight (0 without it).
    pub weight: u64,
    /// The fused norm's FP8 (e4m3) output (0 without it).
    pub out8: u64,
    /// The FP8 output's scale, one f32 on the device (0 without it).
    pub scale: u64,
    /// The communicator's [`Control`], at its device address.
    pub control: u64,
    /// How long a wait on a peer lasts, from the kernel's start, in nanoseconds.
    pub timeout_ns: u64,
    /// Elements.
    pub count: u64,
    /// Elements per row of the fused norm (0 without it).
    pub hidden: u64,
    /// Byte offset of the Lamport workspace from a rank's data.
    pub lamport: u64,
    /// Bytes of one Lamport slot.
    pub slot: u64,
    /// This rank.
    pub rank: u32,
    /// Ranks.
    pub world: u32,
    /// [`KernelAlgorithm`] as its code.
    pub algorithm: u32,
    /// 0 sum, 1 max, 2 min.
    pub op: u32,
    /// 1 with the fused norm.
    pub norm: u32,
    /// The norm's epsilon.
    pub eps: f32,
    /// The call's signature ([`unicomm_core::symmetric::Signature`]), the round word 0.
    pub sig: [u32; SIGNATURE_WORDS],
    /// Lamport: 1 where the call's type is the workspace's (else only its headers move).
    pub typed: u32,
    /// 1 where the allocation has Lamport workspaces (a barrier kernel then also looks
    /// for a peer's Lamport header).
    pub workspace: u32,
    /// 1 where every rank is on this GPU: the kernels fence at GPU scope, not system scope.
    pub local: u32,
    /// The grid asked for ([`symmetric_blocks`]; a launcher clamps it to what its GPU holds
    /// at once).
    pub blocks: u32,
}

/// One launch of one of unicomm's kernels, as a runtime's one launch call
/// (`Runtime::launch`) takes it.
#[derive(Debug, Clone, Copy)]
pub enum Launch<'a> {
    /// The symmetric kernels: one `Params` by value, the grid its `blocks` asks for.
    Symmetric(&'a KernelParams),
    /// The device-API kernel: a device communicator's struct and one `Args` by value.
    DeviceApi {
        /// The device communicator's bytes.
        dev_comm: &'a [u8],
        /// The kernel's arguments.
        args: &'a DeviceKernelArgs,
        /// Blocks (one LSA barrier each).
        blocks: u32,
    },
}

impl From<unicomm_core::symmetric::SymmetricAlgorithm> for KernelAlgorithm {
    fn from(a: unicomm_core::symmetric::SymmetricAlgorithm) -> Self {
        use unicomm_core::symmetric::SymmetricAlgorithm as A;
        match a {
            A::OneShot => KernelAlgorithm::OneShot,
            A::TwoShot => KernelAlgorithm::TwoShot,
            A::Lamport => KernelAlgorithm::Lamport,
        }
    }
}

/// The grid a launch of unicomm's symmetric all-reduce asks for (`count` elements of `dtype`,
/// the fused norm's rows of `hidden` where it has one): one block per 1,024 16-byte vectors
/// of data (two per thread), one per row of the fused norm (whose rows a block normalizes
/// after reducing them; the two-shot's fused norm one block, its rows gathered from every
/// block), at most [`MAX_SYMMETRIC_BLOCKS`](unicomm_core::symmetric::MAX_SYMMETRIC_BLOCKS).
/// A barrier is one block.
pub fn symmetric_blocks(
    algorithm: unicomm_core::symmetric::SymmetricAlgorithm,
    count: usize,
    dtype: unicomm_core::DataType,
    hidden: Option<usize>,
) -> u32 {
    use unicomm_core::symmetric::SymmetricAlgorithm as A;
    let max = unicomm_core::symmetric::MAX_SYMMETRIC_BLOCKS;
    let g = match (algorithm, hidden) {
        (A::TwoShot, Some(_)) => 1,
        (_, Some(hidden)) => count / hidden.max(1),
        (_, None) => (count * dtype.size()).div_ceil(16 * 2 * SYMMETRIC_BLOCK as usize),
    };
    g.clamp(1, max) as u32
}

/// The release whose device-API headers unicomm's device-API kernel was built against
/// (`backend-nccl/kernels/device_api.cu`): it takes a device communicator of that layout,
/// which NCCL fills from that release on.
pub const DEVICE_KERNEL_HEADERS: unicomm_core::Version = unicomm_core::Version::new(2, 32, 3);
/// `sizeof(ncclDevComm)` in those headers (the source asserts the same number).
pub const DEVICE_KERNEL_DEV_COMM_BYTES: usize = 248;
/// The most blocks a device-API kernel's launch takes (one LSA barrier each).
pub const DEVICE_KERNEL_MAX_BLOCKS: u32 = 32;

/// The requirements of a device communicator that unicomm's device-API kernel takes
/// (`Comm::all_reduce_device`): the layout of the headers it was built against,
/// `lsa_barriers` barriers (a block each, at most [`DEVICE_KERNEL_MAX_BLOCKS`] used).
pub fn device_kernel_requirements(
    lsa_barriers: u32,
) -> unicomm_core::device_api::DeviceCommRequirements {
    unicomm_core::device_api::DeviceCommRequirements {
        layout: unicomm_core::device_api::DeviceCommLayout::Built {
            version: DEVICE_KERNEL_HEADERS,
            size: DEVICE_KERNEL_DEV_COMM_BYTES,
        },
        lsa_barriers,
        lsa_multimem: false,
    }
}

/// The operands of unicomm's device-API kernel after its device communicator (the
/// source's `Args`), passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceKernelArgs {
    /// The `send` window (`ncclWindow_t`).
    pub send: u64,
    /// Its byte offset.
    pub send_off: u64,
    /// The `recv` window.
    pub recv: u64,
    /// Its byte offset.
    pub recv_off: u64,
    /// Elements.
    pub count: u64,
    /// The communicator's [`Control`], at its device address (the abort word the kernel
    /// watches between NCCL's timed barrier waits, and where it reports a fault).
    pub control: u64,
    /// How long a wait on a peer lasts, from the kernel's start, in nanoseconds.
    pub timeout_ns: u64,
    /// 0 sum, 1 max, 2 min.
    pub op: u32,
    /// This rank (named by a fault).
    pub rank: u32,
}

/// The fault codes a kernel reports in [`Control::fault`].
pub mod fault {
    /// A peer never arrived by the deadline (the world's pads poisoned).
    pub const TIMEOUT: u32 = 1;
    /// The host aborted the communicator.
    pub const ABORTED: u32 = 2;
    /// A peer's call differs: `rank` names it, `epoch` holds this rank's differing
    /// signature word, `detail` the word's index `<< 32 |` the peer's word.
    pub const MISMATCH: u32 = 3;
    /// A peer gave up at its deadline (this rank's pad poisoned).
    pub const POISONED: u32 = 4;
    /// An LSA peer never arrived at NCCL's barrier of the device-API kernel by the deadline.
    pub const BARRIER: u32 = 5;
    /// Every rank called a Lamport all-reduce of another type than the workspace's.
    pub const TYPE: u32 = 6;
    /// The rank `rank` names released its part without making the call.
    pub const GONE: u32 = 7;
}

/// The communicator's control block (`Control`), in host memory the device maps.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Control {
    /// Set to 1 by the host at abort; every wait of a kernel watches it.
    pub abort: u32,
    /// The fault's code ([`fault`]), 0 while none; written last, after its fields and a
    /// system fence.
    pub fault: u32,
    /// The rank it names (the one that never arrived, or whose count differs).
    pub rank: u32,
    /// The barrier epoch or Lamport round it happened in.
    pub epoch: u32,
    /// A mismatch: the differing signature word's index `<< 32 |` that rank's word.
    pub detail: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use unicomm_core::symmetric::{
        pad_arrival, pad_gone, LAMPORT_HEADER, PAD_EPOCH, PAD_POISON, PAD_ROUND, PAD_SIGNATURE,
        SIGNATURE_ROUND,
    };

    const SOURCE: &str = include_str!("../../kernels/symmetric.cu");

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
        assert_eq!(define("PAD_ROUND"), "(8 + 4 * MAX_WORLD)");
        assert_eq!(PAD_ROUND, 8 + 4 * MAX_SYMMETRIC_WORLD);
        assert_eq!(define("PAD_POISON"), "(PAD_ROUND + 4)");
        assert_eq!(PAD_POISON, PAD_ROUND + 4);
        assert_eq!(define("PAD_SIGNATURE"), "(PAD_POISON + 4)");
        assert_eq!(PAD_SIGNATURE, PAD_POISON + 4);
        assert_eq!(define("SIG_WORDS"), SIGNATURE_WORDS.to_string());
        assert_eq!(define("LAMPORT_HEADER"), "(4 * SIG_WORDS)");
        assert_eq!(LAMPORT_HEADER, 4 * SIGNATURE_WORDS);
        assert_eq!(define("SIG_ROUND"), "(SIG_WORDS - 1)");
        assert_eq!(
            define("PAD_GONE(q)"),
            "(PAD_SIGNATURE + 2 * LAMPORT_HEADER + 4 * (q))"
        );
        assert_eq!(pad_gone(2), PAD_SIGNATURE + 2 * LAMPORT_HEADER + 4 * 2);
        assert_eq!(SIGNATURE_ROUND, SIGNATURE_WORDS - 1);
        assert_eq!(define("BLOCK"), SYMMETRIC_BLOCK.to_string());
        use unicomm_core::symmetric::{
            pad_block_arrival, pad_used, MAX_SYMMETRIC_BLOCKS, PAD_BLOCKS, PAD_CALL, PAD_DONE,
            PAD_HOLD, PAD_VERDICT,
        };
        assert_eq!(define("PAD_CALL"), "PAD_GONE(MAX_WORLD)");
        assert_eq!(PAD_CALL, pad_gone(MAX_SYMMETRIC_WORLD));
        assert_eq!(define("PAD_DONE"), "(PAD_CALL + 4)");
        assert_eq!(PAD_DONE, PAD_CALL + 4);
        assert_eq!(define("PAD_VERDICT"), "(PAD_DONE + 4)");
        assert_eq!(PAD_VERDICT, PAD_DONE + 4);
        assert_eq!(define("PAD_HOLD"), "(PAD_VERDICT + 4)");
        assert_eq!(PAD_HOLD, PAD_VERDICT + 4);
        assert_eq!(define("PAD_USED(b)"), "(PAD_HOLD + 4 + 4 * (b))");
        assert_eq!(pad_used(2), PAD_HOLD + 4 + 4 * 2);
        assert_eq!(define("PAD_BLOCKS"), PAD_BLOCKS.to_string());
        assert_eq!(
            define("PAD_BLOCK_ARRIVAL(b, p)"),
            "(PAD_BLOCKS + 4 * ((b) * MAX_WORLD + (p)))"
        );
        assert_eq!(
            pad_block_arrival(5, 3),
            PAD_BLOCKS + 4 * (5 * MAX_SYMMETRIC_WORLD + 3)
        );
        assert_eq!(define("MAX_BLOCKS"), MAX_SYMMETRIC_BLOCKS.to_string());
    }

    /// `NAME = value` of every enumerator of the kernel source's `enum { ... }` blocks.
    fn enumerators() -> Vec<(String, u32)> {
        let mut out = Vec::new();
        for block in SOURCE.split("enum {").skip(1) {
            let body = block.split('}').next().unwrap_or("");
            for item in body.split(',') {
                if let Some((name, value)) = item.split_once('=') {
                    let value = value
                        .trim()
                        .parse()
                        .unwrap_or_else(|e| panic!("{item}: {e}"));
                    out.push((name.trim().to_string(), value));
                }
            }
        }
        out
    }

    /// The codes a launch passes and a kernel reports are declared once in the source and
    /// once here: each of the source's algorithm, reduction and fault codes is its Rust
    /// twin's, and no code of the source is left without one.
    #[test]
    fn the_kernel_sources_codes_are_their_rust_twins() {
        use unicomm_core::ReduceOp;
        let twins: Vec<(&str, u32)> = vec![
            ("ALG_ONE_SHOT", KernelAlgorithm::OneShot as u32),
            ("ALG_TWO_SHOT", KernelAlgorithm::TwoShot as u32),
            ("ALG_LAMPORT", KernelAlgorithm::Lamport as u32),
            ("ALG_BARRIER", KernelAlgorithm::Barrier as u32),
            ("OP_SUM", op_code(ReduceOp::Sum)),
            ("OP_MAX", op_code(ReduceOp::Max)),
            ("OP_MIN", op_code(ReduceOp::Min)),
            ("FAULT_TIMEOUT", fault::TIMEOUT),
            ("FAULT_ABORTED", fault::ABORTED),
            ("FAULT_MISMATCH", fault::MISMATCH),
            ("FAULT_POISONED", fault::POISONED),
            ("FAULT_TYPE", fault::TYPE),
            ("FAULT_GONE", fault::GONE),
        ];
        let source = enumerators();
        for (name, value) in &source {
            let twin = twins.iter().find(|(n, _)| n == name);
            assert_eq!(twin.map(|t| t.1), Some(*value), "{name} in symmetric.cu");
        }
        assert_eq!(source.len(), twins.len(), "{source:?}");
    }

    /// The PTX holds the three entry points the loaders ask for, for sm_90.
    #[test]
    fn the_ptx_has_every_entry_point() {
        let ptx = include_str!("../../kernels/symmetric.ptx");
        for name in SYMMETRIC_FUNCTIONS.into_iter().chain([SYMMETRIC_EMPTY]) {
            assert!(ptx.contains(&format!(".entry {name}(")), "{name} missing");
        }
        assert!(ptx.contains(".target sm_90"));
    }

    /// The embedded image is the one the constants name, built from the PTX beside the
    /// source (itself built from the source, as the architecture test checks): SASS for
    /// each of `SYMMETRIC_SASS`, and that PTX declared at `SYMMETRIC_PTX_ISA`, nothing else;
    /// so it loads on CUDA 12 drivers (ISA 9.0 PTX alone needed CUDA 13's).
    #[test]
    fn the_embedded_image_holds_the_sass_and_ptx_its_constants_name() {
        use super::super::fatbin::{images, taken_on, FatImage};
        let all = images(SYMMETRIC_IMAGE).unwrap();
        let sass: Vec<u32> = all
            .iter()
            .filter_map(|(i, _)| match i {
                FatImage::Sass { arch } => Some(*arch),
                _ => None,
            })
            .collect();
        assert_eq!(sass, SYMMETRIC_SASS);
        let ptx: Vec<_> = all
            .iter()
            .filter_map(|(i, r)| match i {
                FatImage::Ptx { arch, isa } => Some((*arch, *isa, r.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(ptx.len(), 1, "{all:?}");
        let (arch, isa, range) = ptx[0].clone();
        assert_eq!((arch, isa), (90, SYMMETRIC_PTX_ISA));
        assert!(isa < (9, 0), "PTX ISA 9.0 needs a CUDA 13 driver");
        let text = String::from_utf8_lossy(&SYMMETRIC_IMAGE[range]);
        let text = text.trim_end_matches('\0');
        let source = include_str!("../../kernels/symmetric.ptx");
        let body = source.split_once('\n').map_or("", |(_, b)| b);
        let declared = format!(".version {}.{}", isa.0, isa.1);
        // fatbinary keeps the PTX's instructions, not its comments and indentation.
        let norm = |t: &str| -> Vec<String> {
            t.lines()
                // A call's `{ // callseq 0, 0` as well as whole-line comments.
                .map(|l| l.split("//").next().unwrap_or(""))
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .filter(|l| !l.is_empty())
                .map(|l| {
                    if l.starts_with(".version ") {
                        declared.clone()
                    } else {
                        l
                    }
                })
                .collect()
        };
        let (got, want) = (norm(text), norm(body));
        let first = (0..got.len().max(want.len())).find(|&i| got.get(i) != want.get(i));
        assert_eq!(
            first, None,
            "the fatbin's PTX is not the tree's: cargo xtask kernels"
        );
        assert_eq!(
            taken_on(SYMMETRIC_IMAGE, 90),
            Some(FatImage::Sass { arch: 90 })
        );
        assert!(matches!(
            taken_on(SYMMETRIC_IMAGE, 120),
            Some(FatImage::Ptx { .. })
        ));
        assert_eq!(taken_on(SYMMETRIC_IMAGE, 80), None);
    }

    /// The kernel source's `Params` is 43 eight-byte words and eighteen four-byte ones; its
    /// `Control` four words and a count: the layouts the launch copies byte for byte.
    #[test]
    fn the_arguments_have_the_kernel_sources_layout() {
        assert_eq!(std::mem::size_of::<KernelParams>(), 43 * 8 + 18 * 4);
        assert_eq!(std::mem::offset_of!(KernelParams, blocks), 43 * 8 + 17 * 4);
        assert_eq!(std::mem::offset_of!(KernelParams, sig), 43 * 8 + 6 * 4);
        assert_eq!(
            std::mem::offset_of!(KernelParams, workspace),
            43 * 8 + 15 * 4
        );
        assert_eq!(std::mem::offset_of!(KernelParams, out8), 35 * 8);
        assert_eq!(std::mem::offset_of!(KernelParams, scale), 36 * 8);
        assert_eq!(std::mem::offset_of!(KernelParams, control), 37 * 8);
        assert_eq!(std::mem::offset_of!(KernelParams, rank), 43 * 8);
        assert_eq!(std::mem::offset_of!(KernelParams, eps), 43 * 8 + 5 * 4);
        assert_eq!(std::mem::size_of::<Control>(), 24);
        assert_eq!(std::mem::offset_of!(Control, detail), 16);
        assert_eq!(std::mem::size_of::<DeviceKernelArgs>(), 64);
    }
}
