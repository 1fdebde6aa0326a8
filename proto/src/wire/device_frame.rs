//! How a device frame travels: where the receiver opens its allocation, where in it the
//! frame lies, and the event it polls first. Both `Data` descriptors and one-sided
//! answers carry it.

use bincode::{Decode, Encode};

/// A device frame: where its allocation can be opened, where in the allocation it is,
/// and the interprocess event the receiver polls (until it completed) before copying.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct DeviceFrameDescriptor {
    /// How the receiver opens the allocation.
    pub memory: DeviceMemory,
    /// Offset of the frame in the allocation (for VMM: from the first chunk's start).
    pub offset: u64,
    /// Length of the frame.
    pub len: u64,
    /// UUID of the device the memory lives on.
    pub device_uuid: [u8; 16],
    /// `CUipcEventHandle` recorded after the producer's work, when there is one.
    pub event: Option<[u8; 64]>,
}

/// How a device frame's allocation is opened by the receiver.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum DeviceMemory {
    /// `cuMemAlloc` memory, exported with legacy CUDA IPC.
    LegacyIpc {
        /// `CUipcMemHandle` bytes of the allocation.
        handle: [u8; 64],
        /// `CU_POINTER_ATTRIBUTE_BUFFER_ID` of the allocation (unique per allocation).
        buffer_id: u64,
        /// Size of the allocation.
        alloc_len: u64,
    },
    /// VMM memory: chunks announced as `DeviceVmmChunk` regions, mapped side by side in
    /// this order; the frame lies within them.
    Vmm {
        /// The chunks' region ids, in address order.
        chunks: Vec<u64>,
    },
    /// A pointer of a stream-ordered pool announced as a `DevicePool` region.
    PoolPointer {
        /// The pool's region id.
        pool: u64,
        /// `CUmemPoolPtrExportData` of the allocation.
        export: [u8; 64],
        /// Size of the allocation.
        alloc_len: u64,
    },
}

impl DeviceFrameDescriptor {
    /// The bytes the allocation is known to hold, when the descriptor alone says it
    /// (not for VMM, whose chunks' sizes the regions say).
    pub fn alloc_len(&self) -> Option<u64> {
        match &self.memory {
            DeviceMemory::LegacyIpc { alloc_len, .. } | DeviceMemory::PoolPointer { alloc_len, .. } => Some(*alloc_len),
            DeviceMemory::Vmm { .. } => None,
        }
    }

    /// The region ids the descriptor refers to (VMM chunks, a pool).
    pub fn regions(&self) -> &[u64] {
        match &self.memory {
            DeviceMemory::LegacyIpc { .. } => &[],
            DeviceMemory::Vmm { chunks } => chunks,
            DeviceMemory::PoolPointer { pool, .. } => std::slice::from_ref(pool),
        }
    }
}
