//! The per-rank counts and displacements of the variable-size collectives ([`Counts`],
//! [`Layout`]), checked in bounds and free of overflow.

use crate::{Error, Kind, Result};

/// Per-rank counts and displacements, in elements, of one side of a variable-size
/// collective (MPI's and RCCL's `counts`/`displs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts<'a> {
    /// Elements per rank.
    pub counts: &'a [usize],
    /// Offset of each rank's elements from the start of the buffer.
    pub displs: &'a [usize],
}

impl Counts<'_> {
    /// Checks `world` counts and displacements whose every range `[displ, displ + count)`
    /// fits `len` elements without overflow; the error names the side, the rank and the
    /// count.
    pub fn check(&self, world: usize, len: usize, arg: &'static str) -> Result<()> {
        if self.counts.len() != world || self.displs.len() != world {
            return Err(Error::invalid(
                arg,
                format!(
                    "{} counts and {} displacements for {world} ranks",
                    self.counts.len(),
                    self.displs.len()
                ),
            ));
        }
        for (r, (&c, &d)) in self.counts.iter().zip(self.displs).enumerate() {
            match d.checked_add(c) {
                Some(end) if end <= len => {}
                _ => {
                    return Err(Error::invalid(
                        arg,
                        format!(
                            "rank {r}: {c} elements at displacement {d} do not fit the {len} elements of the buffer"
                        ),
                    ))
                }
            }
        }
        Ok(())
    }

    /// Checks that no two ranks' ranges share an element: a receive location written twice
    /// (MPI forbids it; on a GPU the grouped receives race, on the mock the later peer's
    /// elements win). Empty ranges never overlap. O(n log n): the ranges sorted by start,
    /// each against the furthest end before it. The error names both ranks and the shared
    /// elements. Call after [`Counts::check`] (no range overflows).
    pub fn check_disjoint(&self, arg: &'static str) -> Result<()> {
        let mut order: Vec<usize> = (0..self.counts.len())
            .filter(|&r| self.counts[r] > 0)
            .collect();
        order.sort_unstable_by_key(|&r| (self.displs[r], r));
        // The rank whose range reaches furthest so far, and that end.
        let mut reach: Option<(usize, usize)> = None;
        for r in order {
            let (start, end) = (
                self.displs[r],
                self.displs[r].saturating_add(self.counts[r]),
            );
            if let Some((q, q_end)) = reach {
                if start < q_end {
                    return Err(overlap(arg, self, [q, r], q_end.min(end)));
                }
            }
            if reach.is_none_or(|(_, e)| end > e) {
                reach = Some((r, end));
            }
        }
        Ok(())
    }

    /// The end of the furthest range (elements the buffer must hold); `None` on overflow.
    pub fn extent(&self) -> Option<usize> {
        self.counts
            .iter()
            .zip(self.displs)
            .try_fold(0usize, |m, (&c, &d)| Some(m.max(d.checked_add(c)?)))
    }
}

/// Rank `a`'s range and rank `b`'s sharing elements up to `end`.
#[cold]
fn overlap(arg: &'static str, c: &Counts<'_>, ranks: [usize; 2], end: usize) -> Error {
    let [a, b] = ranks;
    let (a_at, a_n, b_at, b_n) = (c.displs[a], c.counts[a], c.displs[b], c.counts[b]);
    Error::invalid(
        arg,
        format!(
            "rank {a}'s {a_n} elements at {a_at} and rank {b}'s {b_n} elements at {b_at} share elements {b_at}..{end}: a receive location may be written once"
        ),
    )
}

/// The per-rank layouts of a variable-size collective: both sides for all-to-all-v, the
/// output of all-gather-v, the input of reduce-scatter-v.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Layout<'a> {
    /// How the input is cut among the ranks.
    pub send: Option<Counts<'a>>,
    /// How the output is cut among the ranks.
    pub recv: Option<Counts<'a>>,
}

impl Layout<'_> {
    /// What a rank offers the ranks' comparison of its layout for `kind`: for an
    /// all-to-all-v its send counts then its receive counts (two per peer); for the others
    /// the counts every rank passes (one per rank: all-gather-v's output, reduce-scatter-v's
    /// input).
    pub fn words(&self, kind: Kind) -> Vec<u64> {
        let of = |c: Option<Counts<'_>>| {
            c.map_or(Vec::new(), |c| c.counts.iter().map(|&n| n as u64).collect())
        };
        match kind {
            Kind::AllToAllV => [of(self.send), of(self.recv)].concat(),
            Kind::AllGatherV => of(self.recv),
            _ => of(self.send),
        }
    }
}

