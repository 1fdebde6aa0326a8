//! Device memory ferrylink did not allocate: a raw pointer with a guard (cudarc slices:
//! `cudarc_interop.rs`). Exportability check (`CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`)
//! and the bounce through the exportable pool for memory that is not (cudarc's
//! stream-ordered pool, `cuMemAllocAsync`).

use super::context::Gpu;
use super::copy_kernel::copy_dtod_async;
use super::error::{CudaError, CudaResult};
use super::pointer::attribute;
use super::pool::DevicePool;
use super::stream::Stream;
use crate::{DeviceBuffer, DeviceMemoryOwner};
use cudarc::driver::sys;
use std::any::Any;
use std::sync::Arc;

pub use super::pointer::{address_range, buffer_info, known_buffer_info, pointer_info, PointerInfo};

/// Whether `cuIpcGetMemHandle` can export the buffer's allocation
/// (`CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`).
pub fn is_ipc_exportable(buf: &DeviceBuffer) -> CudaResult<bool> {
    if let Some(a) = buf.owner().allocation() {
        return Ok(a.legacy_ipc_capable);
    }
    let gpu = Gpu::get(buf.device_ordinal())?;
    gpu.bind_to_current_thread()?;
    let capable =
        attribute(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, buf.device_ptr())?;
    Ok((capable & 0xff) != 0)
}

struct GuardOwner {
    _guard: Box<dyn Any + Send + Sync>,
    len: usize,
}

impl DeviceMemoryOwner for GuardOwner {
    fn describe(&self) -> String {
        format!("foreign device memory ({} B)", self.len)
    }
}

/// Wraps foreign device memory kept alive by `guard` (dropped when the buffer's owner is).
///
/// # Safety
/// `ptr..ptr+len` must be device memory of device `device_ordinal` that stays valid while
/// `guard` lives, with the work that produced it completed (or ordered by the caller).
pub unsafe fn from_raw_device_memory(
    ptr: u64,
    len: usize,
    device_ordinal: usize,
    guard: Box<dyn Any + Send + Sync>,
) -> DeviceBuffer {
    // SAFETY: the caller's contract.
    unsafe { DeviceBuffer::from_raw_parts(ptr, len, device_ordinal, Arc::new(GuardOwner { _guard: guard, len })) }
}

/// Copies `buf` into a fresh buffer of the exportable `pool`: one device-to-device copy
/// on `stream`, ordered after the buffer's producer stream when it names one (an event
/// recorded there, waited on by `stream`; never a device-wide synchronize), then waits
/// for `stream`, so `buf` may be dropped at once. Work on the legacy default stream or a
/// blocking stream must be ordered by the caller (the transport polls an event on the
/// legacy default stream before it gets here).
pub fn bounce_to_exportable(buf: &DeviceBuffer, pool: &DevicePool, stream: &Stream) -> CudaResult<DeviceBuffer> {
    if stream.gpu() != pool.gpu() {
        return Err(CudaError::invalid("bounce_to_exportable", "stream and pool are on different devices"));
    }
    let out = pool.alloc(buf.len())?;
    tracing::debug!(
        bytes = buf.len(),
        from = %buf.owner().describe(),
        device = pool.gpu().ordinal(),
        "device buffer is not exportable: bounced through the exportable pool"
    );
    if let Some(producer) = buf.producer_stream() {
        let src_gpu = Gpu::get(buf.device_ordinal())?;
        let mark = super::Event::new(&src_gpu)?;
        mark.record_on_producer(producer)?;
        stream.wait_event(&mark)?;
    }
    if buf.device_ordinal() == pool.gpu().ordinal() {
        // SAFETY: both ranges are live device memory for the duration (we synchronise
        // before returning, while `buf` and `out` are borrowed/owned here).
        unsafe { copy_dtod_async(out.device_ptr(), buf.device_ptr(), buf.len(), stream)? };
    } else {
        let src_gpu = Gpu::get(buf.device_ordinal())?;
        // SAFETY: as above; each address belongs to its device's context.
        unsafe {
            super::copy::memcpy_peer_async(out.device_ptr(), pool.gpu(), buf.device_ptr(), &src_gpu, buf.len(), stream)?
        };
    }
    stream.synchronize()?;
    Ok(out)
}

/// `buf` itself if it is exportable, otherwise [`bounce_to_exportable`].
pub fn ensure_exportable(buf: DeviceBuffer, pool: &DevicePool, stream: &Stream) -> CudaResult<DeviceBuffer> {
    if is_ipc_exportable(&buf)? {
        Ok(buf)
    } else {
        bounce_to_exportable(&buf, pool, stream)
    }
}
