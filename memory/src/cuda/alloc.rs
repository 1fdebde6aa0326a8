//! One plain `cuMemAlloc` allocation (RAII). Legacy-IPC exportable.

use super::context::Gpu;
use super::error::{check, CudaError, CudaResult};
use super::pointer::PointerInfo;
use crate::{DeviceBuffer, DeviceMemoryOwner, KnownAllocation};
use cudarc::driver::sys;
use std::fmt;
use std::sync::Arc;

/// Device memory from `cuMemAlloc`, freed on drop. Unlike cudarc's stream-ordered
/// allocations, it can be exported with `cuIpcGetMemHandle`.
pub struct DeviceAllocation {
    gpu: Gpu,
    ptr: u64,
    len: usize,
    /// What the driver says about it, asked once.
    known: KnownAllocation,
}

impl DeviceAllocation {
    /// Allocates `len` bytes (at least 1) on `gpu`.
    pub fn new(gpu: &Gpu, len: usize) -> CudaResult<DeviceAllocation> {
        gpu.bind_to_current_thread()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: the context is bound; cuMemAlloc writes one address.
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, len.max(1)) })?;
        if ptr == 0 {
            // Nothing to free: the driver handed out no memory.
            return Err(CudaError::invalid("cuMemAlloc", "the driver returned a null address"));
        }
        // Freed by its Drop if the checks below fail.
        let mut allocation = DeviceAllocation {
            gpu: gpu.clone(),
            ptr,
            len,
            known: KnownAllocation { base: ptr, len, buffer_id: 0, legacy_ipc_capable: false },
        };
        let info = super::pointer::pointer_info(gpu, ptr)?;
        check_allocation(ptr, len, gpu.ordinal(), &info)?;
        allocation.known = KnownAllocation {
            base: info.base,
            len: info.alloc_len,
            buffer_id: info.buffer_id,
            legacy_ipc_capable: info.legacy_ipc_capable,
        };
        Ok(allocation)
    }

    /// The allocation as the driver described it when it was made.
    pub fn known(&self) -> KnownAllocation {
        self.known
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// The size asked for.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether zero bytes were asked for.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The whole allocation as a [`DeviceBuffer`] that frees it when dropped.
    pub fn into_buffer(self) -> DeviceBuffer {
        let (ptr, len, ordinal) = (self.ptr, self.len, self.gpu.ordinal());
        // SAFETY: the allocation is `len` bytes of device memory on this device and lives
        // as long as the owner (itself); the buffer is its only user.
        unsafe { DeviceBuffer::from_raw_parts(ptr, len, ordinal, Arc::new(self)) }
    }
}

/// Checks what the driver says about a fresh `cuMemAlloc` of `len` bytes at `ptr` on
/// device `ordinal`: the recorded allocation must hold all of `ptr..ptr+len` (without
/// wrapping) on that device, since exports compute offsets from it.
fn check_allocation(ptr: u64, len: usize, ordinal: usize, info: &PointerInfo) -> CudaResult<()> {
    let end = ptr.checked_add(len as u64);
    let alloc_end = info.base.checked_add(info.alloc_len as u64);
    let inside = matches!((end, alloc_end), (Some(end), Some(alloc_end)) if info.base <= ptr && end <= alloc_end);
    if !inside || info.device_ordinal != ordinal {
        return Err(CudaError::invalid(
            "cuMemAlloc",
            format!("{len} bytes at {ptr:#x} on device {ordinal}, but the driver describes {info:?}"),
        ));
    }
    Ok(())
}

impl DeviceMemoryOwner for DeviceAllocation {
    fn describe(&self) -> String {
        format!("cuMemAlloc {} B on device {}", self.len, self.gpu.ordinal())
    }
    fn allocation(&self) -> Option<KnownAllocation> {
        Some(self.known)
    }
}

impl Drop for DeviceAllocation {
    fn drop(&mut self) {
        if let Err(e) = self.gpu.bind_to_current_thread() {
            tracing::warn!(error = %e, ptr = self.ptr, "device allocation leaked: cannot bind its context");
            return;
        }
        // SAFETY: `ptr` came from cuMemAlloc and is freed exactly once, here.
        if let Err(e) = check("cuMemFree", unsafe { sys::cuMemFree_v2(self.ptr) }) {
            tracing::warn!(error = %e, ptr = self.ptr, "cuMemFree failed");
        }
    }
}

impl fmt::Debug for DeviceAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceAllocation")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("device", &self.gpu.ordinal())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(base: u64, alloc_len: usize, device_ordinal: usize) -> PointerInfo {
        PointerInfo { base, alloc_len, buffer_id: 1, device_ordinal, legacy_ipc_capable: true }
    }

    #[test]
    fn the_driver_must_describe_the_whole_allocation() {
        assert!(check_allocation(0x1000, 256, 0, &info(0x1000, 256, 0)).is_ok());
        assert!(check_allocation(0x1000, 0, 1, &info(0x1000, 1, 1)).is_ok());
        assert!(check_allocation(0x1000, 100, 0, &info(0x1000, 99, 0)).is_err(), "too short");
        assert!(check_allocation(0x1000, 100, 0, &info(0x1001, 4096, 0)).is_err(), "starts after it");
        assert!(check_allocation(0x1000, 100, 0, &info(0x1000, 100, 1)).is_err(), "other device");
        assert!(check_allocation(u64::MAX - 8, 100, 0, &info(u64::MAX - 8, 100, 0)).is_err(), "wraps");
    }
}
