//! The per-rank counts and displacements of the variable-size collectives ([`Counts`],
//! [`Layout`]), checked in bounds and free of overflow.

use crate::{Error, Result};

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

    /// The end of the furthest range (elements the buffer must hold); `None` on overflow.
    pub fn extent(&self) -> Option<usize> {
        self.counts
            .iter()
            .zip(self.displs)
            .try_fold(0usize, |m, (&c, &d)| Some(m.max(d.checked_add(c)?)))
    }
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
