//! Raw copies and memsets on streams. These take addresses, so they are `unsafe`: the
//! caller keeps the memory alive until the stream's work completed. The safe, synchronous
//! helpers live on [`crate::DeviceBuffer`].

use super::context::Gpu;
use super::error::{check, CudaResult};
use super::peer::enable_peer_access;
use super::stream::Stream;
use cudarc::driver::sys;

/// Device → device on `stream` (`cuMemcpyDtoDAsync`); both addresses must be accessible
/// from the stream's device (same device, or unified addressing with peer access).
///
/// # Safety
/// `src..src+len` and `dst..dst+len` must be valid device memory until the stream's work
/// completed, and nothing else may write `dst` meanwhile.
pub unsafe fn memcpy_dtod_async(dst: u64, src: u64, len: usize, stream: &Stream) -> CudaResult<()> {
    if len == 0 {
        return Ok(());
    }
    stream.gpu().bind_to_current_thread()?;
    // SAFETY: validity is the caller's contract; the stream's context is bound.
    check("cuMemcpyDtoDAsync", unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len, stream.raw()) })
}

/// Host → device on `stream` (`cuMemcpyHtoDAsync`; truly asynchronous only for pinned host
/// memory).
///
/// # Safety
/// `src..src+len` must stay readable and `dst..dst+len` valid device memory until the
/// stream's work completed.
pub unsafe fn memcpy_htod_async(dst: u64, src: *const u8, len: usize, stream: &Stream) -> CudaResult<()> {
    if len == 0 {
        return Ok(());
    }
    stream.gpu().bind_to_current_thread()?;
    // SAFETY: validity is the caller's contract; the stream's context is bound.
    check("cuMemcpyHtoDAsync", unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, stream.raw()) })
}

/// Device → host on `stream` (`cuMemcpyDtoHAsync`).
///
/// # Safety
/// `dst..dst+len` must stay writable (and unread) and `src..src+len` valid device memory
/// until the stream's work completed.
pub unsafe fn memcpy_dtoh_async(dst: *mut u8, src: u64, len: usize, stream: &Stream) -> CudaResult<()> {
    if len == 0 {
        return Ok(());
    }
    stream.gpu().bind_to_current_thread()?;
    // SAFETY: validity is the caller's contract; the stream's context is bound.
    check("cuMemcpyDtoHAsync", unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, stream.raw()) })
}

/// Device → device between two devices (`cuMemcpyPeerAsync`) on `stream`. Peer access
/// from the stream's device to the other one is enabled once when the hardware allows.
///
/// # Safety
/// `src` must be valid memory of `src_gpu`'s context and `dst` of `dst_gpu`'s, both until
/// the stream's work completed.
pub unsafe fn memcpy_peer_async(
    dst: u64,
    dst_gpu: &Gpu,
    src: u64,
    src_gpu: &Gpu,
    len: usize,
    stream: &Stream,
) -> CudaResult<()> {
    if len == 0 {
        return Ok(());
    }
    if dst_gpu != src_gpu {
        let (a, b) = (stream.gpu(), if stream.gpu() == dst_gpu { src_gpu } else { dst_gpu });
        if super::peer::can_access_peer(a, b)? {
            enable_peer_access(a, b)?;
        }
    }
    stream.gpu().bind_to_current_thread()?;
    // SAFETY: validity is the caller's contract; contexts are retained primary contexts.
    check("cuMemcpyPeerAsync", unsafe {
        sys::cuMemcpyPeerAsync(dst, dst_gpu.raw_context(), src, src_gpu.raw_context(), len, stream.raw())
    })
}

/// Sets `len` bytes at `dst` to `value` on `stream` (`cuMemsetD8Async`).
///
/// # Safety
/// `dst..dst+len` must be valid device memory until the stream's work completed.
pub unsafe fn memset_d8_async(dst: u64, value: u8, len: usize, stream: &Stream) -> CudaResult<()> {
    if len == 0 {
        return Ok(());
    }
    stream.gpu().bind_to_current_thread()?;
    // SAFETY: validity is the caller's contract; the stream's context is bound.
    check("cuMemsetD8Async", unsafe { sys::cuMemsetD8Async(dst, value, len, stream.raw()) })
}

/// Synchronous host → device (`cuMemcpyHtoD`) in `gpu`'s context. The bytes are on the
/// device when this returns: `cuMemcpyHtoD` from pageable memory returns once the bytes
/// are staged, before its DMA finished, so the legacy default stream (which carries it)
/// is synchronised after it. Without that, a copy on a non-blocking stream right after
/// could read stale bytes (seen on the H200 with 1 MiB).
///
/// # Safety
/// `dst..dst+src.len()` must be valid device memory.
pub unsafe fn memcpy_htod_sync(gpu: &Gpu, dst: u64, src: &[u8]) -> CudaResult<()> {
    if src.is_empty() {
        return Ok(());
    }
    gpu.bind_to_current_thread()?;
    // SAFETY: the host slice is valid for the call; device validity is the caller's contract.
    check("cuMemcpyHtoD", unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len()) })?;
    synchronize_legacy_stream()
}

/// Waits for the work on the bound context's legacy default stream.
fn synchronize_legacy_stream() -> CudaResult<()> {
    // SAFETY: the null stream is the legacy default stream of the bound context.
    check("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(std::ptr::null_mut()) })
}

/// Synchronous device → host (`cuMemcpyDtoH`) in `gpu`'s context.
///
/// # Safety
/// `src..src+dst.len()` must be valid device memory.
pub unsafe fn memcpy_dtoh_sync(gpu: &Gpu, dst: &mut [u8], src: u64) -> CudaResult<()> {
    if dst.is_empty() {
        return Ok(());
    }
    gpu.bind_to_current_thread()?;
    // SAFETY: the host slice is valid for the call; device validity is the caller's contract.
    check("cuMemcpyDtoH", unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len()) })
}

/// Synchronous memset (`cuMemsetD8`) in `gpu`'s context: done when this returns
/// (`cuMemsetD8` alone may return before the memset ran).
///
/// # Safety
/// `dst..dst+len` must be valid device memory.
pub unsafe fn memset_d8_sync(gpu: &Gpu, dst: u64, value: u8, len: usize) -> CudaResult<()> {
    if len == 0 {
        return Ok(());
    }
    gpu.bind_to_current_thread()?;
    // SAFETY: validity is the caller's contract; the context is bound.
    check("cuMemsetD8", unsafe { sys::cuMemsetD8_v2(dst, value, len) })?;
    synchronize_legacy_stream()
}
