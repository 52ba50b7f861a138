//! A range of device memory by its address, as the copy-engine path exchanges it.

/// `bytes` bytes of device memory from `addr` (an `addr` of 0: this rank offers nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Region {
    pub(crate) addr: usize,
    pub(crate) bytes: usize,
}
