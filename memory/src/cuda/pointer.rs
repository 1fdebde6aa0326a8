//! What the driver knows about a device address: its allocation (`cuMemGetAddressRange`)
//! and pointer attributes ([`PointerInfo`]), or what the memory's owner recorded of them.
//! A leaf of the CUDA layer: the allocation (`alloc.rs`) and the foreign-memory wrappers
//! (`foreign.rs`) both ask here.

use super::context::Gpu;
use super::error::{check, CudaError, CudaResult};
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

/// Checks what `cuMemGetAddressRange` answered for `ptr`: a non-empty allocation
/// `base..base+size` that holds `ptr` and does not wrap around the address space. Callers
/// subtract `base` from addresses and add sizes to it, so a range that does not hold the
/// pointer is refused here.
pub(crate) fn check_address_range(ptr: u64, base: u64, size: usize) -> CudaResult<()> {
    let end = base.checked_add(size as u64);
    if size == 0 || base == 0 || base > ptr || end.is_none_or(|end| ptr >= end) {
        return Err(CudaError::invalid(
            "cuMemGetAddressRange",
            format!("the driver reported the allocation {base:#x}+{size:#x} for address {ptr:#x}"),
        ));
    }
    Ok(())
}

/// The device ordinal `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL` answered (an `int`, read from
/// the low 4 bytes of the attribute slot), checked to name one of the `count` devices.
pub(crate) fn check_device_ordinal(raw: u64, count: usize) -> CudaResult<usize> {
    let ordinal = raw as u32 as i32;
    match usize::try_from(ordinal) {
        Ok(ordinal) if ordinal < count => Ok(ordinal),
        _ => Err(CudaError::invalid(
            "cuPointerGetAttribute",
            format!("the driver reported device ordinal {ordinal} ({count} devices)"),
        )),
    }
}

/// The allocation holding `ptr` (`cuMemGetAddressRange`): (base, size), with `gpu`'s
/// context bound. The answer is checked to be a non-empty range holding `ptr`.
pub fn address_range(gpu: &Gpu, ptr: u64) -> CudaResult<(u64, usize)> {
    gpu.bind_to_current_thread()?;
    let mut base: sys::CUdeviceptr = 0;
    let mut size: usize = 0;
    // SAFETY: the context is bound; the call writes one address and one size.
    check("cuMemGetAddressRange", unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) })?;
    check_address_range(ptr, base, size)?;
    Ok((base, size))
}

/// Asks the driver about `ptr`, with `gpu`'s context bound. The range is checked as in
/// [`address_range`], the device ordinal to name a visible device.
pub fn pointer_info(gpu: &Gpu, ptr: u64) -> CudaResult<PointerInfo> {
    let (base, size) = address_range(gpu, ptr)?;
    let buffer_id = attribute(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr)?;
    let ordinal = attribute(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)?;
    let device_ordinal = check_device_ordinal(ordinal, super::device_count())?;
    let capable = attribute(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, ptr)?;
    Ok(PointerInfo { base, alloc_len: size, buffer_id, device_ordinal, legacy_ipc_capable: (capable & 0xff) != 0 })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_range_must_hold_the_pointer() {
        assert!(check_address_range(0x1000, 0x1000, 1).is_ok());
        assert!(check_address_range(0x1fff, 0x1000, 0x1000).is_ok());
        assert!(check_address_range(u64::MAX - 1, u64::MAX - 1, 1).is_ok());
        for (ptr, base, size) in [
            (0x1000, 0x1000, 0),          // empty
            (0x1000, 0, 0x2000),          // null base
            (0x0fff, 0x1000, 0x1000),     // starts after the pointer
            (0x2000, 0x1000, 0x1000),     // ends at the pointer
            (0x9000, 0x1000, 0x1000),     // far below it
            (u64::MAX, u64::MAX - 1, 4),  // wraps around
            (0x1000, 0x1000, usize::MAX), // wraps around
        ] {
            let err = check_address_range(ptr, base, size).unwrap_err();
            assert!(matches!(err, CudaError::InvalidArgument { call: "cuMemGetAddressRange", .. }), "{err:?}");
        }
    }

    #[test]
    fn a_device_ordinal_must_name_a_visible_device() {
        assert_eq!(check_device_ordinal(0, 1), Ok(0));
        assert_eq!(check_device_ordinal(7, 8), Ok(7));
        // Only the int in the low 4 bytes counts.
        assert_eq!(check_device_ordinal(0xdead_beef_0000_0003, 4), Ok(3));
        for (raw, count) in [(1, 1), (0, 0), (u64::from(u32::MAX), 8), (0xffff_fffe, 8), (1 << 31, 8)] {
            assert!(check_device_ordinal(raw, count).is_err(), "{raw:#x} of {count}");
        }
    }
}
