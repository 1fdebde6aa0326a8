//! Copies between a device buffer of this process and pinned host memory: the two ends
//! of a one-sided transfer staged for a UCX that cannot move device memory itself
//! (`lanes/ucx/staged.rs`). One copy per piece on the device's stream, ordered after the
//! work queued on the buffer's producer stream; an event after them is polled.

use super::completion::Completion;
use super::{DeviceFrameError, DeviceState, SpanCopies};
use ferrylink_memory::cuda;
use ferrylink_memory::DeviceBuffer;

/// One piece of a staged transfer: (offset in the device buffer, offset in the host
/// memory, bytes).
pub(crate) type StagingPiece = (u64, u64, u64);

/// Whether every piece lies in its memory (`memory_len` bytes) and in the host memory
/// (`host_len` bytes); else the first that does not, described.
pub(crate) fn check_staging_pieces(pieces: &[StagingPiece], memory_len: usize, host_len: usize) -> Result<(), String> {
    for &(at, host_at, len) in pieces {
        let inside = |offset: u64, total: usize| offset.checked_add(len).is_some_and(|end| end <= total as u64);
        if !inside(at, memory_len) || !inside(host_at, host_len) {
            return Err(format!("a staging piece ({at}, {host_at}, {len}) out of bounds"));
        }
    }
    Ok(())
}

impl DeviceState {
    /// Enqueues the copies of `pieces` between `buffer` and the `host_len` bytes of host
    /// memory at `host`: into the host memory when `to_host`, else out of it.
    ///
    /// # Safety
    /// `host..host + host_len` must stay valid (and, for copies into it, writable and
    /// not read by anyone else) until the returned copies completed or were waited for;
    /// pinned memory makes the copies asynchronous, other memory makes them wait.
    pub unsafe fn enqueue_staging_copies(
        &self,
        buffer: &DeviceBuffer,
        (host, host_len): (*mut u8, usize),
        pieces: &[StagingPiece],
        to_host: bool,
    ) -> Result<SpanCopies, DeviceFrameError> {
        let dev = self.device(buffer.device_ordinal())?;
        check_staging_pieces(pieces, buffer.len(), host_len).map_err(DeviceFrameError::Local)?;
        self.order_after_target_producer(&dev, buffer, &dev.stream)?;
        let enqueued = pieces.iter().try_for_each(|&(at, host_at, len)| {
            let device_ptr = buffer.device_ptr() + at;
            // SAFETY: both ranges were checked above; the host memory is valid for the
            // caller's promised time, the device buffer is the caller's (held by it).
            let host_ptr = unsafe { host.add(host_at as usize) };
            // SAFETY: as above; destinations of one transfer's pieces do not overlap.
            unsafe {
                if to_host {
                    cuda::copy::memcpy_dtoh_async(host_ptr, device_ptr, len as usize, &dev.stream)
                } else {
                    cuda::copy::memcpy_htod_async(device_ptr, host_ptr, len as usize, &dev.stream)
                }
            }
        });
        if let Err(e) = enqueued {
            // Copies already enqueued use the caller's memory: let them finish first.
            super::synchronize_after_failure(&dev.stream);
            return Err(e.into());
        }
        let done = Completion::after_copies(&dev)?;
        tracing::trace!(pieces = pieces.len(), to_host, "staging copies enqueued");
        Ok(SpanCopies::new(done, None))
    }
}
