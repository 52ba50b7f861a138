//! The ranks' agreement on one collective: every field of their signatures compared, a
//! disagreement named field by field (`Mismatch`), before any peer's memory is touched.

use unicomm_core::registry::RegKind;
use unicomm_core::{Error, Result};

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
    check(all, "count", |s| s.count.to_string())?;
    check(all, "data type", |s| or_none(s.dtype))?;
    check(all, "reduction", |s| or_none(s.op))?;
    check(all, "root", |s| or_none(s.root))?;
    check(all, "registration of the send buffer", |s| reg(s.send_reg))?;
    check(all, "registration of the receive buffer", |s| {
        reg(s.recv_reg)
    })
}
