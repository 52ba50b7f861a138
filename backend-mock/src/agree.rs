//! The ranks' agreement on one collective: every field of their signatures compared, a
//! disagreement named field by field (`Mismatch`), before any peer's memory is touched.

use unicomm_core::registry::RegKind;
use unicomm_core::{layout_disagreement, Error, Result};

use crate::fabric::{Desc, Signature};

/// Checks that every rank's signature agrees (a pre-multiplied sum's scalar is each rank's
/// own: its reduction shows as `premulsum`).
pub(crate) fn agree(all: &[Desc]) -> Result<()> {
    // What each rank passed, in words (the message a user reads).
    fn check(all: &[Desc], what: &'static str, f: impl Fn(&Signature) -> String) -> Result<()> {
        let first = f(&all[0].sig);
        if all.iter().all(|d| f(&d.sig) == first) {
            return Ok(());
        }
        let detail = all
            .iter()
            .enumerate()
            .map(|(r, d)| format!("rank {r}: {}", f(&d.sig)))
            .collect::<Vec<_>>()
            .join(", ");
        Err(Error::Mismatch { what, detail })
    }
    fn or_none<T: std::fmt::Display>(v: Option<T>) -> String {
        v.map_or_else(|| "none".to_string(), |v| v.to_string())
    }
    fn reg(r: Option<RegKind>) -> String {
        match r {
            None => "unregistered",
            Some(RegKind::Buffer) => "registered",
            Some(RegKind::Window) => "in a window",
            Some(RegKind::Auto) => "registered for the automatic policy",
        }
        .to_string()
    }
    check(all, "operation", |s| s.kind.to_string())?;
    // A symmetric allocation's agreement counts bytes per rank, every other one elements.
    match all.first().map(|d| d.sig.kind) {
        Some("SymmetricAlloc") => check(all, "bytes", |s| format!("{} bytes", s.count))?,
        _ => check(all, "count", |s| s.count.to_string())?,
    }
    check(all, "data type", |s| or_none(s.dtype))?;
    check(all, "reduction", |s| or_none(s.op))?;
    check(all, "root", |s| or_none(s.root))?;
    check(all, "registration of the send buffer", |s| reg(s.send_reg))?;
    check(all, "registration of the receive buffer", |s| {
        reg(s.recv_reg)
    })
}

impl crate::MockComm {
    /// The ranks' agreement on a variable-size layout, in stream order before its parts:
    /// every rank's counts gathered (an internal all-gather), then compared on each rank
    /// ([`layout_disagreement`]). A disagreement is the same `Mismatch` on every rank,
    /// naming the pair and both counts, and poisons the world before any part moves data
    /// (as NCCL's ranks would hang or corrupt on it). Inside a group, whose parts run as one
    /// batch, the parts' own pairing reports it instead.
    pub(crate) fn agree_layout(
        &self,
        op: &unicomm_core::Op<'_, crate::MockMemory>,
        stream: &crate::MockStream,
    ) -> Result<()> {
        use unicomm_core::{DataType, Kind, Op, Slice};
        let (w, kind) = (self.ctx.world, op.kind);
        let words = op.layout.words(kind);
        let bytes = words.len() * 8;
        let mine = crate::memory::MockMemory::new(bytes, self.owner(), self.shared)?;
        let raw: Vec<u8> = words.iter().flat_map(|x| x.to_ne_bytes()).collect();
        // Fresh memory no stream has seen: filled here, before the gather is enqueued.
        mine.inner.fill(&raw, self.ctx.timeout)?;
        let all = crate::memory::MockMemory::new(bytes * w, self.owner(), self.shared)?;
        let gather = Op::new(
            Kind::AllGather,
            Slice {
                mem: &mine,
                offset: 0,
                bytes,
            },
            Slice {
                mem: &all,
                offset: 0,
                bytes: bytes * w,
            },
            words.len(),
            DataType::U64,
        );
        self.enqueue_internal(gather, stream)?;
        let (ctx, gathered) = (self.ctx.clone(), all.inner.clone());
        stream.push(Box::new(move || {
            let raw = gathered.to_vec(ctx.timeout)?;
            let all: Vec<u64> = raw
                .chunks_exact(8)
                .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])))
                .collect();
            match layout_disagreement(kind, &all, ctx.world) {
                Some(e) => {
                    ctx.fabric.poison(e.clone());
                    Err(e)
                }
                None => Ok(()),
            }
        }))
    }
}
