//! The receiver's copy out of a peer's mapping into its own buffer.

use super::cache::MappingLease;
use super::error::CudaIpcError;
use ferrylink_memory::cuda::{self, copy, CudaError, Gpu, PinnedStaging, Stream};
use ferrylink_memory::DeviceBuffer;
use std::sync::{Mutex, OnceLock};

/// Size of the pinned bounce buffer of staged copies.
pub const STAGING_CHUNK: usize = 8 << 20;

/// How a copy went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyPath {
    /// `cuMemcpyDtoDAsync` within one device.
    SameDevice,
    /// `cuMemcpyPeerAsync` with peer access enabled.
    Peer,
    /// Through pinned host memory (no peer access between the devices); synchronous.
    Staged,
}

/// Copies `len` bytes at `offset` of the leased mapping into the start of `dst`, on
/// `stream` (which must belong to `dst`'s device). Enqueue the producer's event wait on
/// `stream` first ([`super::ImportedEventCache::wait`]).
///
/// Same device: the copy kernel or `cuMemcpyDtoDAsync` ([`cuda::copy_kernel::copy_dtod_async`]
/// picks). Different devices with peer access possible:
/// `cuMemcpyPeerAsync` (peer access enabled once). Otherwise staged through a pinned
/// host buffer in chunks, synchronously (the stream is synchronised first, so the
/// producer's event has been waited).
///
/// # Safety
/// The copy is asynchronous: `lease` (or a clone) and `dst` must stay alive, and nothing
/// else may use `dst`, until `stream`'s work enqueued here completed (record an event after
/// it and wait or poll it).
pub unsafe fn copy_from_mapping(
    lease: &MappingLease,
    offset: u64,
    len: u64,
    dst: &DeviceBuffer,
    stream: &Stream,
) -> Result<CopyPath, CudaIpcError> {
    let src = lease.range_ptr(offset, len)?;
    let len = usize::try_from(len).map_err(|_| CudaIpcError::InvalidCopy("length overflows usize".into()))?;
    if len > dst.len() {
        return Err(CudaIpcError::InvalidCopy(format!("{len} bytes into a buffer of {}", dst.len())));
    }
    if stream.gpu().ordinal() != dst.device_ordinal() {
        return Err(CudaIpcError::InvalidCopy("the stream is not on the destination's device".into()));
    }
    let dst_gpu = stream.gpu();
    let src_gpu = Gpu::get(lease.device_ordinal())?;
    if &src_gpu == dst_gpu {
        // SAFETY: `src` lies in the leased mapping, `dst` is the caller's buffer; both stay
        // valid until the stream's work completed (caller's contract).
        unsafe { cuda::copy_kernel::copy_dtod_async(dst.device_ptr(), src, len, stream)? };
        return Ok(CopyPath::SameDevice);
    }
    if cuda::can_access_peer(dst_gpu, &src_gpu)? {
        cuda::enable_peer_access(dst_gpu, &src_gpu)?;
        // SAFETY: as above; `src` belongs to `src_gpu`'s context (it was opened there).
        unsafe { copy::memcpy_peer_async(dst.device_ptr(), dst_gpu, src, &src_gpu, len, stream)? };
        return Ok(CopyPath::Peer);
    }
    staged_copy(src, &src_gpu, dst, len, stream)?;
    Ok(CopyPath::Staged)
}

fn staged_copy(src: u64, src_gpu: &Gpu, dst: &DeviceBuffer, len: usize, stream: &Stream) -> Result<(), CudaError> {
    static STAGING: OnceLock<Mutex<Option<PinnedStaging>>> = OnceLock::new();
    tracing::debug!(
        bytes = len,
        from = src_gpu.ordinal(),
        to = stream.gpu().ordinal(),
        "staged copy through pinned host memory"
    );
    // The stream carries the wait on the producer's event: once it drained, the source is ready.
    stream.synchronize()?;
    let mut guard = STAGING.get_or_init(|| Mutex::new(None)).lock().unwrap_or_else(|p| p.into_inner());
    if guard.is_none() {
        *guard = Some(PinnedStaging::new(src_gpu, STAGING_CHUNK)?);
    }
    let Some(staging) = guard.as_mut() else {
        return Err(CudaError::InvalidArgument { call: "staged_copy", reason: "no staging buffer".into() });
    };
    let mut done = 0usize;
    while done < len {
        let n = (len - done).min(staging.len());
        let chunk = &mut staging.as_mut_slice()[..n];
        // SAFETY: `src + done .. + n` lies in the leased mapping (checked by the caller).
        unsafe { copy::memcpy_dtoh_sync(src_gpu, chunk, src + done as u64)? };
        // SAFETY: `dst + done .. + n` lies in `dst` (len <= dst.len()); the staging chunk
        // stays untouched until the synchronisation below.
        unsafe { copy::memcpy_htod_async(dst.device_ptr() + done as u64, chunk.as_ptr(), n, stream)? };
        stream.synchronize()?;
        done += n;
    }
    Ok(())
}
