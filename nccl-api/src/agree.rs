//! Agreement between the ranks on small facts, through the communicator itself: the
//! element-wise maximum of every rank's words (one in-place uint64 all-reduce), which gives
//! a field's maximum and, offered complemented, its minimum. Used once by the automatic
//! policy's agreement (`auto.rs`), and before every collective with
//! `UNICOMM_CHECK_COLLECTIVES=1`: the ranks compare what they are about to call (operation,
//! count, data type, reduction, root, path) and, where they differ, every rank gets
//! [`Error::Mismatch`] instead of the hang or the corrupted data of mismatched NCCL calls,
//! as the mock reports it always (PyTorch's `TORCH_DISTRIBUTED_DEBUG=DETAIL` checks the same
//! way, before the collective, at the cost of a host round trip per call).

use std::sync::{Arc, Mutex};

use unicomm_core::backend::DeviceMemory;
use unicomm_core::{DataType, Error, Kind, Op, ReduceOp, Result, Slice};

use crate::group;
use crate::libcomm::LibComm;
use crate::memory::{ApiMemory, ApiStream};
use crate::sys::calls::Sides;
use crate::sys::codes::NcclCode;
use crate::sys::runtime::Runtime;

/// The most words one exchange carries (2 KiB of scratch: the copy-engine all-to-all-v's
/// layouts of up to 12 ranks in one exchange; the fake NCCL's barrier worlds reduce as
/// many).
const MAX_WORDS: usize = 256;

/// A communicator's agreement: its device scratch and stream for the exchanges (made at
/// the first), and whether every collective is compared first.
pub(crate) struct Agreement<R: Runtime> {
    scratch: Mutex<Option<(ApiMemory<R>, ApiStream<R>)>>,
    check: bool,
}

/// What a rank is about to call, field by field, in the order a mismatch is reported (the
/// mock's names and order, then the path).
const FIELDS: [&str; 6] = [
    "operation",
    "count",
    "data type",
    "reduction",
    "root",
    "path",
];

/// `ncclMax`.
const RED_MAX: i32 = 2;

/// `kind`'s fields as words: its code ([`Kind::code`]), its reduction (0: none) and its
/// root.
fn kind_code(kind: Kind) -> (u64, u64, u64) {
    // A pre-multiplied sum has no built-in code: it is numbered after them (its scalar is
    // each rank's own, not compared).
    let red = kind.reduction().map_or(0, |op| {
        op.nccl().map_or(ReduceOp::ALL.len() as u64, |c| c as u64) + 1
    });
    let root = kind.rank_arg().map_or(0, |(r, _)| r as u64);
    (u64::from(kind.code()), red, root)
}

/// Field `i`'s value in words (the codes of `kind_code`, the library's type codes, the
/// paths), or the number where it is one.
fn shown(i: usize, v: u64, paths: &[&str]) -> String {
    let named = match i {
        0 => Kind::ALL
            .into_iter()
            .find(|k| u64::from(k.code()) == v)
            .map(|k| k.name().to_string()),
        2 => DataType::ALL
            .iter()
            .find(|t| t.nccl() as u64 == v)
            .map(|t| t.name().to_string()),
        3 if v == 0 => Some("none".to_string()),
        3 => ReduceOp::ALL
            .iter()
            .find(|o| o.nccl().map(|c| c as u64 + 1) == Some(v))
            .map(|o| o.name().to_string())
            .or_else(|| (v == ReduceOp::ALL.len() as u64 + 1).then(|| "premulsum".to_string())),
        5 => paths.get(v as usize).map(|s| s.to_string()),
        _ => None,
    };
    named.unwrap_or_else(|| v.to_string())
}

impl<R: Runtime> Agreement<R> {
    /// `check`: compare every collective first (`UNICOMM_CHECK_COLLECTIVES=1`).
    pub(crate) fn new(check: bool) -> Self {
        Agreement {
            scratch: Mutex::new(None),
            check,
        }
    }

