//! The all-to-all with counts on the device on the mock, with the protocol a GPU kernel
//! runs: the signature agreed at the first barrier; every rank reads every rank's row 0 of
//! the splits (so every rank finds the same fault and reports it alike, nothing moved);
//! each rank pulls its part from every rank's input, packed in rank order, and writes rows
//! 1 and 2 of its own splits; a second barrier (a refusal too passes it), after which the
//! inputs and the splits are the ranks' again. Every byte and count is read and written
//! atomically (peers' threads and processes share them).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use unicomm_core::{Error, Result};

use super::kernels::{write_bytes, Local, Run};
use super::protocol;
use super::table::Record;

/// One all-to-all on this rank: the splits' allocation, the element size, the input's
/// elements per rank, the output.
pub(crate) struct Exchange {
    pub splits: Arc<Record>,
    pub size: usize,
    pub capacity: usize,
    pub out: Local,
}

/// Every rank's row 0 (`rows[p][q]`: what `p` sends `q`), checked: no count negative, no
/// rank sending more than its input holds nor receiving more than `capacity`. The same
/// verdict on every rank (every rank reads the same words).
fn rows(run: &Run, x: &Exchange) -> Result<Vec<Vec<usize>>> {
    let w = run.world();
    let mut rows = Vec::with_capacity(w);
    for p in 0..w {
        let mut row = Vec::with_capacity(w);
        for q in 0..w {
            let n = x.splits.count(p, q)?.load(Ordering::Relaxed) as i64;
            let n = usize::try_from(n).map_err(|_| {
                Error::invalid(
                    "splits",
                    format!("rank {p} would send {n} elements to rank {q}"),
                )
            })?;
            row.push(n);
        }
        let sent: usize = row.iter().sum();
        if sent > x.capacity {
            return Err(Error::invalid(
                "splits",
                format!(
                    "rank {p} would send {sent} elements from a {}-element input",
                    x.capacity
                ),
            ));
        }
        rows.push(row);
    }
    for q in 0..w {
        let got: usize = rows.iter().map(|r| r[q]).sum();
        if got > x.capacity {
            return Err(Error::invalid(
                "splits",
                format!(
                    "rank {q} would receive {got} elements, past the {}-element bound (the input's size)",
                    x.capacity
                ),
            ));
        }
    }
    Ok(rows)
}

/// The all-to-all on this rank (see the module doc).
pub(crate) fn all_to_all_v(run: &Run, x: &Exchange) -> Result<()> {
    protocol::agree(run)?;
    // Refused alike on every rank, after the second barrier all the same: a rank that
    // went on at once could overwrite its splits while a slower peer still reads them.
    let rows = match rows(run, x) {
        Ok(rows) => rows,
        Err(e) => return protocol::barrier(run).and(Err(e)),
    };
    let (me, w, s) = (run.ctx.rank, run.world(), x.size);
    // What arrives, packed in rank order (at most `capacity` elements: checked in `rows`).
    let mut got = Vec::new();
    for (p, row) in rows.iter().enumerate() {
        let (n, from) = (row[me], row[..me].iter().sum::<usize>());
        let at = got.len() / s;
        for b in 0..n * s {
            got.push(run.rec.byte(p, from * s + b)?);
        }
        x.splits
            .count(me, w + p)?
            .store(n as u64, Ordering::Relaxed);
        x.splits
            .count(me, 2 * w + p)?
            .store(at as u64, Ordering::Relaxed);
    }
    write_bytes(&x.out, &got, run.ctx.timeout)?;
    protocol::barrier(run).map(drop)
}
