//! One plain `cuMemAlloc` allocation (RAII). Legacy-IPC exportable.

use super::context::Gpu;
use super::error::{check, CudaResult};
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
        // Freed by its Drop if the queries below fail.
        let mut allocation = DeviceAllocation {
            gpu: gpu.clone(),
            ptr,
            len,
            known: KnownAllocation { base: ptr, len, buffer_id: 0, legacy_ipc_capable: false },
        };
        let info = super::pointer::pointer_info(gpu, ptr)?;
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
