//! Host memory mapped by this process some other way (a page shared with another
//! process), registered with a device so that its streams and kernels can write it:
//! `ferrylink-transport` registers a control ring's header page so the GPU writes the
//! gate words the peer waits on (docs/decisions/0029-copies-signal-their-own-end.md).

use super::context::Gpu;
use super::error::{check, CudaError, CudaResult};
use super::stream::Stream;
use cudarc::driver::sys;

/// A host range registered with every context (`cuMemHostRegister`, `DEVICEMAP` and
/// `PORTABLE`), unregistered on drop.
pub struct MappedHostRange {
    gpu: Gpu,
    ptr: *mut u8,
    device: u64,
}

// SAFETY: the registration is a handle to memory the owner keeps mapped; registering
// and unregistering may happen on any thread (each call binds the context first).
unsafe impl Send for MappedHostRange {}
// SAFETY: shared access only reads the addresses.
unsafe impl Sync for MappedHostRange {}

impl MappedHostRange {
    /// Registers `ptr..ptr+len` (page aligned) for `gpu`'s device.
    ///
    /// # Safety
    /// The range must be a live host mapping that stays mapped until this value is
    /// dropped, and nothing the device writes there may be read non-atomically.
    pub unsafe fn register(gpu: &Gpu, ptr: *mut u8, len: usize) -> CudaResult<MappedHostRange> {
        if ptr.is_null() || len == 0 || !(ptr as usize).is_multiple_of(4096) {
            return Err(CudaError::invalid("cuMemHostRegister", "a range must be page aligned and not empty"));
        }
        gpu.bind_to_current_thread()?;
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: the caller keeps the range mapped until drop, which unregisters it.
        check("cuMemHostRegister", unsafe { sys::cuMemHostRegister_v2(ptr.cast(), len, flags) })?;
        // Unregistered on drop, also when the address below cannot be had.
        let mut registered = MappedHostRange { gpu: gpu.clone(), ptr, device: 0 };
        // SAFETY: `ptr` was registered with DEVICEMAP just above; one address written.
        check("cuMemHostGetDevicePointer", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut registered.device, ptr.cast(), 0)
        })?;
        Ok(registered)
    }

    /// The device address of the range's first byte.
    pub fn device_ptr(&self) -> u64 {
        self.device
    }
}

impl Drop for MappedHostRange {
    fn drop(&mut self) {
        if self.gpu.bind_to_current_thread().is_err() {
            return;
        }
        // SAFETY: registered by `register` and not unregistered since; the range is
        // still mapped (the caller's promise).
        if let Err(e) = check("cuMemHostUnregister", unsafe { sys::cuMemHostUnregister(self.ptr.cast()) }) {
            tracing::warn!(error = %e, "unregistering a mapped host range");
        }
    }
}

/// Has the GPU write `value` at `address` (device address of mapped host memory, or
/// device memory) on `stream` once the work queued before it is done and its writes are
/// visible (`cuStreamWriteValue32` with its memory barrier).
///
/// # Safety
/// `address` must stay valid (mapped for the device) until the stream's work completed.
pub unsafe fn write_value32(stream: &Stream, address: u64, value: u32) -> CudaResult<()> {
    stream.gpu().bind_to_current_thread()?;
    // SAFETY: the stream is live; the address is the caller's promise.
    check("cuStreamWriteValue32", unsafe { sys::cuStreamWriteValue32_v2(stream.raw(), address, value, 0) })
}
