//! Memory shared between processes through the CUDA driver's virtual-memory calls
//! (`cuMem*`): an allocation exported as a POSIX descriptor, a peer's imported and mapped
//! here, and unmapped. Each runs with the device's context current (the caller's
//! `with_device`).

#![allow(unsafe_code, reason = "the CUDA driver through cudarc's result layer")]

use std::os::fd::{AsRawFd, FromRawFd};

use cudarc::driver::sys;
use unicomm_core::{Error, Result};
use unicomm_nccl_api::runtime::Exported;

use crate::driver_error::cuda_err;

/// The allocation holding `addr`, exported as a POSIX descriptor.
pub(crate) fn export(addr: usize) -> Result<Exported> {
    let (mut base, mut size) = (0, 0);
    // SAFETY: writes the base and size of the allocation holding `addr` (an error
    // for an address CUDA does not know).
    unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, addr as sys::CUdeviceptr) }
        .result()
        .map_err(|e| cuda_err("cuMemGetAddressRange", e))?;
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: writes the handle backing `addr`; an error for memory not mapped by
    // the cuMem API (cuMemAlloc memory, NCCL_CUMEM_ENABLE=0).
    unsafe { sys::cuMemRetainAllocationHandle(&mut h, addr as *mut std::ffi::c_void) }
        .result()
        .map_err(|e| cuda_err("cuMemRetainAllocationHandle", e))?;
    let mut fd: std::ffi::c_int = -1;
    // SAFETY: `h` is the handle retained above; for a POSIX descriptor the call
    // writes an int.
    let r = unsafe {
        sys::cuMemExportToShareableHandle(
            (&mut fd as *mut std::ffi::c_int).cast(),
            h,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    }
    .result();
    // SAFETY: releases the reference taken by cuMemRetainAllocationHandle; the
    // allocation stays mapped by its owner.
    let _ = unsafe { sys::cuMemRelease(h) };
    r.map_err(|e| cuda_err("cuMemExportToShareableHandle", e))?;
    if fd < 0 {
        return Err(Error::invalid(
            "export",
            "the driver returned no descriptor",
        ));
    }
    // SAFETY: a descriptor the driver just created for us; owned from here.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    Ok(Exported {
        fd,
        base: base as usize,
        size,
    })
}

/// The allocation behind `fd` (`size` bytes) mapped into this process for `dev`.
pub(crate) fn import(dev: usize, fd: std::os::fd::BorrowedFd<'_>, size: usize) -> Result<usize> {
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: `fd` is a descriptor exported by cuMemExportToShareableHandle (the
    // driver checks it); for POSIX descriptors the handle argument is the fd itself.
    unsafe {
        sys::cuMemImportFromShareableHandle(
            &mut h,
            fd.as_raw_fd() as isize as *mut std::ffi::c_void,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    }
    .result()
    .map_err(|e| cuda_err("cuMemImportFromShareableHandle", e))?;
    let release = |h| {
        // SAFETY: the imported handle, released once (the mapping, if any, keeps the
        // memory alive until it is unmapped).
        let _ = unsafe { sys::cuMemRelease(h) };
    };
    let mut va: sys::CUdeviceptr = 0;
    // SAFETY: reserves `size` bytes of address space (no memory touched).
    if let Err(e) = unsafe { sys::cuMemAddressReserve(&mut va, size, 0, 0, 0) }.result() {
        release(h);
        return Err(cuda_err("cuMemAddressReserve", e));
    }
    // SAFETY: maps the whole imported allocation (`size` is its size, from the
    // exporter) at the reservation made above.
    let mapped = unsafe { sys::cuMemMap(va, size, 0, h, 0) }.result();
    release(h);
    let undo = |va| {
        // SAFETY: the reservation made above, freed once.
        let _ = unsafe { sys::cuMemAddressFree(va, size) };
    };
    if let Err(e) = mapped {
        undo(va);
        return Err(cuda_err("cuMemMap", e));
    }
    // SAFETY: a plain C struct (zero is a valid value of every field).
    let mut desc: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
    desc.location = device_location(dev as std::ffi::c_int);
    desc.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    // SAFETY: grants `dev` access to the mapping made above.
    if let Err(e) = unsafe { sys::cuMemSetAccess(va, size, &desc, 1) }.result() {
        // SAFETY: the mapping made above, unmapped once; nothing used it.
        let _ = unsafe { sys::cuMemUnmap(va, size) };
        undo(va);
        return Err(cuda_err("cuMemSetAccess", e));
    }
    Ok(va as usize)
}

/// `CUmemLocation` of device `dev`, built from its C layout (`{ CUmemLocationType type; int
/// id; }`, the id inside a union from CUDA 13): cudarc's bindings spell the id's field per
/// CUDA version, and the version is the program's choice (docs/cuda.md), not unicomm's.
fn device_location(dev: std::ffi::c_int) -> sys::CUmemLocation {
    #[repr(C)]
    struct Location {
        kind: sys::CUmemLocationType,
        id: std::ffi::c_int,
    }
    let raw = Location {
        kind: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: dev,
    };
    // SAFETY: the driver's C struct has this layout in every CUDA version (the ABI; a size
    // that differed would not compile: transmute checks it).
    unsafe { std::mem::transmute::<Location, sys::CUmemLocation>(raw) }
}

/// Unmaps a mapping of [`import`] and frees its reservation.
///
/// # Safety
/// `addr..addr+size` is a mapping of [`import`] that no pending work uses; unmapped once.
pub(crate) unsafe fn unmap(addr: usize, size: usize) -> Result<()> {
    // SAFETY: the caller's contract: a mapping of `import`, idle, unmapped once.
    unsafe { sys::cuMemUnmap(addr as sys::CUdeviceptr, size) }
        .result()
        .map_err(|e| cuda_err("cuMemUnmap", e))?;
    // SAFETY: its reservation, freed once.
    unsafe { sys::cuMemAddressFree(addr as sys::CUdeviceptr, size) }
        .result()
        .map_err(|e| cuda_err("cuMemAddressFree", e))
}
