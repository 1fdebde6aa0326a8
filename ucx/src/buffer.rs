//! Memory that may be handed to UCX for the duration of a request.
//!
//! A request takes its buffer **by value** and keeps it until UCX is done with it: until
//! the request completes, or, when an incomplete request is dropped and UCX cannot cancel
//! it at once, until the worker sees it complete (or is destroyed). So safe code can never
//! free or reuse memory UCX is still reading or writing. The traits are `unsafe` because
//! the implementor promises a stable address.

use std::ffi::c_void;
use std::sync::Arc;

use ferrylink_memory::{DeviceBuffer, Frame, HostBuffer};

/// Where the bytes of a buffer live (the memory-type hint passed to UCX).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryType {
    /// Host (CPU) memory.
    Host,
    /// CUDA device memory. Only a CUDA-aware UCX accepts it
    /// ([`UcxContext::supports_cuda_memory`](super::UcxContext::supports_cuda_memory)).
    Cuda,
}

impl MemoryType {
    pub(crate) fn raw(self) -> ucx_sys::ucs_memory_type_t {
        match self {
            MemoryType::Host => ucx_sys::UCS_MEMORY_TYPE_HOST,
            MemoryType::Cuda => ucx_sys::UCS_MEMORY_TYPE_CUDA,
        }
    }
}

/// Memory UCX may read while a send is in flight.
///
/// # Safety
/// `as_ptr()` must be valid for reads of `len()` bytes of memory of `memory_type()` for as
/// long as the value lives, nothing may write those bytes meanwhile, and the address must
/// not change when the value is moved (heap or externally owned memory, never inline
/// storage).
pub unsafe trait SendBuf: 'static {
    /// Start of the bytes.
    fn as_ptr(&self) -> *const c_void;
    /// Number of bytes to send.
    fn len(&self) -> usize;
    /// Whether there are no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Where the bytes live.
    fn memory_type(&self) -> MemoryType {
        MemoryType::Host
    }
}

/// Memory UCX may write while a receive is in flight.
///
/// # Safety
/// `as_mut_ptr()` must be valid for writes of `len()` bytes of memory of `memory_type()`
/// for as long as the value lives, nothing else may access those bytes meanwhile, and the
/// address must not change when the value is moved.
pub unsafe trait RecvBuf: 'static {
    /// Start of the bytes.
    fn as_mut_ptr(&mut self) -> *mut c_void;
    /// Capacity in bytes (the largest message that fits; longer ones are truncated with
    /// `UCS_ERR_MESSAGE_TRUNCATED`).
    fn len(&self) -> usize;
    /// Whether there is no room.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Where the bytes live.
    fn memory_type(&self) -> MemoryType {
        MemoryType::Host
    }
}

