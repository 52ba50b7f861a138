//! The all-to-all with counts on the device (`all_to_all_vdev`), the same on every backend
//! that runs it: counts that vary by sender, receiver and round (zeros among them), every
//! element and every written count checked; eagerly, then over a graph's replays with new
//! counts and data written before each (the counts are read when the work runs, not when it
//! was captured); counts no rank can honour refused on every rank alike, and the ranks
//! still in step after it. Where the backend lacks it: `Unsupported`.

use unicomm_core::graph::Graph;
use unicomm_core::{each_rank, Collective, Comm, DeviceStream, Error, Result, Symmetric};

/// What rank `p` sends rank `q` in round `k`: 0 to `per`, skewed by all three.
fn count(k: usize, p: usize, q: usize, per: usize) -> usize {
    (p * 7 + q * 3 + k * 5) % (per + 1)
}

/// Element `j` of what `p` sends `q` in round `k` (exact in f32).
fn value(k: usize, p: usize, q: usize, j: usize) -> f32 {
    (((k % 64) * 16 + p) * 16 + q) as f32 * 64.0 + j as f32
}

/// One rank's buffers: the input, the splits, the output.
struct Bufs<'c, C: Collective> {
    input: Symmetric<'c, f32, C>,
    splits: Symmetric<'c, i64, C>,
    out: unicomm_core::Buffer<f32, C>,
    per: usize,
    /// Whether the output was cleared before the call checked.
    cleared: bool,
}

impl<C: Collective> Bufs<'_, C> {
    /// Round `k`'s input and row 0 written (rows 1 and 2 set to -1, so the call must write
    /// them).
    fn write(&self, c: &Comm<C>, k: usize, st: &C::Stream) -> Result<()> {
        let (r, w) = (c.rank(), c.world_size());
        let mut input = vec![0.0f32; w * self.per];
        let mut at = 0;
        let mut splits = vec![-1i64; 3 * w];
        for (q, split) in splits.iter_mut().take(w).enumerate() {
            let n = count(k, r, q, self.per);
            for j in 0..n {
                input[at + j] = value(k, r, q, j);
            }
            at += n;
            *split = n as i64;
        }
        self.input.write_from_host(&input, st)?;
        self.splits.write_from_host(&splits, st)
    }

    /// The output cleared to -1 (a graph holds it: its replays are checked on counts and
    /// data that change each round instead).
    fn clear(&mut self, st: &C::Stream) -> Result<()> {
        let n = self.out.len();
        self.out.copy_from_host(&vec![-1.0f32; n], st)
    }

    /// Round `k`'s output (what it received; past it, -1 where cleared) and rows 1 and 2
    /// checked.
    fn check(&self, c: &Comm<C>, k: usize, st: &C::Stream) -> Result<()> {
        let (r, w) = (c.rank(), c.world_size());
        let mut want = vec![-1.0f32; w * self.per];
        let mut rows = vec![0i64; 3 * w];
        let mut at = 0;
        for p in 0..w {
            let n = count(k, p, r, self.per);
            rows[p] = count(k, r, p, self.per) as i64;
            (rows[w + p], rows[2 * w + p]) = (n as i64, at as i64);
            for j in 0..n {
                want[at + j] = value(k, p, r, j);
            }
            at += n;
        }
        let (got, got_rows) = (self.out.copy_to_host(st)?, self.splits.copy_to_host(st)?);
        let wrong = |what: String| Err(Error::invalid("all_to_all_vdev", what));
        let upto = if self.cleared { want.len() } else { at };
        if let Some(i) = (0..upto).find(|&i| got[i] != want[i]) {
            return wrong(format!(
                "rank {r} of {w}, round {k}: element {i} is {}, {} was due",
                got[i], want[i]
            ));
        }
        if got_rows != rows {
            return wrong(format!(
                "rank {r} of {w}, round {k}: splits {got_rows:?}, {rows:?} were due"
            ));
        }
        Ok(())
    }
}

/// Two rounds eagerly, then `replays` replays of one captured call with new counts and data
/// before each, each checked; `per` elements at most per pair of ranks. What each rank saw:
/// `true`, or `false` where the backend lacks the call (`Unsupported`).
pub fn symmetric_all_to_all_v<C: Collective>(
    comms: &[Comm<C>],
    per: usize,
    replays: usize,
) -> Result<Vec<bool>> {
    each_rank(comms, |c| -> Result<bool> {
        let st = c.create_stream()?;
        let Some(mut b) = bufs(c, per)? else {
            return Ok(false);
        };
        for k in 0..2 {
            b.write(c, k, &st)?;
            b.clear(&st)?;
            b.cleared = true;
            match c.all_to_all_vdev(&b.input, &b.splits, &mut b.out, &st) {
                Err(Error::Unsupported { .. }) => return Ok(false),
                other => other?,
            }
            b.check(c, k, &st)?;
        }
        b.cleared = false;
        let graph = Graph::capture(&st, |g| g.all_to_all_vdev(c, &b.input, &b.splits, &b.out))?;
        for k in 2..2 + replays {
            b.write(c, k, &st)?;
            graph.launch(&st)?;
            b.check(c, k, &st)?;
        }
        st.synchronize()?;
        Ok(true)
    })
}

fn bufs<C: Collective>(c: &Comm<C>, per: usize) -> Result<Option<Bufs<'_, C>>> {
    let w = c.world_size();
    let input = match c.alloc_symmetric::<f32>(w * per) {
        Err(Error::Unsupported { .. }) => return Ok(None),
        other => other?,
    };
    Ok(Some(Bufs {
        input,
        splits: c.alloc_symmetric::<i64>(3 * w)?,
        out: c.alloc::<f32>(w * per)?,
        per,
        cleared: false,
    }))
}

/// Counts no rank can honour, set by the last rank alone (a negative count, then more than
/// its input holds): every rank gets `InvalidArgument` naming the splits, and a round after
/// each is exact (nothing moved, the ranks in step). Each rank's first refusal, as it reads
/// (`None` where the backend lacks the call).
pub fn all_to_all_v_refused<C: Collective>(comms: &[Comm<C>]) -> Result<Vec<Option<String>>> {
    each_rank(comms, |c| -> Result<Option<String>> {
        let (r, w, per) = (c.rank(), c.world_size(), 3);
        let st = c.create_stream()?;
        let Some(mut b) = bufs(c, per)? else {
            return Ok(None);
        };
        let mut first = None;
        for (k, bad) in [(0, -1i64), (1, (w * per + 1) as i64)] {
            b.write(c, k, &st)?;
            if r == w - 1 {
                let mut row = vec![0i64; 3 * w];
                row[0] = bad;
                b.splits.write_from_host(&row, &st)?;
            }
            let got = c
                .all_to_all_vdev(&b.input, &b.splits, &mut b.out, &st)
                .and_then(|()| st.synchronize());
            match got {
                Err(Error::Unsupported { .. }) => return Ok(None),
                Err(e @ Error::InvalidArgument { .. }) if e.to_string().contains("splits") => {
                    first.get_or_insert(e.to_string());
                }
                other => {
                    return Err(Error::invalid(
                        "all_to_all_vdev",
                        format!("rank {r}: {other:?} where counts of {bad} must be refused"),
                    ))
                }
            }
            b.write(c, k + 2, &st)?;
            c.all_to_all_vdev(&b.input, &b.splits, &mut b.out, &st)?;
            b.check(c, k + 2, &st)?;
        }
        Ok(first)
    })
}
