//! The data calls: each checks that the memory it hands the library holds what the call
//! reads and writes on this rank (count x element size, x ranks where per rank).

use std::ffi::c_int;

use unicomm_core::{Counts, DataType, Error, Result, SignalWait, Slice};

use super::check::{bytes_of, rank_in, span, DeviceBytes};
use super::gates::{ONE_SIDED_SINCE, P2P_SINCE};
use super::handles::{CommRef, StreamRef, WindowRef};
use crate::sys::api::Api;
use crate::sys::codes::NcclCode;
use crate::sys::coll_config::CollConfig;
use crate::sys::target::ONE_SIDED_TITLE;

/// The buffers of one data call: what this rank sends and receives, and the call's
/// per-collective configuration where it has one.
pub struct Sides<'s, 'a, M> {
    /// What the call reads.
    pub send: Option<&'s Slice<'a, M>>,
    /// What the call writes.
    pub recv: Option<&'s Slice<'a, M>>,
    /// `ncclCollConfig_t`: the call is its `nccl*Config` variant (NCCL >= 2.32; the caller
    /// checked the release, the symbol is checked here).
    pub config: Option<&'s CollConfig>,
}

/// Where `$b.config` is set, the `nccl*Config` variant of the call: `$f` its symbol in the
/// table, `$name` its name, then the plain call's arguments (checked by the caller).
macro_rules! configured {
    ($self:ident, $b:ident, $f:ident, $name:literal, $comm:ident, ($($arg:expr),*)) => {
        if let Some(cfg) = $b.config {
            let f = $self.fns.$f.ok_or_else(|| $self.not_exported($name))?;
            // SAFETY: the plain call's arguments, checked above; `cfg` is a filled
            // ncclCollConfig_t that outlives the call.
            let code = unsafe { f($($arg),*, cfg.as_ptr()) };
            return $self.done($name, code, Some($comm.handle.raw));
        }
    };
}

/// Which side of a point-to-point call, with the peer.
#[derive(Debug, Clone, Copy)]
pub enum P2p {
    /// `ncclSend` to the peer.
    Send(usize),
    /// `ncclRecv` from the peer.
    Recv(usize),
}

/// The bytes the parts of one side of a variable-size exchange span (the end of the
/// furthest non-empty part: an empty part is neither read nor written, wherever it points).
fn parts_span(c: &Counts<'_>, world: usize, dtype: DataType) -> Result<usize> {
    if c.counts.len() != world || c.displs.len() != world {
        return Err(Error::invalid(
            "counts",
            format!(
                "{} counts and {} displacements for {world} ranks",
                c.counts.len(),
                c.displs.len()
            ),
        ));
    }
    let mut end = 0usize;
    for (&n, &d) in c.counts.iter().zip(c.displs).filter(|(&n, _)| n > 0) {
        let e = d
            .checked_add(n)
            .ok_or_else(|| Error::invalid("displs", "displacement + count overflows"))?;
        end = end.max(e);
    }
    bytes_of(end, dtype, 1)
}

/// `n` bytes on the root of a rooted call, none elsewhere (the side only the root uses).
#[inline]
fn at_root(comm: CommRef<'_>, root: usize, n: usize) -> usize {
    if comm.rank == root {
        n
    } else {
        0
    }
}

impl Api {
    /// `ncclAllReduce` of `count` elements of `wire` with the reduction `op`.
    #[inline(always)]
    pub fn all_reduce<M: DeviceBytes>(
        &self,
        b: Sides<'_, '_, M>,
        count: usize,
        wire: DataType,
        op: c_int,
        comm: CommRef<'_>,
        st: StreamRef<'_>,
    ) -> Result<()> {
        let n = bytes_of(count, wire, 1)?;
        let (s, r) = (span(b.send, n, "send")?, span(b.recv, n, "recv")?);
        configured!(
            self,
            b,
            all_reduce_config,
            "ncclAllReduceConfig",
            comm,
            (s, r, count, wire.nccl(), op, comm.handle.raw, st.raw)
        );
        // SAFETY: both sides hold `count` elements (checked); live communicator and stream.
        let code =
            unsafe { (self.fns.all_reduce)(s, r, count, wire.nccl(), op, comm.handle.raw, st.raw) };
        self.done("ncclAllReduce", code, Some(comm.handle.raw))
    }

