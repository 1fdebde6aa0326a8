//! Non-blocking streams (RAII).

use super::context::Gpu;
use super::error::{check, check_query, CudaError, CudaResult};
use cudarc::driver::sys;
use std::fmt;

/// A non-blocking CUDA stream (`CU_STREAM_NON_BLOCKING`) on one device, destroyed on drop;
/// or the device's legacy default stream ([`Stream::legacy_default`]).
pub struct Stream {
    gpu: Gpu,
    raw: sys::CUstream,
    /// Created here (destroyed on drop), not the legacy default stream.
    owned: bool,
}

// SAFETY: a CUstream is a driver handle usable from any thread once its context is bound;
// every method binds the context first.
unsafe impl Send for Stream {}
// SAFETY: as above; the driver serialises concurrent submissions to one stream.
unsafe impl Sync for Stream {}

impl Stream {
    /// Creates a non-blocking stream on `gpu`.
    pub fn new(gpu: &Gpu) -> CudaResult<Stream> {
        gpu.bind_to_current_thread()?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        // SAFETY: the context is bound; cuStreamCreate writes one handle.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        if raw.is_null() {
            // The null handle is the legacy default stream: work meant for a private
            // non-blocking stream would silently serialise with the whole context.
            return Err(CudaError::invalid("cuStreamCreate", "the driver returned a null stream"));
        }
        Ok(Stream { gpu: gpu.clone(), raw, owned: true })
    }

    /// The legacy default stream of `gpu`'s primary context (the null stream): work put
    /// there runs after all work submitted before to it or to any blocking stream of the
    /// context, and before such work submitted later. Nothing is created or destroyed.
    pub fn legacy_default(gpu: &Gpu) -> Stream {
        Stream { gpu: gpu.clone(), raw: std::ptr::null_mut(), owned: false }
    }

    /// The device the stream belongs to.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The raw handle (valid while `self` lives).
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// Blocks until all work on the stream completed.
    pub fn synchronize(&self) -> CudaResult<()> {
        self.gpu.bind_to_current_thread()?;
        // SAFETY: `raw` is a live stream of the bound context.
        check("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(self.raw) })
    }

    /// Waits until all work on the stream completed by polling `cuStreamQuery` (yielding
    /// the core after the first 2 ms) instead of `cuStreamSynchronize`. A synchronize
    /// also lets the driver unmap the process's freed imports of other processes' pool
    /// memory (an imported pool's release threshold is 0 and cannot be raised), so the
    /// next import of that memory maps it again: on the H200, 1.1-1.4 ms at 1 GB instead
    /// of 4-13 µs, and a synchronised 1 MB copy through an imported pointer took 17-20 µs
    /// instead of 10-11 (docs/decisions/0020-user-memory-vmm-pool-pointers-bounces.md).
    pub fn wait_by_polling(&self) -> CudaResult<()> {
        let started = std::time::Instant::now();
        while !self.query()? {
            if started.elapsed() < std::time::Duration::from_millis(2) {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    /// Whether all work on the stream completed (non-blocking).
    pub fn query(&self) -> CudaResult<bool> {
        self.gpu.bind_to_current_thread()?;
        // SAFETY: `raw` is a live stream of the bound context.
        check_query("cuStreamQuery", unsafe { sys::cuStreamQuery(self.raw) })
    }

    /// Whether all work queued so far on a user's producer stream (the legacy default
    /// stream for a null handle, which also answers for blocking streams) completed,
    /// asked of `gpu`'s primary context (`cuStreamQuery`; never blocks). About 1.4 µs of
    /// the calling thread on the H200, against 0.3–0.6 µs for recording an event there,
    /// which another call must then poll.
    pub fn producer_idle(gpu: &Gpu, producer: &crate::ProducerStream) -> CudaResult<bool> {
        gpu.bind_to_current_thread()?;
        // SAFETY: the producer stream belongs to this device's primary context and is
        // alive while the value naming it is (contract of `ProducerStream::from_raw`;
        // cudarc streams are kept alive by the value).
        check_query("cuStreamQuery", unsafe { sys::cuStreamQuery(producer.raw()) })
    }

    // `Stream::wait_event(&Event)` is defined in event.rs, next to `Event`: event.rs uses
    // `Stream`, and this module does not use `Event`.

    /// Makes later work on this stream wait for a raw event's last record.
    ///
    /// # Safety
    /// `event` must be a live event handle (possibly one opened from an IPC handle).
    pub unsafe fn wait_raw_event(&self, event: sys::CUevent) -> CudaResult<()> {
        self.gpu.bind_to_current_thread()?;
        // SAFETY: the caller guarantees the event; the stream is live and its context bound.
        check("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(self.raw, event, 0) })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        if let Err(e) = self.gpu.bind_to_current_thread() {
            tracing::warn!(error = %e, "stream leaked: cannot bind its context");
            return;
        }
        // SAFETY: `raw` is a stream we created and nobody else destroys; pending work
        // completes before the driver releases it.
        if let Err(e) = check("cuStreamDestroy", unsafe { sys::cuStreamDestroy_v2(self.raw) }) {
            tracing::warn!(error = %e, "cuStreamDestroy failed");
        }
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream").field("device", &self.gpu.ordinal()).field("raw", &self.raw).finish()
    }
}
