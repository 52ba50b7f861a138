//! The all-to-all with counts on the device (`all_to_all_vdev`) as a launch of unicomm's
//! symmetric kernels (`ALG_ALL_TO_ALL_V` in kernels/symmetric.cu): the input's allocation
//! and the splits' checked against the capacity, the output against it. The protocol is
//! the mock's (backend-mock/src/symmetric/exchange.rs).

use unicomm_core::symmetric::AllToAllV;
use unicomm_core::{Error, Result};

use super::SymmetricMemory;
use crate::base::Base;
use crate::memory::ApiMemory;
use crate::sys::kernel_args::{vector_blocks, KernelAlgorithm, KernelParams};
use crate::sys::runtime::Runtime;

impl<R: Runtime> SymmetricMemory<R> {
    /// The launch of an all-to-all with counts on the device.
    pub(super) fn all_to_all_v_params(
        &self,
        base: &Base<R>,
        control: usize,
        a: &AllToAllV<'_, ApiMemory<R>>,
    ) -> Result<KernelParams> {
        let w = base.lc.world;
        let size = a.dtype.size();
        let bytes = a.capacity.checked_mul(size).ok_or_else(|| {
            Error::invalid("capacity", format!("{} elements overflow", a.capacity))
        })?;
        let input = self.get(a.handle)?;
        let splits = self.get(a.splits)?;
        if input.bytes < bytes || splits.bytes < 3 * w * 8 || splits.peers.len() != w {
            return Err(Error::invalid(
                "splits",
                format!(
                    "an input of {} bytes and splits of {} for {} elements of {} over {w} ranks",
                    input.bytes, splits.bytes, a.capacity, a.dtype
                ),
            ));
        }
        base.check_memory(a.out.mem)?;
        a.out.holds(a.capacity, a.dtype, "out")?;
        let mut p = super::params_of(base, &input, control, KernelAlgorithm::AllToAllV);
        for (r, &at) in splits.peers.iter().enumerate() {
            p.x.meta[r] = at as u64;
        }
        p.out = a.out.address() as u64;
        p.count = a.capacity as u64;
        p.x.row_bytes = size as u32;
        p.blocks = vector_blocks(bytes);
        Ok(p)
    }
}
