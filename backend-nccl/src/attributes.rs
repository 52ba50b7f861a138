//! What the driver says of a device: its compute capability, name and PCI bus id.

use cudarc::driver::sys;
use unicomm_core::Result;

use crate::driver_error::cuda_err;
use crate::runtime::CudaRuntime;

impl CudaRuntime {
    /// The compute capability of `dev` (`(9, 0)` for sm90), where the driver reports it.
    pub(crate) fn capability(&self, dev: usize) -> Option<(u32, u32)> {
        use sys::CUdevice_attribute as A;
        let c = self.context(dev).ok()?;
        let major = c
            .attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
            .ok()?;
        let minor = c
            .attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
            .ok()?;
        Some((u32::try_from(major).ok()?, u32::try_from(minor).ok()?))
    }

    /// The device's multiprocessors.
    pub(crate) fn multiprocessors(&self, dev: usize) -> Option<u32> {
        use sys::CUdevice_attribute as A;
        let c = self.context(dev).ok()?;
        let n = c
            .attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .ok()?;
        u32::try_from(n).ok()
    }

    /// The device's name and its PCI bus id (where the driver reports one).
    pub(crate) fn name_and_bus(&self, dev: usize) -> Result<(String, Option<String>)> {
        use sys::CUdevice_attribute as A;
        let c = self.context(dev)?;
        let name = c.name().map_err(|e| cuda_err("cuDeviceGetName", e))?;
        let attr = |a| {
            c.attribute(a)
                .map_err(|e| cuda_err("cuDeviceGetAttribute", e))
        };
        let bus = (|| -> Result<String> {
            Ok(format!(
                "{:04x}:{:02x}:{:02x}",
                attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
                attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
                attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?
            ))
        })();
        Ok((name, bus.ok()))
    }
}
