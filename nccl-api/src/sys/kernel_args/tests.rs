//! The kernel source's words held to their Rust twins.

use super::*;
use unicomm_core::symmetric::{
    pad_arrival, pad_gone, LAMPORT_HEADER, PAD_EPOCH, PAD_POISON, PAD_ROUND, PAD_SIGNATURE,
    SIGNATURE_ROUND,
};

const SOURCE: &str = include_str!("../../../kernels/symmetric.cu");

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
    assert_eq!(define("PAD_GRID"), "PAD_USED(3)");
    assert_eq!(unicomm_core::symmetric::PAD_GRID, pad_used(3));
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
        ("ALG_DISPATCH", KernelAlgorithm::Dispatch as u32),
        ("ALG_COMBINE", KernelAlgorithm::Combine as u32),
        ("REFUSED_CAPACITY", refused::CAPACITY),
        ("REFUSED_EXPERT", refused::EXPERT),
        ("REFUSED_SPLIT", refused::SPLIT),
        ("REFUSED_SENT", refused::SENT),
        ("REFUSED_RECEIVED", refused::RECEIVED),
        ("REFUSED_PACKED", refused::PACKED),
        ("ALG_ALL_TO_ALL_V", KernelAlgorithm::AllToAllV as u32),
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
    let ptx = include_str!("../../../kernels/symmetric.ptx");
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
    let source = include_str!("../../../kernels/symmetric.ptx");
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

/// The kernel source's `Params` is 43 eight-byte words, eighteen four-byte ones and the
/// expert operands; its `Control` four words, a count and a refusal: the layouts the launch
/// copies byte for byte.
#[test]
fn the_arguments_have_the_kernel_sources_layout() {
    assert_eq!(
        std::mem::size_of::<KernelParams>(),
        43 * 8 + 18 * 4 + std::mem::size_of::<ExpertArgs>()
    );
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
    assert_eq!(std::mem::size_of::<Control>(), 48);
    assert_eq!(std::mem::offset_of!(Control, detail), 16);
    assert_eq!(std::mem::offset_of!(Control, refused), 24);
    assert_eq!(std::mem::offset_of!(Control, refused_at), 32);
    assert_eq!(std::mem::offset_of!(Control, refused_count), 40);
    // The expert operands after the grid word, on an 8-byte boundary: three arrays of
    // MAX_WORLD addresses, seven words, eight four-byte ones.
    assert_eq!(std::mem::offset_of!(KernelParams, x), 43 * 8 + 18 * 4);
    assert_eq!(std::mem::size_of::<ExpertArgs>(), (3 * 16 + 7) * 8 + 8 * 4);
    assert_eq!(std::mem::offset_of!(ExpertArgs, masked), (3 * 16 + 6) * 8);
    assert_eq!(
        std::mem::offset_of!(ExpertArgs, row_bytes),
        (3 * 16 + 7) * 8 + 6 * 4
    );
    assert_eq!(std::mem::size_of::<DeviceKernelArgs>(), 64);
}
