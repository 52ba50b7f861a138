//! The checks every call makes of its arguments before the library sees them.

use std::ffi::{c_int, c_void};

use unicomm_core::{DataType, DeviceMemory, Error, Result, Slice};

/// Device memory the library may read and write.
///
/// # Safety
/// `address()..address() + byte_len()` is device memory of the runtime the library uses,
/// allocated for as long as the value lives.
pub unsafe trait DeviceBytes: DeviceMemory {}

/// The device address of `s` when it holds `need` bytes inside its allocation (NULL for a
/// side the call does not read or write on this rank).
#[inline]
pub(super) fn span<M: DeviceBytes>(
    s: Option<&Slice<'_, M>>,
    need: usize,
    arg: &'static str,
) -> Result<*mut c_void> {
    match s {
        Some(s) if s.in_bounds() && s.bytes >= need => Ok(s.address() as *mut c_void),
        None if need == 0 => Ok(std::ptr::null_mut()),
        _ => Err(short(
            s.map(|s| (s.offset, s.bytes, s.mem.byte_len())),
            need,
            arg,
        )),
    }
}

#[cold]
#[inline(never)]
fn short(s: Option<(usize, usize, usize)>, need: usize, arg: &'static str) -> Error {
    match s {
        Some((offset, bytes, len)) => Error::invalid(
            arg,
            format!("{bytes} bytes at offset {offset} of a {len}-byte allocation, where the call reads or writes {need}"),
        ),
        None => Error::invalid(arg, format!("no buffer, where the call reads or writes {need} bytes")),
    }
}

/// `count` elements of `dtype` times `ranks`, in bytes.
#[inline]
pub(super) fn bytes_of(count: usize, dtype: DataType, ranks: usize) -> Result<usize> {
    count
        .checked_mul(dtype.size())
        .and_then(|b| b.checked_mul(ranks))
        .ok_or_else(|| Error::invalid("count", "count x element size x ranks overflows"))
}

/// The peer or root `r` as the library's int, when it is a rank of `world`.
#[inline]
pub(super) fn rank_in(r: usize, world: usize, arg: &'static str) -> Result<c_int> {
    if r < world {
        Ok(r as c_int)
    } else {
        Err(Error::invalid(
            arg,
            format!("rank {r} of a world of {world}"),
        ))
    }
}
