//! The checks of a mock memory access: a range inside its allocation, a stream of the
//! memory's rank.

use unicomm_core::{Error, Result};

use crate::stream::MockStream;

pub(crate) fn check_range(
    len: usize,
    offset: usize,
    bytes: usize,
    what: &'static str,
) -> Result<()> {
    match offset.checked_add(bytes) {
        Some(end) if end <= len => Ok(()),
        _ => Err(Error::invalid(
            what,
            format!("bytes {offset}..+{bytes} are outside the {len}-byte allocation"),
        )),
    }
}

/// A copy is ordered on a stream of the memory's own rank (another rank's stream would not
/// order it after this rank's work: stale data).
pub(super) fn same_rank(owner: (u64, usize), stream: &MockStream) -> Result<()> {
    if owner == stream.owner {
        Ok(())
    } else {
        Err(Error::invalid(
            "stream",
            format!(
                "a stream of rank {} used for memory of rank {}",
                stream.owner.1, owner.1
            ),
        ))
    }
}
