//! What every rank's symmetric call must agree on, as the words the kernels exchange: the
//! operation (barrier or an all-reduce's algorithm), the element type, the reduction, the
//! count, and the fused norm's row width and epsilon. The barrier kernels publish it in
//! the signal pad ([`PAD_SIGNATURE`](super::PAD_SIGNATURE)) before their first barrier and
//! compare every rank's after it; the Lamport all-reduce carries it, with its round, as the
//! header of every slot it writes, so that a rank never reduces slots written for another
//! call. Every word keeps its top bit clear: a Lamport slot's poison (negative zeros, as
//! `u32` words `0x8000_0000` or `0x8000_8000`) is never a word of a signature.

use crate::element::ReduceOp;
use crate::{DataType, Error};

use super::algorithm::SymmetricAlgorithm;

/// `u32` words of a signature (32 bytes: the header of a Lamport slot).
pub const SIGNATURE_WORDS: usize = 8;

/// Bytes of a Lamport slot's header (the signature) before its data.
pub const LAMPORT_HEADER: usize = 4 * SIGNATURE_WORDS;

/// The word a kernel fills with the Lamport round (0 in the pads: the barrier epochs order
/// those calls).
pub const SIGNATURE_ROUND: usize = SIGNATURE_WORDS - 1;

/// The largest value a signature word holds (the top bit stays clear).
const WORD: u64 = 0x7fff_ffff;

/// The operation a signature names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignedOp {
    /// `symmetric_barrier`.
    Barrier,
    /// An all-reduce (fused or not) by this algorithm.
    AllReduce(SymmetricAlgorithm),
    /// An all-to-all with counts on the device.
    AllToAllV,
    /// Expert parallelism's dispatch.
    Dispatch,
    /// Expert parallelism's combine.
    Combine,
}

/// One symmetric call as every rank must make it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Signature {
    /// The operation.
    pub op: SignedOp,
    /// Element type (an all-reduce's; `None` for a barrier).
    pub dtype: Option<DataType>,
    /// Reduction (an all-reduce's).
    pub reduce: Option<ReduceOp>,
    /// Elements.
    pub count: usize,
    /// The fused norm's row width and epsilon, if fused.
    pub norm: Option<(usize, f32)>,
    /// An expert layout's masked ranks, as bits (0 for every other call); in the norm's
    /// width words, which no expert call has.
    pub masked: u64,
}

/// The operation's code: bits 0-1, and bit 10 for the operations past the first four.
fn op_code(op: SignedOp) -> u32 {
    match op {
        SignedOp::AllReduce(SymmetricAlgorithm::OneShot) => 0,
        SignedOp::AllReduce(SymmetricAlgorithm::TwoShot) => 1,
        SignedOp::AllReduce(SymmetricAlgorithm::Lamport) => 2,
        SignedOp::Barrier => 3,
        SignedOp::AllToAllV => 1 << 10,
        SignedOp::Dispatch => 1 << 10 | 1,
        SignedOp::Combine => 1 << 10 | 2,
    }
}

fn type_code(t: Option<DataType>) -> u32 {
    t.and_then(|t| DataType::ALL.iter().position(|&x| x == t))
        .map_or(0, |i| i as u32 + 1)
}

fn reduce_code(r: Option<ReduceOp>) -> u32 {
    match r {
        None => 0,
        Some(ReduceOp::Sum) => 1,
        Some(ReduceOp::Max) => 2,
        Some(ReduceOp::Min) => 3,
        Some(_) => 4,
    }
}

/// `x`'s low 62 bits as two words.
fn split(x: u64) -> [u32; 2] {
    [(x & WORD) as u32, ((x >> 31) & WORD) as u32]
}

impl Signature {
    /// A barrier's.
    pub fn barrier() -> Self {
        Signature {
            op: SignedOp::Barrier,
            dtype: None,
            reduce: None,
            count: 0,
            norm: None,
            masked: 0,
        }
    }

    /// Its words, the round word 0 (a kernel fills it).
    pub fn words(&self) -> [u32; SIGNATURE_WORDS] {
        let (hidden, eps) = self
            .norm
            .map_or((self.masked, 0), |(h, e)| (h as u64, e.to_bits()));
        let kind = op_code(self.op)
            | type_code(self.dtype) << 2
            | reduce_code(self.reduce) << 6
            | u32::from(self.norm.is_some()) << 9;
        let [c0, c1] = split(self.count as u64);
        let [h0, h1] = split(hidden);
        [kind, c0, c1, h0, h1, eps & WORD as u32, eps >> 31, 0]
    }
}

/// What differs between two signatures' words, named by the first field that does (`kind`:
/// their first word, the same in both).
fn field(i: usize, a: u32, b: u32, kind: u32) -> &'static str {
    match i {
        0 if (a & 3) != (b & 3) || (a >> 10 & 1) != (b >> 10 & 1) => "algorithm",
        0 if (a >> 2 & 15) != (b >> 2 & 15) => "dtype",
        0 if (a >> 6 & 7) != (b >> 6 & 7) => "op",
        0 => "norm",
        1 | 2 => "count",
        3 | 4 if kind >> 9 & 1 == 0 => "masked ranks",
        3 | 4 => "hidden",
        5 | 6 => "eps",
        _ => "round",
    }
}

