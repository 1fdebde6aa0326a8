//! Landing a received message: copies from the peer's memory into the receive's targets,
//! each on the stream that orders it after its target's producer.
//!
//! A target produced on the legacy default stream (cudarc's default stream is that one)
//! is written by a copy on the legacy default stream itself: stream order puts the copy
//! after everything queued there before it, with no event to record or wait on (the
//! connector's pushes do the same for their sources, `push.rs`). Any other target is
//! written on the lane's own stream, after an event recorded on its producer stream when
//! it names one (`targets.rs`). Measured in a 1 MB `cudarc` timeline on the H200: enqueuing
//! the landing into a producer-stream target took 7.8 µs against 5.8 µs for a target
//! naming none. One frame of up to 4 KiB is copied by a kernel that writes its own
//! completion flag.

use super::completion::Completion;
use super::{copy_between, DeviceFrameError, DeviceState, PeerMemory, PerDevice};
use ferrylink_ipc::cuda_ipc::{copy_from_mapping, MappingLease};
use ferrylink_memory::cuda::copy_kernel::SIGNALLED_MAX_BYTES;
use ferrylink_memory::cuda::Stream;
use ferrylink_memory::DeviceBuffer;
use ferrylink_proto::wire::DeviceFrameDescriptor;
use std::sync::Arc;

/// A stream copies of one message were enqueued on: a device's own stream, or its
/// legacy default stream.
pub(crate) struct LandingStream {
    pub dev: Arc<PerDevice>,
    on_legacy: bool,
}

impl LandingStream {
    /// The stream itself.
    pub fn stream(&self) -> &Stream {
        self.dev.stream_for(self.on_legacy)
    }

    fn is(&self, dev: &Arc<PerDevice>, on_legacy: bool) -> bool {
        Arc::ptr_eq(&self.dev, dev) && self.on_legacy == on_legacy
    }
}

/// Waits for the work of each stream (after a failure: errors are logged).
pub(super) fn synchronize_all(streams: &[LandingStream]) {
    for used in streams {
        super::synchronize_after_failure(used.stream());
    }
}

/// Whether a copy into `target` runs on the legacy default stream: its producer is that
/// stream.
fn lands_on_legacy(target: &DeviceBuffer) -> bool {
    target.producer_stream().is_some_and(|p| p.is_legacy_default())
}

impl DeviceState {
    /// Copies each mapped frame into its target and waits for the copies (by polling:
    /// a synchronize would unmap the freed imports of the peer's pool memory,
    /// `Stream::wait_by_polling`). The frames' ready events were polled before
    /// (`events_ready`): nothing waits on the GPU for another process.
    pub fn copy_in(
        &self,
        frames: &[(&DeviceFrameDescriptor, &PeerMemory, &DeviceBuffer)],
    ) -> Result<(), DeviceFrameError> {
        let started = std::time::Instant::now();
        if let [(desc, PeerMemory::Ipc(lease), target)] = frames {
            if let Some(mut done) = self.signalled_copy_in(desc, lease, target)? {
                done.wait()?;
                tracing::trace!(
                    total_us = started.elapsed().as_micros() as u64,
                    "device landing: one signalled copy done"
                );
                return Ok(());
            }
        }
        let used = self.enqueue_copies_in(frames)?;
        let enqueued = started.elapsed();
        let marked: Result<Vec<Completion>, _> = used.iter().map(|l| Completion::record(&l.dev, l.on_legacy)).collect();
        let mut dones = match marked {
            Ok(dones) => dones,
            Err(e) => {
                synchronize_all(&used);
                return Err(e.into());
            }
        };
        for done in &mut dones {
            done.wait()?;
        }
        tracing::trace!(
            enqueue_us = enqueued.as_micros() as u64,
            total_us = started.elapsed().as_micros() as u64,
            "device landing: copies enqueued and synchronised"
        );
        Ok(())
    }