    /// `ncclBroadcast` from `root`: the root's send side is read.
    pub fn broadcast<M: DeviceBytes>(
        &self,
        b: Sides<'_, '_, M>,
        count: usize,
        wire: DataType,
        root: usize,
        comm: CommRef<'_>,
        st: StreamRef<'_>,
    ) -> Result<()> {
        let n = bytes_of(count, wire, 1)?;
        let root_c = rank_in(root, comm.world, "root")?;
        let s = span(b.send, at_root(comm, root, n), "send")?;
        let r = span(b.recv, n, "recv")?;
        configured!(
            self,
            b,
            broadcast_config,
            "ncclBroadcastConfig",
            comm,
            (s, r, count, wire.nccl(), root_c, comm.handle.raw, st.raw)
        );
        // SAFETY: the root's send and every recv hold `count` elements (checked).
        let code = unsafe {
            (self.fns.broadcast)(s, r, count, wire.nccl(), root_c, comm.handle.raw, st.raw)
        };
        self.done("ncclBroadcast", code, Some(comm.handle.raw))
    }

    /// `ncclReduce` to `root`: only the root's recv side is written.
    #[allow(clippy::too_many_arguments, reason = "ncclReduce's own arguments")]
    pub fn reduce<M: DeviceBytes>(
        &self,
        b: Sides<'_, '_, M>,
        count: usize,
        wire: DataType,
        op: c_int,
        root: usize,
        comm: CommRef<'_>,
        st: StreamRef<'_>,
    ) -> Result<()> {
        let n = bytes_of(count, wire, 1)?;
        let root_c = rank_in(root, comm.world, "root")?;
        let s = span(b.send, n, "send")?;
        let r = span(b.recv, at_root(comm, root, n), "recv")?;
        configured!(
            self,
            b,
            reduce_config,
            "ncclReduceConfig",
            comm,
            (
                s,
                r,
                count,
                wire.nccl(),
                op,
                root_c,
                comm.handle.raw,
                st.raw
            )
        );
        // SAFETY: send holds `count` elements, and the root's recv (checked).
        let code = unsafe {
            (self.fns.reduce)(
                s,
                r,
                count,
                wire.nccl(),
                op,
                root_c,
                comm.handle.raw,
                st.raw,
            )
        };
        self.done("ncclReduce", code, Some(comm.handle.raw))
    }

    /// `ncclAllGather` of `count` elements per rank.
    pub fn all_gather<M: DeviceBytes>(
        &self,
        b: Sides<'_, '_, M>,
        count: usize,
        wire: DataType,
        comm: CommRef<'_>,
        st: StreamRef<'_>,
    ) -> Result<()> {
        let s = span(b.send, bytes_of(count, wire, 1)?, "send")?;
        let r = span(b.recv, bytes_of(count, wire, comm.world)?, "recv")?;
        configured!(
            self,
            b,
            all_gather_config,
            "ncclAllGatherConfig",
            comm,
            (s, r, count, wire.nccl(), comm.handle.raw, st.raw)
        );
        // SAFETY: send holds `count` elements, recv `count` per rank (checked).
        let code =
            unsafe { (self.fns.all_gather)(s, r, count, wire.nccl(), comm.handle.raw, st.raw) };
        self.done("ncclAllGather", code, Some(comm.handle.raw))
    }

    /// `ncclReduceScatter` of `count` elements per rank.
    pub fn reduce_scatter<M: DeviceBytes>(
        &self,
        b: Sides<'_, '_, M>,
        count: usize,
        wire: DataType,
        op: c_int,
        comm: CommRef<'_>,
        st: StreamRef<'_>,
    ) -> Result<()> {
        let s = span(b.send, bytes_of(count, wire, comm.world)?, "send")?;
        let r = span(b.recv, bytes_of(count, wire, 1)?, "recv")?;
        configured!(
            self,
            b,
            reduce_scatter_config,
            "ncclReduceScatterConfig",
            comm,
            (s, r, count, wire.nccl(), op, comm.handle.raw, st.raw)
        );
        // SAFETY: send holds `count` per rank, recv `count` elements (checked).
        let code = unsafe {
            (self.fns.reduce_scatter)(s, r, count, wire.nccl(), op, comm.handle.raw, st.raw)
        };
        self.done("ncclReduceScatter", code, Some(comm.handle.raw))
    }

