//! [`MappingLease`]: one use of a mapping, which stays open while any lease lives.

use super::opener::OpenedMapping;
use super::state::{Key, Release};
use crate::cuda_ipc::descriptor::check_range;
use crate::cuda_ipc::error::CudaIpcError;
use std::fmt;
use std::sync::Arc;

/// A use of a mapping: while any lease lives, the mapping stays open. Hold it until the
/// copies reading through it completed.
pub struct MappingLease {
    pub(super) cache: Arc<dyn Release>,
    pub(super) key: Key,
    pub(super) mapping: OpenedMapping,
    pub(super) alloc_len: u64,
}

impl MappingLease {
    /// Base address of the mapping in this process.
    pub fn base_ptr(&self) -> u64 {
        self.mapping.ptr
    }
    /// Address of `offset..offset+len` of the mapped allocation, checked against its size.
    pub fn range_ptr(&self, offset: u64, len: u64) -> Result<u64, CudaIpcError> {
        check_range(offset, len, self.alloc_len)?;
        // The cache checked that the mapping does not wrap; checked again, never trusted.
        self.mapping
            .ptr
            .checked_add(offset)
            .ok_or_else(|| CudaIpcError::InvalidCopy(format!("{:#x}+{offset:#x} wraps", self.mapping.ptr)))
    }
    /// Size of the mapped allocation.
    pub fn alloc_len(&self) -> u64 {
        self.alloc_len
    }
    /// The device (ordinal in this process) the mapping was opened on.
    pub fn device_ordinal(&self) -> usize {
        self.mapping.device_ordinal
    }
    /// The exporter's pid.
    pub fn peer_pid(&self) -> u32 {
        self.key.pid
    }
    /// The exporter's buffer id of the allocation.
    pub fn buffer_id(&self) -> u64 {
        self.key.buffer_id
    }
}

impl Clone for MappingLease {
    fn clone(&self) -> Self {
        // A clone is one more reference; the entry exists while `self` holds one.
        self.cache.retain(&self.key);
        MappingLease {
            cache: self.cache.clone(),
            key: self.key.clone(),
            mapping: self.mapping,
            alloc_len: self.alloc_len,
        }
    }
}

impl Drop for MappingLease {
    fn drop(&mut self) {
        self.cache.release(&self.key);
    }
}

impl fmt::Debug for MappingLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MappingLease")
            .field("pid", &self.key.pid)
            .field("buffer_id", &self.key.buffer_id)
            .field("ptr", &format_args!("{:#x}", self.mapping.ptr))
            .field("alloc_len", &self.alloc_len)
            .finish()
    }
}