/// The first disagreement between the layouts the ranks passed to one `kind` call, given
/// every rank's [`Layout::words`] (rank after rank): `Mismatch` naming the pair and both
/// counts (all-to-all-v: what a rank sends a peer is what that peer receives from it), or
/// the first rank whose counts differ from rank 0's. Every rank that holds the same words
/// finds the same disagreement, so every rank reports it in the same words.
pub fn layout_disagreement(kind: Kind, all: &[u64], world: usize) -> Option<Error> {
    let n = all.len().checked_div(world)?;
    let row = |r: usize| &all[r * n..(r + 1) * n];
    let detail = if kind == Kind::AllToAllV {
        let w = n / 2;
        (0..world).find_map(|p| {
            (0..w.min(world)).find_map(|q| {
                let (sends, receives) = (row(p)[q], row(q)[w + p]);
                (sends != receives).then(|| {
                    format!(
                        "all_to_all_v: rank {p} sends {sends} elements to rank {q}, which receives {receives} from it"
                    )
                })
            })
        })
    } else {
        (1..world).find(|&r| row(r) != row(0)).map(|r| {
            format!(
                "{}: rank {r}'s counts {:?} differ from rank 0's {:?}",
                kind.name(),
                row(r),
                row(0)
            )
        })
    }?;
    Some(Error::Mismatch {
        what: "count",
        detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // MPI's and NCCL's rule: what rank p sends rank q is what q receives from p.
    #[test]
    fn a_disagreeing_pair_is_named_with_both_counts_the_same_on_every_rank() {
        // Rank 1 sends 3 to rank 2, which expects 2.
        let send = [[1, 1, 1], [1, 1, 3], [1, 1, 1]];
        let recv = [[1, 1, 1], [1, 1, 1], [1, 2, 1]];
        let all: Vec<u64> = (0..3)
            .flat_map(|r| send[r].iter().chain(recv[r].iter()).copied())
            .collect();
        let e = layout_disagreement(Kind::AllToAllV, &all, 3).unwrap();
        assert_eq!(
            e.to_string(),
            Error::Mismatch {
                what: "count",
                detail: "all_to_all_v: rank 1 sends 3 elements to rank 2, which receives 2 from it"
                    .into()
            }
            .to_string()
        );
        let fine: Vec<u64> = (0..3).flat_map(|_| [1u64; 6]).collect();
        assert!(layout_disagreement(Kind::AllToAllV, &fine, 3).is_none());
        let gather = [2, 2, 2, 2, 3, 2];
        let e = layout_disagreement(Kind::AllGatherV, &gather, 2).unwrap();
        assert!(e.to_string().contains("rank 1's counts [2, 3, 2]"), "{e}");
        assert!(layout_disagreement(Kind::AllGatherV, &[], 0).is_none());
    }

    fn disjoint(counts: &[usize], displs: &[usize]) -> Result<()> {
        Counts { counts, displs }.check_disjoint("recv")
    }

    /// The case that corrupted data silently: peer 1's range starts inside peer 0's.
    #[test]
    fn a_range_starting_inside_another_is_refused_naming_both_ranks() {
        let e = disjoint(&[2, 2, 2, 2], &[0, 1, 4, 6])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 0") && e.contains("rank 1") && e.contains("1..2"),
            "{e}"
        );
    }

    /// A short range inside a long one that started earlier, with a range between them in
    /// the sorted order: caught by the furthest end so far, not only the neighbour's.
    #[test]
    fn a_range_inside_an_earlier_long_one_is_refused() {
        let e = disjoint(&[10, 1, 1], &[0, 20, 5]).unwrap_err().to_string();
        assert!(e.contains("rank 0") && e.contains("rank 2"), "{e}");
    }

    #[test]
    fn touching_empty_and_unordered_ranges_are_fine() {
        disjoint(&[2, 2, 2], &[4, 0, 2]).unwrap();
        disjoint(&[0, 3, 0, 1], &[1, 0, 1, 3]).unwrap();
        disjoint(&[], &[]).unwrap();
    }

    /// O(n log n): a world of a million ranges, reversed, is checked at once.
    #[test]
    fn a_million_ranges_are_checked_by_sorting() {
        let n = 1_000_000;
        let counts = vec![3usize; n];
        let displs: Vec<usize> = (0..n).rev().map(|p| 3 * p).collect();
        let t = std::time::Instant::now();
        disjoint(&counts, &displs).unwrap();
        let mut dup = displs.clone();
        dup[n / 2] = dup[n / 2 + 1] + 1;
        assert!(disjoint(&counts, &dup).is_err());
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "{:?}",
            t.elapsed()
        );
    }
}
