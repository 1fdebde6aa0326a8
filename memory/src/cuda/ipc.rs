//! Thin wrappers of the legacy CUDA IPC memory calls. The cache and descriptors that use
//! them live in `ferrylink-ipc`; every driver call stays in this crate.

use super::context::Gpu;
use super::error::{check, CudaError, CudaResult};
use cudarc::driver::sys;

/// `cuIpcGetMemHandle` of an allocation **base** (a `cuMemAlloc` allocation) on `gpu`.
pub fn get_mem_handle(gpu: &Gpu, base: u64) -> CudaResult<[u8; 64]> {
    gpu.bind_to_current_thread()?;
    let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: the context is bound; the driver validates `base` and writes 64 bytes.
    check("cuIpcGetMemHandle", unsafe { sys::cuIpcGetMemHandle(&mut h, base) })?;
    Ok(h.reserved.map(|b| b as u8))
}

/// `cuIpcOpenMemHandle` (`CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`) in `gpu`'s context: maps
/// another process' allocation and returns its address here. The handle is untrusted; the
/// driver validates it. Fails in the exporting process itself.
pub fn open_mem_handle(gpu: &Gpu, handle: &[u8; 64]) -> CudaResult<u64> {
    gpu.bind_to_current_thread()?;
    let h = sys::CUipcMemHandle { reserved: handle.map(|b| b as _) };
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: the context is bound; the call writes one address.
    check("cuIpcOpenMemHandle", unsafe {
        sys::cuIpcOpenMemHandle_v2(
            &mut ptr,
            h,
            sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint,
        )
    })?;
    if ptr == 0 {
        // Nothing was mapped that could be closed.
        return Err(CudaError::invalid("cuIpcOpenMemHandle", "the driver returned a null address"));
    }
    Ok(ptr)
}

/// `cuIpcCloseMemHandle`: unmaps what [`open_mem_handle`] mapped.
///
/// # Safety
/// `ptr` must be an address returned by [`open_mem_handle`] in `gpu`'s context, not yet
/// closed, and no pending or future work may use it.
pub unsafe fn close_mem_handle(gpu: &Gpu, ptr: u64) -> CudaResult<()> {
    gpu.bind_to_current_thread()?;
    // SAFETY: the caller's contract.
    check("cuIpcCloseMemHandle", unsafe { sys::cuIpcCloseMemHandle(ptr) })
}