    /// One small frame from a mapping on the target's device, into a target not produced
    /// on the legacy default stream: a copy that signals its own end, saving the flag's
    /// enqueue after the copy. `None`: nothing was enqueued, copy as usual.
    fn signalled_copy_in(
        &self,
        desc: &DeviceFrameDescriptor,
        lease: &MappingLease,
        target: &DeviceBuffer,
    ) -> Result<Option<Completion>, DeviceFrameError> {
        let small = desc.len <= SIGNALLED_MAX_BYTES as u64 && desc.len <= target.len() as u64;
        if !small || lease.device_ordinal() != target.device_ordinal() || lands_on_legacy(target) {
            return Ok(None);
        }
        let src = lease.range_ptr(desc.offset, desc.len).map_err(|e| DeviceFrameError::Local(e.to_string()))?;
        let dev = self.device(target.device_ordinal())?;
        self.order_after_target_producer(&dev, target, &dev.stream)?;
        // Never the lingering kernel: a landing's copy through it took 7.8 µs from post to
        // done, no faster than a launched one (H200,
        // docs/decisions/0030-lingering-kernel-opt-in.md).
        // SAFETY: `src..src+len` lies in the leased mapping (checked by `range_ptr`) and
        // the target holds `len` bytes (checked above); both live until the caller saw
        // the completion (it waits for it before returning).
        unsafe { Completion::signalled_copy(&dev, (target.device_ptr(), src, desc.len), None, false) }
    }

    /// Enqueues the copies of each mapped frame into its target (see the module's
    /// comment for the stream); the streams used come back. On a failure the copies
    /// enqueued so far are waited for before the error returns (the caller may then drop
    /// what they read or write).
    pub(super) fn enqueue_copies_in(
        &self,
        frames: &[(&DeviceFrameDescriptor, &PeerMemory, &DeviceBuffer)],
    ) -> Result<Vec<LandingStream>, DeviceFrameError> {
        let mut used: Vec<LandingStream> = Vec::new();
        let enqueued = self.enqueue_each(frames, &mut used);
        if enqueued.is_err() {
            synchronize_all(&used);
        }
        enqueued.map(|()| used)
    }

    fn enqueue_each(
        &self,
        frames: &[(&DeviceFrameDescriptor, &PeerMemory, &DeviceBuffer)],
        used: &mut Vec<LandingStream>,
    ) -> Result<(), DeviceFrameError> {
        for (desc, source, target) in frames {
            let dev = self.device(target.device_ordinal())?;
            let on_legacy = lands_on_legacy(target);
            if !used.iter().any(|u| u.is(&dev, on_legacy)) {
                used.push(LandingStream { dev: dev.clone(), on_legacy });
            }
            let stream = dev.stream_for(on_legacy);
            if !on_legacy {
                self.order_after_target_producer(&dev, target, stream)?;
            }
            Self::enqueue_one(&dev, desc, source, target, stream)?;
        }
        tracing::trace!("device landing: copies enqueued");
        Ok(())
    }

    /// One frame's copy (one per piece of the peer's memory) into `target`, on `stream`.
    fn enqueue_one(
        dev: &PerDevice,
        desc: &DeviceFrameDescriptor,
        source: &PeerMemory,
        target: &DeviceBuffer,
        stream: &Stream,
    ) -> Result<(), DeviceFrameError> {
        if let PeerMemory::Ipc(lease) = source {
            // SAFETY: the lease and target outlive the copy: the callers synchronise the
            // stream, or keep both until an event recorded after the copy completed.
            unsafe { copy_from_mapping(lease, desc.offset, desc.len, target, stream) }
                .map_err(|e| DeviceFrameError::Local(e.to_string()))?;
            return Ok(());
        }
        if desc.len > target.len() as u64 {
            return Err(DeviceFrameError::Local("a device frame longer than its target".into()));
        }
        let mut at = target.device_ptr();
        for piece in source.pieces(desc.offset, desc.len)? {
            // SAFETY: the piece lies in the opened peer memory (checked by `pieces`),
            // `at..at+piece.len` in the target (total checked above); both outlive the
            // copy (see the lease above).
            unsafe {
                copy_between(at, dev.gpu.ordinal(), piece.ptr, piece.device_ordinal, piece.len as usize, stream)?
            };
            at += piece.len;
        }
        Ok(())
    }
}
