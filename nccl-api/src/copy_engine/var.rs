//! The copy-engine path for all-to-all-v: each rank copies what it sends a peer straight
//! into the peer's output window, at the peer's receive displacement for it.
//!
//! Unlike the fixed-size all-to-all, where every chunk's place follows from the count, a
//! peer's receive displacements are known only to that peer. So the ranks first exchange
//! their layouts (one host round trip through the communicator, `Agreement::gather`): per
//! rank, whether its output lies in a shared window, the output's offset in it, and its
//! send counts, receive counts and receive displacements. From that every rank
//! - takes the path only where every rank can (else every rank takes the library's),
//! - checks that what each rank sends each peer is what that peer receives from it, the
//!   whole matrix on every rank, so a disagreement is `Mismatch` on every rank alike rather
//!   than a hang or a partial write,
//! - and plans its copies: to peer `p`, `send_counts[p]` elements from `send_displs[p]` into
//!   `p`'s window at `p`'s offset plus `p`'s receive displacement for this rank.
//!
//! The exchange costs a round trip per call (tens of microseconds on a GPU), which the path
//! repays only for large exchanges: it is taken where the caller switched the path on
//! (`set_copy_engine`) and the output is a shared window, never by the automatic policy.

use unicomm_core::{Error, Kind, Op, Result};

use super::local::PeerPart;
use super::{CopyEngine, Plan};
use crate::base::Base;
use crate::group;
use crate::memory::{ApiMemory, ApiStream};
use crate::sys::codes::NcclCode;
use crate::sys::runtime::Runtime;

/// Words each rank offers before its three per-peer columns: whether it can take the path,
/// its output's offset in its window, and its element type (a peer of another element size
/// would place the copies at other byte offsets).
const HEAD: usize = 3;

impl<R: Runtime> CopyEngine<R> {
    /// The copies of an all-to-all-v on the copy-engine path, agreed with every rank
    /// (collective, whenever the path is on and the call is outside a group and a graph
    /// capture), or `None` where some rank cannot take it: the library's path runs on every
    /// rank then.
    #[inline]
    pub(crate) fn plan_v(
        &self,
        b: &Base<R>,
        op: &Op<'_, ApiMemory<R>>,
        stream: &ApiStream<R>,
    ) -> Result<Option<Plan>> {
        if !matches!(op.kind, Kind::AllToAllV) || !self.enabled() {
            return Ok(None);
        }
        self.plan_v_of(b, op, stream)
    }

    /// The agreement and the plan, out of line: only all-to-all-v calls with the path on.
    #[inline(never)]
    fn plan_v_of(
        &self,
        b: &Base<R>,
        op: &Op<'_, ApiMemory<R>>,
        stream: &ApiStream<R>,
    ) -> Result<Option<Plan>> {
        if group::in_group() || b.lc.rt.capturing(stream.inner())? {
            return Ok(None);
        }
        let (send, recv) = op.pair()?;
        let (Some(sc), Some(rc)) = (op.layout.send, op.layout.recv) else {
            return Err(Error::invalid("counts", "all_to_all_v needs both layouts"));
        };
        // Checked by `Op::check`: in bounds, no overflow.
        let extent = rc.extent().unwrap_or(0) * op.dtype.size();
        let mine = b
            .registry
            .window_covering(recv.address(), extent)?
            .and_then(|(h, _, base)| Some((recv.address() - base, self.sharing.peers_of(h)?)));
        let rows = Rows::gather(b, op, mine.as_ref().map(|m| m.0), sc, rc)?;
        rows.check_type(op, b.lc.rank)?;
        if !rows.all_windowed() {
            return Ok(None);
        }
        rows.check_counts()?;
        let Some((_, peers)) = mine else {
            return Ok(None);
        };
        let me = b.lc.rank;
        let es = op.dtype.size();
        let mut copies = Vec::with_capacity(rows.w);
        for k in 1..=rows.w {
            // Peers first, in a rotating order so the ranks do not all write to one peer at
            // once; this rank's own part last.
            let p = (me + k) % rows.w;
            let bytes = sc.counts[p] * es;
            let at = rows.place(p, me, es, bytes, peers[p])?;
            let src = send.address() + sc.displs[p] * es;
            let dst = peers[p].addr + at;
            if bytes > 0 && src != dst {
                copies.push((dst, src, bytes, p == me));
            }
        }
        Ok(Some(Plan { copies }))
    }
}

