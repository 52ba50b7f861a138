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
        let lc = &b.lc;
        let (w, me, es) = (lc.world, lc.rank, op.dtype.size());
        let (send, recv) = op.pair()?;
        let (Some(sc), Some(rc)) = (op.layout.send, op.layout.recv) else {
            return Err(Error::invalid("counts", "all_to_all_v needs both layouts"));
        };
        // Checked by `Op::check`: in bounds, no overflow.
        let extent = rc.extent().unwrap_or(0) * es;
        let mine = b
            .registry
            .window_covering(recv.address(), extent)?
            .and_then(|(h, _, base)| Some((recv.address() - base, self.sharing.peers_of(h)?)));
        let head = [
            u64::from(mine.is_some()),
            mine.as_ref().map_or(0, |m| m.0 as u64),
            op.dtype.nccl() as u64,
        ];
        let row: Vec<u64> = head
            .into_iter()
            .chain(sc.counts.iter().map(|&c| c as u64))
            .chain(rc.counts.iter().map(|&c| c as u64))
            .chain(rc.displs.iter().map(|&d| d as u64))
            .collect();
        let n = row.len();
        let all = if w == 1 {
            row
        } else {
            b.agree.gather(lc, &row)?
        };
        let at = |r: usize, i: usize| all[r * n + i];
        let (sends, recvs, rdispl) = (
            |r: usize, p: usize| at(r, HEAD + p),
            |r: usize, p: usize| at(r, HEAD + w + p),
            |r: usize, p: usize| at(r, HEAD + 2 * w + p),
        );
        if let Some(r) = (0..w).find(|&r| at(r, 2) != head[2]) {
            return Err(Error::Mismatch {
                what: "data type",
                detail: format!(
                    "all_to_all_v: {} here (rank {me}), type code {} on rank {r}",
                    op.dtype.name(),
                    at(r, 2)
                ),
            });
        }
        if (0..w).any(|r| at(r, 0) == 0) {
            return Ok(None);
        }
        // Every pair, on every rank: all ranks reach the same verdict.
        for (s, d) in (0..w).flat_map(|s| (0..w).map(move |d| (s, d))) {
            if sends(s, d) != recvs(d, s) {
                return Err(Error::Mismatch {
                    what: "count",
                    detail: format!(
                        "all_to_all_v: rank {s} sends {} elements to rank {d}, which receives {} from it",
                        sends(s, d),
                        recvs(d, s)
                    ),
                });
            }
        }
        let Some((_, peers)) = mine else {
            return Ok(None);
        };
        let mut copies = Vec::with_capacity(w);
        for k in 1..=w {
            // Peers first, in a rotating order so the ranks do not all write to one peer at
            // once; this rank's own part last.
            let p = (me + k) % w;
            let (_, peer_base, peer_bytes) = peers[p];
            let bytes = sc.counts[p] * es;
            // The peer checked its own layout against its window; checked again here, in
            // bytes of this rank's element type, so no copy leaves the peer's window.
            let at = rdispl(p, me)
                .checked_mul(es as u64)
                .and_then(|d| d.checked_add(at(p, 1)))
                .filter(|&a| a.saturating_add(bytes as u64) <= peer_bytes as u64);
            let Some(at) = at else {
                return Err(Error::invalid(
                    "recv_counts",
                    format!(
                        "rank {p}'s displacement for rank {me} lies outside its {peer_bytes}-byte window"
                    ),
                ));
            };
            let src = send.address() + sc.displs[p] * es;
            let dst = peer_base + at as usize;
            if bytes > 0 && src != dst {
                copies.push((dst, src, bytes, p == me));
            }
        }
        Ok(Some(Plan { copies }))
    }
}
