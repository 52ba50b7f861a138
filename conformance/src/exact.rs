//! What every check of the groups suite shares: uploading host values, and comparing an
//! output element by element with what it must be.

use unicomm_core::{Collective, Comm, Element};

use super::Failure;

pub(super) type Out = std::result::Result<(), Failure>;

pub(super) fn upload<T: Element, C: Collective>(
    c: &Comm<C>,
    v: &[T],
    st: &C::Stream,
) -> unicomm_core::Result<unicomm_core::Buffer<T, C>> {
    let mut b = c.alloc::<T>(v.len())?;
    b.copy_from_host(v, st)?;
    Ok(b)
}

pub(super) fn same<T: PartialEq + std::fmt::Debug>(got: &[T], want: &[T], what: &str) -> Out {
    match got.iter().zip(want).position(|(g, w)| g != w) {
        _ if got.len() != want.len() => Err(Failure::msg(format!(
            "{what}: {} elements, want {}",
            got.len(),
            want.len()
        ))),
        None => Ok(()),
        Some(i) => Err(Failure::msg(format!(
            "{what}: element {i} is {:?}, want {:?}",
            got[i], want[i]
        ))),
    }
}
