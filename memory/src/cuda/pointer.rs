//! What the driver knows about a device address: its allocation (`cuMemGetAddressRange`)
//! and pointer attributes ([`PointerInfo`]), or what the memory's owner recorded of them.
//! A leaf of the CUDA layer: the allocation (`alloc.rs`) and the foreign-memory wrappers
//! (`foreign.rs`) both ask here.

use super::context::Gpu;
use super::error::{check, CudaResult};
use crate::DeviceBuffer;
use cudarc::driver::sys;

/// What the driver knows about a device address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PointerInfo {
    /// Base address of the allocation holding the pointer (`cuMemGetAddressRange`).
    pub base: u64,
    /// Size of that allocation.
    pub alloc_len: usize,
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID`: unique per allocation for the process' life (a
    /// freed and reallocated range at the same address gets a new id).
    pub buffer_id: u64,
    /// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
    pub device_ordinal: usize,
    /// `CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`.
    pub legacy_ipc_capable: bool,
}

pub(super) fn attribute(attr: sys::CUpointer_attribute, ptr: u64) -> CudaResult<u64> {
    // Every attribute asked here is at most 8 bytes (bool, int, unsigned long long); the
    // zeroed 8-byte slot reads correctly for each on a little-endian host.
    let mut value: u64 = 0;
    // SAFETY: `value` is 8 writable bytes, enough for the attributes we ask for.
    check("cuPointerGetAttribute", unsafe { sys::cuPointerGetAttribute((&mut value as *mut u64).cast(), attr, ptr) })?;
    Ok(value)
}

/// The allocation holding `ptr` (`cuMemGetAddressRange`): (base, size), with `gpu`'s
/// context bound.
pub fn address_range(gpu: &Gpu, ptr: u64) -> CudaResult<(u64, usize)> {
    gpu.bind_to_current_thread()?;
    let mut base: sys::CUdeviceptr = 0;
    let mut size: usize = 0;
    // SAFETY: the context is bound; the call writes one address and one size.
    check("cuMemGetAddressRange", unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) })?;
    Ok((base, size))
}

/// Asks the driver about `ptr`, with `gpu`'s context bound.
pub fn pointer_info(gpu: &Gpu, ptr: u64) -> CudaResult<PointerInfo> {
    gpu.bind_to_current_thread()?;
    let mut base: sys::CUdeviceptr = 0;
    let mut size: usize = 0;
    // SAFETY: the context is bound; the call writes one address and one size.
    check("cuMemGetAddressRange", unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) })?;
    let buffer_id = attribute(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr)?;
    let ordinal = attribute(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)? as u32;
    let capable = attribute(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, ptr)?;
    Ok(PointerInfo {
        base,
        alloc_len: size,
        buffer_id,
        device_ordinal: ordinal as usize,
        legacy_ipc_capable: (capable & 0xff) != 0,
    })
}

/// [`pointer_info`] of a buffer's start address, in its device's context.
pub fn buffer_info(buf: &DeviceBuffer) -> CudaResult<PointerInfo> {
    let gpu = Gpu::get(buf.device_ordinal())?;
    pointer_info(&gpu, buf.device_ptr())
}

/// What the driver knows about a buffer's start address: what its owner recorded when it
/// allocated, else [`buffer_info`] (four driver queries).
pub fn known_buffer_info(buf: &DeviceBuffer) -> CudaResult<PointerInfo> {
    match buf.owner().allocation() {
        Some(a) => Ok(PointerInfo {
            base: a.base,
            alloc_len: a.len,
            buffer_id: a.buffer_id,
            device_ordinal: buf.device_ordinal(),
            legacy_ipc_capable: a.legacy_ipc_capable,
        }),
        None => buffer_info(buf),
    }
}
