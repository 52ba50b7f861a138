//! What a CUDA fat binary holds, read from its table: each image's kind (SASS for one GPU
//! architecture, or PTX of an ISA for a virtual one). unicomm's symmetric kernels ship as one
//! ([`SYMMETRIC_IMAGE`](super::kernel_args::SYMMETRIC_IMAGE)); the table says which images a
//! driver can take, and the test below holds it to the constants that name them.
//!
//! The layout (NVIDIA's `fatbinary_section.h` and its entries): a 16-byte header (magic
//! `0xBA55ED50`, a `u16` version, a `u16` header size, a `u64` size of the entries), then
//! entries, each a header (`u16` kind: 1 PTX, 2 ELF; `u32` header size at byte 4; `u64`
//! payload size at byte 8; the PTX ISA as `major << 16 | minor` at byte 24; the architecture
//! at byte 28) followed by its payload.

use unicomm_core::{Error, Result};

const MAGIC: u32 = 0xBA55_ED50;

/// One image of a fat binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FatImage {
    /// Machine code for `sm_<arch>` (90: H100/H200).
    Sass {
        /// `major * 10 + minor` of the architecture.
        arch: u32,
    },
    /// PTX of ISA `isa` for `compute_<arch>`, compiled by the driver for the GPU it meets.
    Ptx {
        /// The architecture the PTX targets.
        arch: u32,
        /// Its ISA version, (major, minor).
        isa: (u32, u32),
    },
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The images of the fat binary `b`, with each payload's byte range, in its order.
pub fn images(b: &[u8]) -> Result<Vec<(FatImage, std::ops::Range<usize>)>> {
    let bad = |why: &str| Error::invalid("fatbin", format!("not a CUDA fat binary: {why}"));
    if u32_at(b, 0) != Some(MAGIC) {
        return Err(bad("no magic"));
    }
    let head = usize::from(u16_at(b, 6).ok_or_else(|| bad("short"))?);
    let size = u64_at(b, 8).ok_or_else(|| bad("short"))?;
    let end = usize::try_from(size)
        .ok()
        .and_then(|s| s.checked_add(head))
        .filter(|&e| e <= b.len())
        .ok_or_else(|| bad("its size runs past its bytes"))?;
    let mut out = Vec::new();
    let mut p = head;
    while p < end {
        let field = |at: usize| u32_at(b, p + at).ok_or_else(|| bad("a short entry"));
        let kind = u16_at(b, p).ok_or_else(|| bad("a short entry"))?;
        let eh = field(4)? as usize;
        let len = u64_at(b, p + 8).ok_or_else(|| bad("a short entry"))?;
        let start = p.checked_add(eh).ok_or_else(|| bad("an entry's size"))?;
        let stop = usize::try_from(len)
            .ok()
            .and_then(|l| start.checked_add(l))
            .filter(|&s| s <= end && eh >= 32)
            .ok_or_else(|| bad("an entry runs past the table"))?;
        let (isa, arch) = (field(24)?, field(28)?);
        let image = match kind {
            1 => FatImage::Ptx {
                arch,
                isa: (isa >> 16, isa & 0xffff),
            },
            2 => FatImage::Sass { arch },
            other => return Err(bad(&format!("an entry of kind {other}"))),
        };
        out.push((image, start..stop));
        p = stop;
    }
    Ok(out)
}

/// `b` in 8-byte words, as a loader hands a fat binary to the driver (its table is read as
/// 8-byte fields; `include_bytes!` promises no alignment).
pub fn aligned(b: &[u8]) -> Vec<u64> {
    let mut words = vec![0u64; b.len().div_ceil(8)];
    for (w, chunk) in words.iter_mut().zip(b.chunks(8)) {
        let mut x = [0u8; 8];
        x[..chunk.len()].copy_from_slice(chunk);
        *w = u64::from_le_bytes(x);
    }
    words
}

/// Which image of `b` a driver takes on a GPU of architecture `arch`: its SASS for that
/// architecture, else its PTX (compiled by the driver) where one targets an architecture at
/// or below it; `None` if neither.
pub fn taken_on(b: &[u8], arch: u32) -> Option<FatImage> {
    let all = images(b).ok()?;
    let sass = all
        .iter()
        .map(|(i, _)| *i)
        .find(|i| *i == FatImage::Sass { arch });
    sass.or_else(|| {
        all.iter()
            .map(|(i, _)| *i)
            .find(|i| matches!(i, FatImage::Ptx { arch: a, .. } if *a <= arch))
    })
}

impl std::fmt::Display for FatImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FatImage::Sass { arch } => write!(f, "SASS for sm_{arch}"),
            FatImage::Ptx { arch, isa } => {
                write!(
                    f,
                    "PTX ISA {}.{} for compute_{arch}, compiled by the driver",
                    isa.0, isa.1
                )
            }
        }
    }
}
