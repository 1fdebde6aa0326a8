//! Device (GPU) memory buffers.
//!
//! A [`DeviceBuffer`] is a pointer + length on one device plus an owner guard that keeps
//! the memory alive (a pool slab, a foreign allocation the user handed in). The CUDA
//! layer in [`crate::cuda`] creates them; the transport only reads them. Its synchronous
//! copy helpers (tests, small transfers) are defined in `cuda/buffer_copy.rs`, so this
//! module does not import the CUDA layer that imports it.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, OnceLock};

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
    /// The owner as `Any`, for owners that can give their memory back in its original form
    /// (a cudarc `CudaSlice`: [`DeviceBuffer::into_cuda_slice`](crate::DeviceBuffer)).
    fn as_any(&self) -> Option<&dyn Any> {
        None
    }
}

/// The CUDA stream the bytes of a [`DeviceBuffer`] were (or are being) produced on: a send
/// orders its copies after the work submitted there before `send`, non-blocking streams
/// included (an event recorded on it, waited on by the copy stream or polled).
#[derive(Clone)]
pub enum ProducerStream {
    /// A cudarc stream (kept alive while the buffer refers to it).
    Cudarc(Arc<cudarc::driver::CudaStream>),
    /// A raw `CUstream` the caller keeps alive (see [`DeviceBuffer::produced_on_raw`]).
    Raw(RawStreamHandle),
}

/// A raw `CUstream` handle, which the driver lets any thread use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawStreamHandle(pub(crate) cudarc::driver::sys::CUstream);
// SAFETY: a CUstream is an opaque driver handle valid on every thread of the process; the
// driver serialises submissions to one stream.
unsafe impl Send for RawStreamHandle {}
// SAFETY: as above; it is never dereferenced here.
unsafe impl Sync for RawStreamHandle {}

impl ProducerStream {
    /// A raw `CUstream` as a producer stream.
    ///
    /// # Safety
    /// `stream` must be a stream of a device's primary context (or null, the legacy
    /// default stream) that stays alive while the returned value, or any buffer naming
    /// it, is used to order work (see [`DeviceBuffer::produced_on_raw`]).
    pub unsafe fn from_raw(stream: cudarc::driver::sys::CUstream) -> Self {
        ProducerStream::Raw(RawStreamHandle(stream))
    }

    /// The raw handle (null: the legacy default stream).
    pub fn raw(&self) -> cudarc::driver::sys::CUstream {
        match self {
            ProducerStream::Cudarc(s) => s.cu_stream(),
            ProducerStream::Raw(r) => r.0,
        }
    }

    /// Whether this is the legacy default stream (the null handle, or `CU_STREAM_LEGACY`):
    /// work there is ordered before anything later put on that stream, so an event on the
    /// legacy stream already covers it.
    pub fn is_legacy_default(&self) -> bool {
        let raw = self.raw() as usize;
        raw == 0 || raw == CU_STREAM_LEGACY
    }
}

/// `CU_STREAM_LEGACY` (`((CUstream)0x1)` in `cuda.h`).
const CU_STREAM_LEGACY: usize = 0x1;

impl fmt::Debug for ProducerStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.raw())
    }
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
    /// Where the bytes are produced, when the user said (or the buffer came from a cudarc
    /// slice): a send waits for that stream's work.
    producer: Option<ProducerStream>,
    /// The cudarc stream `cudarc::driver::DeviceSlice::stream` answers (the device's
    /// default stream), made on first use.
    pub(crate) cudarc_stream: OnceLock<Arc<cudarc::driver::CudaStream>>,
    /// How the buffer exports, once asked (`cuda::mempool::memo`).
    pub(crate) export_memo: crate::cuda::mempool::ExportMemo,
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
        Self {
            ptr,
            len,
            device_ordinal,
            owner,
            producer: None,
            cudarc_stream: OnceLock::new(),
            export_memo: Default::default(),
        }
    }

    /// Names the cudarc stream the bytes are produced on: a send of this buffer waits for
    /// the work submitted there before `send` (non-blocking streams included).
    pub fn produced_on(mut self, stream: &Arc<cudarc::driver::CudaStream>) -> Self {
        self.producer = Some(ProducerStream::Cudarc(stream.clone()));
        self
    }

    /// Names a raw `CUstream` the bytes are produced on (see [`DeviceBuffer::produced_on`]).
    ///
    /// # Safety
    /// `stream` must be a stream of the buffer's device's primary context (or null, the
    /// legacy default stream) that stays alive until every send of this buffer completed.
    pub unsafe fn produced_on_raw(mut self, stream: cudarc::driver::sys::CUstream) -> Self {
        // SAFETY: the caller's contract is `from_raw`'s.
        self.producer = Some(unsafe { ProducerStream::from_raw(stream) });
        self
    }

    /// The stream the bytes are produced on, when one was named.
    pub fn producer_stream(&self) -> Option<&ProducerStream> {
        self.producer.as_ref()
    }

    /// The device address (`CUdeviceptr`).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
    /// The device address, borrowed: a kernel argument points at it while it is launched.
    pub(crate) fn device_ptr_ref(&self) -> &u64 {
        &self.ptr
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
            .field("producer", &self.producer)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::ProducerStream;

    #[test]
    fn the_legacy_default_stream_is_known_by_both_of_its_handles() {
        // SAFETY: the handles are only compared, never used to order work.
        let stream = |raw: usize| unsafe { ProducerStream::from_raw(raw as cudarc::driver::sys::CUstream) };
        assert!(stream(0).is_legacy_default(), "the null stream");
        assert!(stream(1).is_legacy_default(), "CU_STREAM_LEGACY");
        assert!(!stream(2).is_legacy_default(), "CU_STREAM_PER_THREAD orders only its own thread's work");
        assert!(!stream(0x7f00_dead_b000).is_legacy_default(), "a created stream");
    }
}