/// Every rank's row of the agreement, in rank order: [`HEAD`] words (whether its output
/// lies in a shared window, the output's offset in it, its element type's code), then its
/// send counts, receive counts and receive displacements, one per peer.
struct Rows {
    all: Vec<u64>,
    /// Words per row.
    n: usize,
    w: usize,
}

impl Rows {
    /// This rank's row offered to every rank and theirs gathered (one host round trip).
    fn gather<R: Runtime>(
        b: &Base<R>,
        op: &Op<'_, ApiMemory<R>>,
        offset: Option<usize>,
        sc: unicomm_core::Counts<'_>,
        rc: unicomm_core::Counts<'_>,
    ) -> Result<Rows> {
        let head = [
            u64::from(offset.is_some()),
            offset.map_or(0, |o| o as u64),
            op.dtype.nccl() as u64,
        ];
        let row: Vec<u64> = head
            .into_iter()
            .chain(sc.counts.iter().map(|&c| c as u64))
            .chain(rc.counts.iter().map(|&c| c as u64))
            .chain(rc.displs.iter().map(|&d| d as u64))
            .collect();
        let (n, w) = (row.len(), b.lc.world);
        let all = if w == 1 {
            row
        } else {
            b.agree.gather(&b.lc, &row)?
        };
        Ok(Rows { all, n, w })
    }

    fn at(&self, r: usize, i: usize) -> u64 {
        self.all[r * self.n + i]
    }

    /// Elements rank `r` sends rank `p`.
    fn sends(&self, r: usize, p: usize) -> u64 {
        self.at(r, HEAD + p)
    }

    /// Elements rank `r` receives from rank `p`.
    fn recvs(&self, r: usize, p: usize) -> u64 {
        self.at(r, HEAD + self.w + p)
    }

    /// Every rank's element type is this rank's (a peer of another element size would
    /// place the copies at other byte offsets): `Mismatch` naming the first that differs.
    fn check_type<R: Runtime>(&self, op: &Op<'_, ApiMemory<R>>, me: usize) -> Result<()> {
        let code = op.dtype.nccl() as u64;
        match (0..self.w).find(|&r| self.at(r, 2) != code) {
            Some(r) => Err(Error::Mismatch {
                what: "data type",
                detail: format!(
                    "all_to_all_v: {} here (rank {me}), type code {} on rank {r}",
                    op.dtype.name(),
                    self.at(r, 2)
                ),
            }),
            None => Ok(()),
        }
    }

    /// Whether every rank's output lies in a shared window (else none takes the path).
    fn all_windowed(&self) -> bool {
        (0..self.w).all(|r| self.at(r, 0) != 0)
    }

    /// What each rank sends each peer is what that peer receives from it: the whole matrix,
    /// on every rank, so every rank reaches the same verdict.
    fn check_counts(&self) -> Result<()> {
        let w = self.w;
        for (s, d) in (0..w).flat_map(|s| (0..w).map(move |d| (s, d))) {
            if self.sends(s, d) != self.recvs(d, s) {
                return Err(Error::Mismatch {
                    what: "count",
                    detail: format!(
                        "all_to_all_v: rank {s} sends {} elements to rank {d}, which receives {} from it",
                        self.sends(s, d),
                        self.recvs(d, s)
                    ),
                });
            }
        }
        Ok(())
    }

    /// Where in rank `p`'s window this rank's `bytes` for it go: `p`'s offset plus its
    /// receive displacement for this rank (in bytes of this rank's element type), checked
    /// again here so that no copy leaves the peer's window.
    fn place(&self, p: usize, me: usize, es: usize, bytes: usize, part: PeerPart) -> Result<usize> {
        self.at(p, HEAD + 2 * self.w + me)
            .checked_mul(es as u64)
            .and_then(|d| d.checked_add(self.at(p, 1)))
            .filter(|&a| a.saturating_add(bytes as u64) <= part.bytes as u64)
            .map(|a| a as usize)
            .ok_or_else(|| {
                Error::invalid(
                    "recv_counts",
                    format!(
                        "rank {p}'s displacement for rank {me} lies outside its {}-byte window",
                        part.bytes
                    ),
                )
            })
    }
}
