//! A pinned host staging buffer (`cuMemHostAlloc`, flags 0: cached, not write-combined,
//! so the CPU may read it), used where a copy has to go through the host.

use super::context::Gpu;
use super::error::{check, CudaError, CudaResult};
use cudarc::driver::sys;
use std::fmt;

/// Page-locked host memory, freed on drop.
pub struct PinnedStaging {
    gpu: Gpu,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the memory is a plain host allocation owned by this value; access goes through
// `&self`/`&mut self`.
unsafe impl Send for PinnedStaging {}
// SAFETY: shared access only reads (`as_slice`).
unsafe impl Sync for PinnedStaging {}

impl PinnedStaging {
    /// Allocates `len` bytes (at least 1) of pinned host memory in `gpu`'s context
    /// (portable to every device under unified addressing).
    pub fn new(gpu: &Gpu, len: usize) -> CudaResult<PinnedStaging> {
        gpu.bind_to_current_thread()?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: the context is bound; cuMemHostAlloc writes one pointer.
        check("cuMemHostAlloc", unsafe { sys::cuMemHostAlloc(&mut p, len.max(1), 0) })?;
        if p.is_null() {
            // `as_slice` on a null pointer would be undefined behaviour; nothing to free.
            return Err(CudaError::invalid("cuMemHostAlloc", "the driver returned a null pointer"));
        }
        // Freed by its Drop if the check below fails.
        let staging = PinnedStaging { gpu: gpu.clone(), ptr: p.cast(), len };
        if (p as usize).checked_add(len).is_none_or(|end| end > isize::MAX as usize) {
            return Err(CudaError::invalid("cuMemHostAlloc", format!("{len} bytes at {p:?} wrap around")));
        }
        Ok(staging)
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The host pointer.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }
    /// The host pointer, writable.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` bytes we own for our whole life.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedStaging {
    fn drop(&mut self) {
        if let Err(e) = self.gpu.bind_to_current_thread() {
            tracing::warn!(error = %e, "pinned staging leaked: cannot bind its context");
            return;
        }
        // SAFETY: `ptr` came from cuMemHostAlloc and is freed once, here.
        if let Err(e) = check("cuMemFreeHost", unsafe { sys::cuMemFreeHost(self.ptr.cast()) }) {
            tracing::warn!(error = %e, "cuMemFreeHost failed");
        }
    }
}

impl fmt::Debug for PinnedStaging {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedStaging").field("len", &self.len).finish()
    }
}