    /// The element-wise maximum of every rank's `words` (collective, at most 256): one
    /// in-place all-reduce of uint64 on the communicator's scratch, waited for with its
    /// deadline.
    pub(crate) fn all_max(&self, lc: &Arc<LibComm<R>>, words: &[u64]) -> Result<Vec<u64>> {
        if words.len() > MAX_WORDS {
            return Err(Error::invalid(
                "words",
                format!("at most {MAX_WORDS} per exchange"),
            ));
        }
        // One exchange at a time per rank: the scratch is written, reduced and read back.
        let mut slot = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let scratch = match slot.take() {
            Some(made) => made,
            // Plain device memory: the library's allocator would take a whole granule.
            None => (
                ApiMemory::from_runtime_malloc(
                    lc.rt.clone(),
                    lc.dev,
                    lc.deadline(),
                    MAX_WORDS * 8,
                )?,
                lc.create_stream()?,
            ),
        };
        let (mem, st) = &*slot.insert(scratch);
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let mut out = vec![0u8; bytes.len()];
        let n = words.len();
        let done = mem.write(0, &bytes, st).and_then(|()| {
            // `n` (<= 256) u64 of this rank's 2 KiB device scratch, in place; the scratch
            // outlives the operation (below).
            let sl = Slice {
                mem,
                offset: 0,
                bytes: n * 8,
            };
            let sides = Sides {
                send: Some(&sl),
                recv: Some(&sl),
                config: None,
            };
            lc.call(|c| {
                lc.api
                    .all_reduce(sides, n, DataType::U64, RED_MAX, c, st.lend())
            })?;
            mem.read(0, &mut out, st)
        });
        if let Err(e) = done {
            // The operation may still be pending (a deadline passed, the communicator
            // aborted): its memory is left to it rather than freed under it.
            if let Some(pending) = slot.take() {
                std::mem::forget(pending);
            }
            return Err(e);
        }
        Ok(out
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8])))
            .collect())
    }

    /// Every rank's `row` (collective; every rank passes as many words): rank `r`'s at
    /// `r * row.len()..`, as an all-gather through the maximum (each rank fills only its
    /// own part), in as few exchanges as [`MAX_WORDS`] allows.
    pub(crate) fn gather(&self, lc: &Arc<LibComm<R>>, row: &[u64]) -> Result<Vec<u64>> {
        let (w, me, n) = (lc.world, lc.rank, row.len());
        let total = n
            .checked_mul(w)
            .ok_or_else(|| Error::invalid("row", "too long"))?;
        let mut all = Vec::with_capacity(total);
        for start in (0..total).step_by(MAX_WORDS) {
            let words: Vec<u64> = (start..(start + MAX_WORDS).min(total))
                .map(|i| if i / n == me { row[i % n] } else { 0 })
                .collect();
            all.extend(self.all_max(lc, &words)?);
        }
        Ok(all)
    }

    /// Whether the ranks compare their collectives (`UNICOMM_CHECK_COLLECTIVES=1`).
    pub(crate) fn checking(&self) -> bool {
        self.check
    }

    /// With `UNICOMM_CHECK_COLLECTIVES=1`: the ranks compare the collective `op` about to
    /// take the path numbered `path().0` (named by `path().1`; asked only with the check
    /// on; collective; not inside a group, whose calls the library defers, nor while
    /// `stream` is being captured into a graph, whose replays it would not see).
    #[inline]
    pub(crate) fn check_collective<'p>(
        &self,
        lc: &Arc<LibComm<R>>,
        op: &Op<'_, ApiMemory<R>>,
        path: impl FnOnce() -> (u64, &'p [&'p str]),
        stream: &ApiStream<R>,
    ) -> Result<()> {
        if !self.check {
            return Ok(());
        }
        let (at, paths) = path();
        self.check_collective_on(lc, op, at, paths, stream)
    }

    #[inline(never)]
    fn check_collective_on(
        &self,
        lc: &Arc<LibComm<R>>,
        op: &Op<'_, ApiMemory<R>>,
        path: u64,
        paths: &[&str],
        stream: &ApiStream<R>,
    ) -> Result<()> {
        if lc.world == 1
            || !op.kind.is_collective()
            || group::in_group()
            || lc.rt.capturing(stream.inner())?
        {
            return Ok(());
        }
        let (kind, red, root) = kind_code(op.kind);
        let mine = [
            kind,
            op.count as u64,
            op.dtype.nccl() as u64,
            red,
            root,
            path,
        ];
        let mut words = mine.to_vec();
        words.extend(mine.iter().map(|w| !w));
        let all = self.all_max(lc, &words)?;
        let n = mine.len();
        for (i, field) in FIELDS.iter().enumerate() {
            let (hi, lo) = (all[i], !all[n + i]);
            if hi != lo {
                return Err(Error::Mismatch {
                    what: field,
                    detail: format!(
                        "{} here (rank {}, {} of {} {}); the ranks' values range from {} to {}",
                        shown(i, mine[i], paths),
                        lc.rank,
                        op.kind.name(),
                        op.count,
                        op.dtype.name(),
                        shown(i, lo, paths),
                        shown(i, hi, paths),
                    ),
                });
            }
        }
        Ok(())
    }
}

impl<R: Runtime> Agreement<R> {
    /// With `UNICOMM_CHECK_COLLECTIVES=1`, for the variable-size kinds: the ranks agree on
    /// the operation and type, and on the counts: every rank's all-gather-v or
    /// reduce-scatter-v counts are the same, and what each rank sends a peer in an
    /// all-to-all-v is what that peer receives from it. A disagreement fails every rank
    /// with the same `Mismatch`, naming the pair and both counts.
    pub(crate) fn check_layout(
        &self,
        lc: &Arc<LibComm<R>>,
        op: &Op<'_, ApiMemory<R>>,
        stream: &ApiStream<R>,
    ) -> Result<()> {
        if !self.check || lc.world == 1 || group::in_group() || lc.rt.capturing(stream.inner())? {
            return Ok(());
        }
        let shape = Op { count: 0, ..*op };
        self.check_collective_on(lc, &shape, 0, &["the library"], stream)?;
        // Every rank holds every rank's counts, so every rank finds the same first
        // disagreement and reports it in the same words.
        let all = self.gather(lc, &op.layout.words(op.kind))?;
        match unicomm_core::layout_disagreement(op.kind, &all, lc.world) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_shown_in_words_where_they_have_names() {
        let (op, red, root) = kind_code(Kind::Reduce {
            op: ReduceOp::Max,
            root: 3,
        });
        assert_eq!(shown(0, op, &[]), "Reduce");
        assert_eq!(shown(3, red, &[]), "max");
        assert_eq!(shown(4, root, &[]), "3");
        assert_eq!(shown(3, kind_code(Kind::AllGather).1, &[]), "none");
        assert_eq!(shown(2, DataType::Bf16.nccl() as u64, &[]), "bfloat16");
        assert_eq!(shown(1, 1024, &[]), "1024");
        assert_eq!(
            shown(5, 2, &["a", "b", "the copy engines"]),
            "the copy engines"
        );
        // A code no rank could send (a peer of another build): the number, no panic.
        assert_eq!(shown(0, 99, &[]), "99");
        assert_eq!(shown(0, 0, &[]), "0");
        assert_eq!(shown(3, u64::MAX, &[]), u64::MAX.to_string());
    }
}