    /// The library's all-to-all (`ncclAlltoAll` in NCCL >= 2.28, `ncclAllToAll` in RCCL) of
    /// `count` elements per peer; `Unsupported` where it has none.
    #[inline]
    pub fn all_to_all<M: DeviceBytes>(
        &self,
        b: Sides<'_, '_, M>,
        count: usize,
        wire: DataType,
        comm: CommRef<'_>,
        st: StreamRef<'_>,
    ) -> Result<()> {
        let f = self
            .all_to_all
            .ok_or_else(|| self.not_exported("all-to-all (ncclAlltoAll)"))?;
        let n = bytes_of(count, wire, comm.world)?;
        let (s, r) = (span(b.send, n, "send")?, span(b.recv, n, "recv")?);
        configured!(
            self,
            b,
            all_to_all_config,
            "ncclAlltoAllConfig",
            comm,
            (s, r, count, wire.nccl(), comm.handle.raw, st.raw)
        );
        // SAFETY: both sides hold `count` per rank (checked).
        let code = unsafe { f(s, r, count, wire.nccl(), comm.handle.raw, st.raw) };
        self.done("ncclAlltoAll", code, Some(comm.handle.raw))
    }

    /// `ncclGather` to `root` (NCCL >= 2.28).
    #[allow(clippy::too_many_arguments, reason = "ncclGather's own arguments")]
    pub fn gather<M: DeviceBytes>(
        &self,
        b: Sides<'_, '_, M>,
        count: usize,
        wire: DataType,
        root: usize,
        comm: CommRef<'_>,
        st: StreamRef<'_>,
    ) -> Result<()> {
        let f = self.fns.gather.filter(|_| self.native_gather_scatter());
        let f = f.ok_or_else(|| self.not_exported("ncclGather"))?;
        let root_c = rank_in(root, comm.world, "root")?;
        let s = span(b.send, bytes_of(count, wire, 1)?, "send")?;
        let r = span(
            b.recv,
            at_root(comm, root, bytes_of(count, wire, comm.world)?),
            "recv",
        )?;
        configured!(
            self,
            b,
            gather_config,
            "ncclGatherConfig",
            comm,
            (s, r, count, wire.nccl(), root_c, comm.handle.raw, st.raw)
        );
        // SAFETY: send holds `count` elements, the root's recv `count` per rank (checked).
        let code = unsafe { f(s, r, count, wire.nccl(), root_c, comm.handle.raw, st.raw) };
        self.done("ncclGather", code, Some(comm.handle.raw))
    }

    /// `ncclScatter` from `root` (NCCL >= 2.28).
    #[allow(clippy::too_many_arguments, reason = "ncclScatter's own arguments")]
    pub fn scatter<M: DeviceBytes>(
        &self,
        b: Sides<'_, '_, M>,
        count: usize,
        wire: DataType,
        root: usize,
        comm: CommRef<'_>,
        st: StreamRef<'_>,
    ) -> Result<()> {
        let f = self.fns.scatter.filter(|_| self.native_gather_scatter());
        let f = f.ok_or_else(|| self.not_exported("ncclScatter"))?;
        let root_c = rank_in(root, comm.world, "root")?;
        let s = span(
            b.send,
            at_root(comm, root, bytes_of(count, wire, comm.world)?),
            "send",
        )?;
        let r = span(b.recv, bytes_of(count, wire, 1)?, "recv")?;
        configured!(
            self,
            b,
            scatter_config,
            "ncclScatterConfig",
            comm,
            (s, r, count, wire.nccl(), root_c, comm.handle.raw, st.raw)
        );
        // SAFETY: the root's send holds `count` per rank, recv `count` elements (checked).
        let code = unsafe { f(s, r, count, wire.nccl(), root_c, comm.handle.raw, st.raw) };
        self.done("ncclScatter", code, Some(comm.handle.raw))
    }

    /// `ncclAllToAllv` (RCCL): each peer's part at its displacement.
    pub fn all_to_allv<M: DeviceBytes>(
        &self,
        b: Sides<'_, '_, M>,
        sc: Counts<'_>,
        rc: Counts<'_>,
        wire: DataType,
        comm: CommRef<'_>,
        st: StreamRef<'_>,
    ) -> Result<()> {
        let f = self
            .fns
            .all_to_allv
            .ok_or_else(|| self.not_exported("ncclAllToAllv"))?;
        let s = span(b.send, parts_span(&sc, comm.world, wire)?, "send")?;
        let r = span(b.recv, parts_span(&rc, comm.world, wire)?, "recv")?;
        // SAFETY: every part lies inside its side (checked); the four arrays hold `world`
        // entries each and live across the call.
        let code = unsafe {
            f(
                s,
                sc.counts.as_ptr(),
                sc.displs.as_ptr(),
                r,
                rc.counts.as_ptr(),
                rc.displs.as_ptr(),
                wire.nccl(),
                comm.handle.raw,
                st.raw,
            )
        };
        self.done("ncclAllToAllv", code, Some(comm.handle.raw))
    }

