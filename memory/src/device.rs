//! Device (GPU) memory buffers.
//!
//! A [`DeviceBuffer`] is a pointer + length on one device plus an owner guard that keeps
//! the memory alive (a pool slab, a foreign allocation the user handed in). The CUDA
//! layer in [`crate::cuda`] creates them; the transport only reads them. Its synchronous
//! copy helpers (tests, small transfers) are defined in `cuda/buffer_copy.rs`, so this
//! module does not import the CUDA layer that imports it.

use std::fmt;
use std::sync::Arc;

/// Keeps device memory alive while a [`DeviceBuffer`] refers to it.
pub trait DeviceMemoryOwner: Send + Sync + 'static {
    /// A short description for logs ("pool slab 3", "foreign CudaSlice").
    fn describe(&self) -> String;
    /// The CUDA allocation the memory lies in, when the owner recorded it as it allocated
    /// (the export path then skips four driver queries per message); `None` otherwise.
    fn allocation(&self) -> Option<KnownAllocation> {
        None
    }
    /// Called when a buffer carved from this owner is dropped (pools reuse the range).
    fn release(&self, _ptr: u64, _len: usize) {}
}

/// A CUDA allocation as the driver described it once (`cuMemGetAddressRange` and the
/// pointer attributes), kept by the memory's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownAllocation {
    /// Base address.
    pub base: u64,
    /// Size, as `cuMemGetAddressRange` reports it.
    pub len: usize,
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID`.
    pub buffer_id: u64,
    /// `CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`.
    pub legacy_ipc_capable: bool,
}

/// Bytes in device memory on one CUDA device.
pub struct DeviceBuffer {
    ptr: u64,
    len: usize,
    device_ordinal: usize,
    owner: Arc<dyn DeviceMemoryOwner>,
}

impl DeviceBuffer {
    /// Wraps device memory.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be device memory of device `device_ordinal` (or unified memory
    /// accessible from it) that stays valid while `owner` lives, and no other live
    /// `DeviceBuffer` may alias it mutably.
    pub unsafe fn from_raw_parts(
        ptr: u64,
        len: usize,
        device_ordinal: usize,
        owner: Arc<dyn DeviceMemoryOwner>,
    ) -> Self {
        Self { ptr, len, device_ordinal, owner }
    }

    /// The device address (`CUdeviceptr`).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The CUDA device ordinal the memory lives on.
    pub fn device_ordinal(&self) -> usize {
        self.device_ordinal
    }
    /// The guard keeping the memory alive.
    pub fn owner(&self) -> &Arc<dyn DeviceMemoryOwner> {
        &self.owner
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        self.owner.release(self.ptr, self.len);
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("device", &self.device_ordinal)
            .field("owner", &self.owner.describe())
            .finish()
    }
}