// SAFETY: a Vec's heap block does not move when the Vec is moved, and the request owns
// the Vec, so nobody else can touch it; len() bytes are initialised and in bounds.
unsafe impl SendBuf for Vec<u8> {
    fn as_ptr(&self) -> *const c_void {
        self.as_slice().as_ptr().cast()
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

/// Receives into `vec[..vec.len()]` (size it first, e.g. `vec![0; n]`); capacity beyond
/// the length is not used.
// SAFETY: as for SendBuf; the request owns the Vec exclusively.
unsafe impl RecvBuf for Vec<u8> {
    fn as_mut_ptr(&mut self) -> *mut c_void {
        self.as_mut_slice().as_mut_ptr().cast()
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

// SAFETY: a boxed slice's heap block does not move with the box; owned exclusively.
unsafe impl SendBuf for Box<[u8]> {
    fn as_ptr(&self) -> *const c_void {
        (**self).as_ptr().cast()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
}

// SAFETY: as above.
unsafe impl RecvBuf for Box<[u8]> {
    fn as_mut_ptr(&mut self) -> *mut c_void {
        (**self).as_mut_ptr().cast()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
}

// SAFETY: shared immutable bytes: the Arc keeps them alive and at one address; `[u8]`
// behind an Arc cannot be mutated (no interior mutability).
unsafe impl SendBuf for Arc<[u8]> {
    fn as_ptr(&self) -> *const c_void {
        (**self).as_ptr().cast()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
}

// SAFETY: static immutable bytes live forever at one address.
unsafe impl SendBuf for &'static [u8] {
    fn as_ptr(&self) -> *const c_void {
        (**self).as_ptr().cast()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
}

// SAFETY: HostBuffer's bytes are an owned Vec's heap block or a range of a region kept
// alive by the buffer's Arc; neither moves with the HostBuffer, and the region guarantees
// no other live HostBuffer overlaps this one.
unsafe impl SendBuf for HostBuffer {
    fn as_ptr(&self) -> *const c_void {
        self.as_slice().as_ptr().cast()
    }
    fn len(&self) -> usize {
        HostBuffer::len(self)
    }
}

// SAFETY: as above; the request owns the HostBuffer, so it is the only way to reach the
// bytes while UCX writes them.
unsafe impl RecvBuf for HostBuffer {
    fn as_mut_ptr(&mut self) -> *mut c_void {
        self.as_mut_slice().as_mut_ptr().cast()
    }
    fn len(&self) -> usize {
        HostBuffer::len(self)
    }
}

// SAFETY: DeviceBuffer's contract (from_raw_parts) is that ptr..ptr+len is device memory
// kept valid by its owner while the buffer lives, not aliased mutably by another buffer.
unsafe impl SendBuf for DeviceBuffer {
    fn as_ptr(&self) -> *const c_void {
        self.device_ptr() as usize as *const c_void
    }
    fn len(&self) -> usize {
        DeviceBuffer::len(self)
    }
    fn memory_type(&self) -> MemoryType {
        MemoryType::Cuda
    }
}

// SAFETY: as above; owning the DeviceBuffer makes the request its only user.
unsafe impl RecvBuf for DeviceBuffer {
    fn as_mut_ptr(&mut self) -> *mut c_void {
        self.device_ptr() as usize as *mut c_void
    }
    fn len(&self) -> usize {
        DeviceBuffer::len(self)
    }
    fn memory_type(&self) -> MemoryType {
        MemoryType::Cuda
    }
}

/// Memory described by a raw pointer, for callers that manage its lifetime themselves.
#[derive(Debug)]
pub struct RawBuf {
    ptr: *mut c_void,
    len: usize,
    memory_type: MemoryType,
}

impl RawBuf {
    /// Describes `len` bytes at `ptr` of `memory_type`.
    ///
    /// # Safety
    /// The memory must stay valid (for reads when sent, for exclusive writes when
    /// received into) until the request that takes this `RawBuf` has completed, or, if
    /// that request is dropped before completing, until the owning worker reports
    /// [`orphans()`](super::UcxWorker::orphans) `== 0` or is destroyed (a worker
    /// dropped with requests still in flight after
    /// [`WORKER_DRAIN_TIMEOUT`](super::WORKER_DRAIN_TIMEOUT) is leaked, and then the
    /// memory must stay valid for the rest of the process).
    pub unsafe fn from_raw_parts(ptr: *mut c_void, len: usize, memory_type: MemoryType) -> Self {
        Self { ptr, len, memory_type }
    }
    /// The pointer.
    pub fn ptr(&self) -> *mut c_void {
        self.ptr
    }
}

// SAFETY: forwarded to the contract of RawBuf::from_raw_parts.
unsafe impl SendBuf for RawBuf {
    fn as_ptr(&self) -> *const c_void {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn memory_type(&self) -> MemoryType {
        self.memory_type
    }
}

// SAFETY: forwarded to the contract of RawBuf::from_raw_parts.
unsafe impl RecvBuf for RawBuf {
    fn as_mut_ptr(&mut self) -> *mut c_void {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn memory_type(&self) -> MemoryType {
        self.memory_type
    }
}

// SAFETY: a Frame's bytes are heap or device memory owned by the frame (a Vec's heap
// block, a shared mapping, a device allocation): moving the Frame does not move them, and
// while a UCX request owns the Frame nothing else reads or writes it.
unsafe impl SendBuf for Frame {
    fn as_ptr(&self) -> *const c_void {
        match self {
            Frame::Host(h) => h.as_slice().as_ptr().cast(),
            Frame::Device(d) => d.device_ptr() as *const c_void,
        }
    }
    fn len(&self) -> usize {
        Frame::len(self)
    }
    fn memory_type(&self) -> MemoryType {
        match self {
            Frame::Host(_) => MemoryType::Host,
            Frame::Device(_) => MemoryType::Cuda,
        }
    }
}

// SAFETY: as for SendBuf; the request owning the Frame is its only user.
unsafe impl RecvBuf for Frame {
    fn as_mut_ptr(&mut self) -> *mut c_void {
        match self {
            Frame::Host(h) => h.as_mut_slice().as_mut_ptr().cast(),
            Frame::Device(d) => d.device_ptr() as *mut c_void,
        }
    }
    fn len(&self) -> usize {
        Frame::len(self)
    }
    fn memory_type(&self) -> MemoryType {
        SendBuf::memory_type(self)
    }
}