    /// `ncclSend` or `ncclRecv` of `count` elements (NCCL >= 2.7).
    pub fn send_recv<M: DeviceBytes>(
        &self,
        buf: &Slice<'_, M>,
        count: usize,
        wire: DataType,
        with: P2p,
        comm: CommRef<'_>,
        st: StreamRef<'_>,
    ) -> Result<()> {
        let pair = self.fns.send.zip(self.fns.recv);
        let (s, r) = self.gated("point-to-point send/recv", P2P_SINCE, pair)?;
        let p = span(Some(buf), bytes_of(count, wire, 1)?, "buffer")?;
        let (P2p::Send(peer) | P2p::Recv(peer)) = with;
        let peer = rank_in(peer, comm.world, "peer")?;
        let (dt, c) = (wire.nccl(), comm.handle.raw);
        // SAFETY: `buf` holds `count` elements (checked); live communicator and stream.
        let (code, name) = unsafe {
            match with {
                P2p::Send(_) => (s(p, count, dt, peer, c, st.raw), "ncclSend"),
                P2p::Recv(_) => (r(p, count, dt, peer, c, st.raw), "ncclRecv"),
            }
        };
        self.done(name, code, Some(c))
    }
}

/// `ncclUint8`: a put moves bytes.
const BYTES: c_int = 1;

/// `ncclWaitSignalDesc_t`.
#[repr(C)]
struct WaitDesc {
    op_cnt: c_int,
    peer: c_int,
    sig_idx: c_int,
    ctx: c_int,
}

/// The one-sided calls (NCCL >= 2.29.2). NCCL takes signal index 0, context 0 and no flags
/// only (its `rmaTaskAppend`), so the calls pass those.
impl Api {
    /// `ncclPutSignal` of `src`'s bytes into `peer`'s part of `win` at byte `offset`, then a
    /// signal to `peer`.
    pub fn put_signal<M: DeviceBytes>(
        &self,
        src: &Slice<'_, M>,
        peer: usize,
        win: WindowRef<'_>,
        offset: usize,
        comm: CommRef<'_>,
        st: StreamRef<'_>,
    ) -> Result<()> {
        let f = self.gated(ONE_SIDED_TITLE, ONE_SIDED_SINCE, self.fns.put_signal)?;
        let p = span(Some(src), src.bytes, "src")?;
        let peer = rank_in(peer, comm.world, "peer")?;
        let c = comm.handle.raw;
        // SAFETY: `src` holds its bytes (checked), `win` a live window of `c` (the reference's
        // contract), a live communicator and stream; signal index, context and flags 0.
        let code = unsafe {
            f(
                p, src.bytes, BYTES, peer, win.raw, offset, 0, 0, 0, c, st.raw,
            )
        };
        self.done("ncclPutSignal", code, Some(c))
    }

    /// `ncclSignal` to `peer`.
    pub fn signal(&self, peer: usize, comm: CommRef<'_>, st: StreamRef<'_>) -> Result<()> {
        let f = self.gated(ONE_SIDED_TITLE, ONE_SIDED_SINCE, self.fns.signal)?;
        let peer = rank_in(peer, comm.world, "peer")?;
        let c = comm.handle.raw;
        // SAFETY: a live communicator and stream; signal index, context and flags 0.
        let code = unsafe { f(peer, 0, 0, 0, c, st.raw) };
        self.done("ncclSignal", code, Some(c))
    }

    /// `ncclWaitSignal` for `waits`.
    pub fn wait_signal(
        &self,
        waits: &[SignalWait],
        comm: CommRef<'_>,
        st: StreamRef<'_>,
    ) -> Result<()> {
        let f = self.gated(ONE_SIDED_TITLE, ONE_SIDED_SINCE, self.fns.wait_signal)?;
        let mut descs = waits
            .iter()
            .map(|w| {
                let op_cnt = c_int::try_from(w.count)
                    .map_err(|_| Error::invalid("waits", "a count past a C int"))?;
                let peer = rank_in(w.peer, comm.world, "waits")?;
                Ok(WaitDesc {
                    op_cnt,
                    peer,
                    sig_idx: 0,
                    ctx: 0,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let n = c_int::try_from(descs.len())
            .map_err(|_| Error::invalid("waits", "more entries than a C int counts"))?;
        let c = comm.handle.raw;
        // SAFETY: `descs` holds `n` ncclWaitSignalDesc_t read during the call; a live
        // communicator and stream.
        let code = unsafe { f(n, descs.as_mut_ptr().cast(), c, st.raw) };
        self.done("ncclWaitSignal", code, Some(c))
    }
}