/// A value of `words`' field `what`, as a reader would say it.
fn describe(what: &str, w: &[u32; SIGNATURE_WORDS]) -> String {
    let wide = |lo: usize| u64::from(w[lo]) | u64::from(w[lo + 1]) << 31;
    let kind = w[0];
    match what {
        "algorithm" if kind >> 10 & 1 == 1 => match kind & 3 {
            0 => "an all-to-all with device counts".into(),
            1 => "an expert dispatch".into(),
            _ => "an expert combine".into(),
        },
        "algorithm" => match kind & 3 {
            0 => "one-shot".into(),
            1 => "two-shot".into(),
            2 => "lamport".into(),
            _ => "a barrier".into(),
        },
        "dtype" => match (kind >> 2 & 15) as usize {
            0 => "no type".into(),
            i => DataType::ALL
                .get(i - 1)
                .map_or("an unknown type".into(), |t| t.to_string()),
        },
        "op" => ["none", "sum", "max", "min", "another"]
            .get((kind >> 6 & 7) as usize)
            .unwrap_or(&"an unknown op")
            .to_string(),
        "norm" => if kind >> 9 & 1 == 1 {
            "fused with a norm"
        } else {
            "not fused"
        }
        .into(),
        "count" => format!("{} elements", wide(1)),
        "hidden" => format!("rows of {}", wide(3)),
        "masked ranks" => {
            let bits = wide(3);
            let ranks: Vec<u32> = (0..62).filter(|r| bits >> r & 1 == 1).collect();
            format!("ranks {ranks:?} masked")
        }
        "eps" => format!("eps {}", f32::from_bits(w[5] | w[6] << 31)),
        _ => format!("round {}", w[SIGNATURE_ROUND]),
    }
}

/// `Ok` where `theirs` (rank `them`'s) equals `mine` (rank `me`'s), else the `Mismatch`
/// naming the first field that differs and both values.
pub fn compare(
    me: usize,
    mine: &[u32; SIGNATURE_WORDS],
    them: usize,
    theirs: &[u32; SIGNATURE_WORDS],
) -> crate::Result<()> {
    match (0..SIGNATURE_WORDS).find(|&i| mine[i] != theirs[i]) {
        None => Ok(()),
        Some(i) => Err(mismatch(me, mine, them, theirs, i)),
    }
}

/// The `Mismatch` of word `i`, which differs between rank `me`'s and rank `them`'s.
pub fn mismatch(
    me: usize,
    mine: &[u32; SIGNATURE_WORDS],
    them: usize,
    theirs: &[u32; SIGNATURE_WORDS],
    i: usize,
) -> Error {
    let what = field(i, mine[i], theirs[i], mine[0]);
    Error::Mismatch {
        what,
        detail: format!(
            "a symmetric call of {} on rank {me}, {} on rank {them}",
            describe(what, mine),
            describe(what, theirs)
        ),
    }
}

/// A signature rebuilt from `mine` with its word `i` replaced by `theirs` (what a kernel
/// reports of a peer's differing word: its index and value).
pub fn with_word(mine: &[u32; SIGNATURE_WORDS], i: usize, theirs: u32) -> [u32; SIGNATURE_WORDS] {
    let mut w = *mine;
    if let Some(x) = w.get_mut(i) {
        *x = theirs;
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ar(alg: SymmetricAlgorithm, t: DataType, r: ReduceOp, count: usize) -> Signature {
        Signature {
            op: SignedOp::AllReduce(alg),
            dtype: Some(t),
            reduce: Some(r),
            count,
            norm: None,
            masked: 0,
        }
    }

    /// A Lamport reader tells a written header from the poison by the first word's top bit:
    /// no field of any call may set a top bit, at the largest values too.
    #[test]
    fn no_word_of_any_signature_has_its_top_bit_set() {
        let mut s = ar(
            SymmetricAlgorithm::Lamport,
            DataType::F8E5M2,
            ReduceOp::Min,
            usize::MAX,
        );
        s.norm = Some((usize::MAX, -f32::MAX));
        for sig in [s, Signature::barrier()] {
            assert!(sig.words().iter().all(|w| w >> 31 == 0), "{sig:?}");
        }
    }

    /// Each field that differs is named, with both values, whichever word carries it.
    #[test]
    fn a_difference_names_its_field_and_both_values() {
        let a = ar(SymmetricAlgorithm::OneShot, DataType::F32, ReduceOp::Sum, 8);
        let cases = [
            (
                ar(SymmetricAlgorithm::TwoShot, DataType::F32, ReduceOp::Sum, 8),
                "algorithm",
                "two-shot",
            ),
            (
                ar(
                    SymmetricAlgorithm::OneShot,
                    DataType::Bf16,
                    ReduceOp::Sum,
                    8,
                ),
                "dtype",
                "bfloat16",
            ),
            (
                ar(SymmetricAlgorithm::OneShot, DataType::F32, ReduceOp::Max, 8),
                "op",
                "max",
            ),
            (
                ar(
                    SymmetricAlgorithm::OneShot,
                    DataType::F32,
                    ReduceOp::Sum,
                    1 << 40,
                ),
                "count",
                "1099511627776 elements",
            ),
        ];
        for (b, what, said) in cases {
            match compare(0, &a.words(), 1, &b.words()) {
                Err(Error::Mismatch { what: w, detail }) => {
                    assert_eq!(w, what);
                    assert!(detail.contains(said), "{detail}");
                }
                other => panic!("{what}: {other:?}"),
            }
        }
        let mut n = a;
        n.norm = Some((16, 1e-5));
        let mut m = n;
        m.norm = Some((16, 1e-6));
        assert!(matches!(
            compare(0, &n.words(), 1, &m.words()),
            Err(Error::Mismatch { what: "eps", .. })
        ));
        m.norm = Some((32, 1e-5));
        assert!(matches!(
            compare(0, &n.words(), 1, &m.words()),
            Err(Error::Mismatch { what: "hidden", .. })
        ));
        assert!(matches!(
            compare(0, &n.words(), 1, &a.words()),
            Err(Error::Mismatch { what: "norm", .. })
        ));
        assert!(compare(0, &a.words(), 1, &a.words()).is_ok());
    }
}
