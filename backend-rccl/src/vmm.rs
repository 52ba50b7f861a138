//! HIP's virtual memory for the paths that reach peers' memory across processes: an
//! allocation exported as a POSIX descriptor, a peer's imported and mapped here.

#![allow(unsafe_code, reason = "the HIP runtime's virtual-memory calls")]

use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd};

use unicomm_core::{Error, Result};
use unicomm_nccl_api::runtime::Exported;
use unicomm_nccl_api::Runtime;

use crate::load::HipRuntime;
use crate::sys::*;

impl HipRuntime {
    /// [`Runtime::export_memory`](unicomm_nccl_api::Runtime::export_memory) on HIP.
    pub(crate) fn export_on(&self, dev: usize, addr: usize) -> Result<Exported> {
        let v = self.vmm()?;
        self.with_device(dev, || {
            let (mut base, mut size) = (0usize, 0usize);
            // SAFETY: writes the base and size of the allocation holding `addr`.
            self.check("hipMemGetAddressRange", unsafe {
                (v.mem_get_address_range)(&mut base, &mut size, addr)
            })?;
            let mut h: HipMemHandle = std::ptr::null_mut();
            // SAFETY: writes the handle backing `addr` (an error for non-VMM memory).
            self.check("hipMemRetainAllocationHandle", unsafe {
                (v.mem_retain_allocation_handle)(&mut h, addr as *mut c_void)
            })?;
            let mut fd: c_int = -1;
            // SAFETY: `h` was retained above; a POSIX descriptor is written as an int.
            let r = unsafe {
                (v.mem_export_to_shareable_handle)(
                    (&mut fd as *mut c_int).cast(),
                    h,
                    HIP_MEM_HANDLE_TYPE_POSIX_FD,
                    0,
                )
            };
            // SAFETY: releases the reference retained above; the owner's mapping stays.
            let _ = unsafe { (v.mem_release)(h) };
            self.check("hipMemExportToShareableHandle", r)?;
            if fd < 0 {
                return Err(Error::invalid(
                    "export",
                    "the runtime returned no descriptor",
                ));
            }
            // SAFETY: a descriptor the runtime just created for us; owned from here.
            let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
            Ok(Exported { fd, base, size })
        })
    }

    /// [`Runtime::import_memory`](unicomm_nccl_api::Runtime::import_memory) on HIP.
    pub(crate) fn import_on(
        &self,
        dev: usize,
        fd: std::os::fd::BorrowedFd<'_>,
        size: usize,
    ) -> Result<usize> {
        let v = self.vmm()?;
        self.with_device(dev, || {
            let mut h: HipMemHandle = std::ptr::null_mut();
            // SAFETY: `fd` was exported by hipMemExportToShareableHandle (the runtime checks
            // it); for POSIX descriptors the handle argument is the descriptor's value (as in
            // HIP's own IPC tests).
            self.check("hipMemImportFromShareableHandle", unsafe {
                (v.mem_import_from_shareable_handle)(
                    &mut h,
                    fd.as_raw_fd() as isize as *mut c_void,
                    HIP_MEM_HANDLE_TYPE_POSIX_FD,
                )
            })?;
            let mut va: *mut c_void = std::ptr::null_mut();
            // SAFETY: reserves address space only.
            let r = unsafe { (v.mem_address_reserve)(&mut va, size, 0, std::ptr::null_mut(), 0) };
            if r != HIP_SUCCESS {
                // SAFETY: the imported handle, released once.
                let _ = unsafe { (v.mem_release)(h) };
                return Err(self.err("hipMemAddressReserve", r));
            }
            // SAFETY: maps the whole imported allocation at the reservation above.
            let mapped = unsafe { (v.mem_map)(va, size, 0, h, 0) };
            // SAFETY: the imported handle, released once (the mapping keeps the memory).
            let _ = unsafe { (v.mem_release)(h) };
            let desc = HipMemAccessDesc {
                location_type: HIP_MEM_LOCATION_TYPE_DEVICE,
                location_id: dev as c_int,
                flags: HIP_MEM_ACCESS_FLAGS_PROT_READ_WRITE,
            };
            let access = if mapped == HIP_SUCCESS {
                // SAFETY: grants `dev` access to the mapping made above.
                unsafe { (v.mem_set_access)(va, size, &desc, 1) }
            } else {
                mapped
            };
            if access != HIP_SUCCESS {
                if mapped == HIP_SUCCESS {
                    // SAFETY: the mapping made above, unused, unmapped once.
                    let _ = unsafe { (v.mem_unmap)(va, size) };
                }
                // SAFETY: the reservation made above, freed once.
                let _ = unsafe { (v.mem_address_free)(va, size) };
                let call = if mapped == HIP_SUCCESS {
                    "hipMemSetAccess"
                } else {
                    "hipMemMap"
                };
                return Err(self.err(call, access));
            }
            Ok(va as usize)
        })
    }

    /// [`Runtime::unmap_imported`](unicomm_nccl_api::Runtime::unmap_imported) on HIP.
    ///
    /// # Safety
    /// `addr..addr+size` is a mapping of `import_on`, idle, unmapped once.
    pub(crate) unsafe fn unmap_on(&self, dev: usize, addr: usize, size: usize) -> Result<()> {
        let v = self.vmm()?;
        self.with_device(dev, || {
            // SAFETY: the trait contract: a mapping of `import_memory`, idle, unmapped once.
            self.check("hipMemUnmap", unsafe {
                (v.mem_unmap)(addr as *mut c_void, size)
            })?;
            // SAFETY: its reservation, freed once.
            self.check("hipMemAddressFree", unsafe {
                (v.mem_address_free)(addr as *mut c_void, size)
            })
        })
    }
}
