//! Stream memory operations (`cuStreamWaitValue32`, `cuStreamWriteValue32`) on a device:
//! made through one helper that refuses them where the driver lacks them.

use cudarc::driver::sys;
use unicomm_core::Result;
use unicomm_nccl_api::Runtime;

use crate::driver_error::{cuda_err, no_mem_ops};
use crate::runtime::CudaRuntime;

impl CudaRuntime {
    /// A stream memory operation on `dev` (`op` makes the call), or `Unsupported` where the
    /// driver lacks them.
    pub(crate) fn mem_op(
        &self,
        dev: usize,
        call: &'static str,
        op: impl FnOnce() -> sys::CUresult,
    ) -> Result<()> {
        if !self.mem_ops {
            return Err(no_mem_ops());
        }
        self.with_device(dev, || op().result().map_err(|e| cuda_err(call, e)))
    }
}
