//! The lowering of the collectives a library may lack (gather, scatter, the `v` kinds) to
//! the ones every NCCL has: grouped send/recv, broadcasts and reduces, as NCCL's
//! documentation and PyTorch's ProcessGroupNCCL build them.

use crate::op::{Kind, Op, Slice};
use crate::{Error, Result};

/// Whether a lowering keeps the point-to-point operations and broadcasts of zero elements.
/// NCCL's path skips them (nothing to move, and fewer calls); the mock keeps them, so that
/// ranks that disagree on a count meet and report `Mismatch` instead of waiting for a peer
/// that never sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zeros {
    /// Enqueue them.
    Keep,
    /// Leave them out.
    Skip,
}

fn sub<'a, M>(s: Slice<'a, M>, elem: usize, at: usize, n: usize) -> Slice<'a, M> {
    Slice {
        mem: s.mem,
        offset: s.offset + at * elem,
        bytes: n * elem,
    }
}

impl<'a, M> Op<'a, M> {
    /// This rank's part of the operation as operations every NCCL has (to enqueue inside
    /// one group): gather and scatter as send/recv to and from the root, all-to-all and
    /// all-to-all-v as a send and a receive per peer (as nccl-tests' alltoall runs where the
    /// library has no all-to-all, NCCL before 2.28), all-gather-v as one broadcast per rank, reduce-scatter-v
    /// as one reduce per rank. Any other kind lowers to itself. Call [`Op::check`] first:
    /// the ranges below are cut from checked ones.
    pub fn lower(&self, rank: usize, world: usize, zeros: Zeros) -> Result<Vec<Op<'a, M>>> {
        let (es, n, dt) = (self.dtype.size(), self.count, self.dtype);
        let keep = |c: usize| c > 0 || zeros == Zeros::Keep;
        let missing = |arg: &'static str| Error::invalid(arg, "missing for this operation");
        let mut ops = Vec::new();
        match self.kind {
            Kind::Gather { root } => {
                let send = self.send.ok_or_else(|| missing("send"))?;
                if rank == root {
                    let recv = self.recv.ok_or_else(|| missing("recv"))?;
                    for p in (0..world).filter(|_| keep(n)) {
                        ops.push(Op::recv(sub(recv, es, p * n, n), n, dt, p));
                    }
                }
                if keep(n) {
                    ops.push(Op::send(send, n, dt, root));
                }
            }
            Kind::Scatter { root } => {
                let recv = self.recv.ok_or_else(|| missing("recv"))?;
                if rank == root {
                    let send = self.send.ok_or_else(|| missing("send"))?;
                    for p in (0..world).filter(|_| keep(n)) {
                        ops.push(Op::send(sub(send, es, p * n, n), n, dt, p));
                    }
                }
                if keep(n) {
                    ops.push(Op::recv(recv, n, dt, root));
                }
            }
            Kind::AllToAllV => {
                let (send, recv) = self.pair()?;
                let sc = self.layout.send.ok_or_else(|| missing("send counts"))?;
                let rc = self.layout.recv.ok_or_else(|| missing("recv counts"))?;
                for p in 0..world {
                    if keep(sc.counts[p]) {
                        let s = sub(send, es, sc.displs[p], sc.counts[p]);
                        ops.push(Op::send(s, sc.counts[p], dt, p));
                    }
                    if keep(rc.counts[p]) {
                        let r = sub(recv, es, rc.displs[p], rc.counts[p]);
                        ops.push(Op::recv(r, rc.counts[p], dt, p));
                    }
                }
            }
            Kind::AllGatherV => {
                let (send, recv) = self.pair()?;
                let rc = self.layout.recv.ok_or_else(|| missing("recv counts"))?;
                for r in (0..world).filter(|&r| keep(rc.counts[r])) {
                    let out = sub(recv, es, rc.displs[r], rc.counts[r]);
                    // Off the root a broadcast reads no input: the output stands in for it.
                    let input = if r == rank { send } else { out };
                    let kind = Kind::Broadcast { root: r };
                    ops.push(Op::new(kind, input, out, rc.counts[r], dt));
                }
            }
            Kind::ReduceScatterV { op } => {
                let (send, recv) = self.pair()?;
                let sc = self.layout.send.ok_or_else(|| missing("send counts"))?;
                for r in (0..world).filter(|&r| keep(sc.counts[r])) {
                    let input = sub(send, es, sc.displs[r], sc.counts[r]);
                    // Off the root a reduce writes no output: in place on the input.
                    let out = if r == rank { recv } else { input };
                    let kind = Kind::Reduce { op, root: r };
                    ops.push(Op::new(kind, input, out, sc.counts[r], dt));
                }
            }
            Kind::AllToAll => {
                let send = self.send.ok_or_else(|| missing("send"))?;
                let recv = self.recv.ok_or_else(|| missing("recv"))?;
                for p in (0..world).filter(|_| keep(n)) {
                    ops.push(Op::send(sub(send, es, p * n, n), n, dt, p));
                    ops.push(Op::recv(sub(recv, es, p * n, n), n, dt, p));
                }
            }
            _ => ops.push(*self),
        }
        Ok(ops)
    }
}
