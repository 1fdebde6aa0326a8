//! Receive targets the caller may still be using on a stream. A target that names its
//! producer stream (every cudarc slice does, `DeviceBuffer::produced_on` names one) can
//! have work queued there that the transport's write must come after: a kernel still
//! writing or reading the buffer, or the stream-ordered allocation itself, whose memory
//! may be a block freed on that stream by work that is still running. This process's own
//! copies into the target wait on the GPU (an event recorded on the producer stream,
//! waited on by the copy stream); before another process writes the target (the
//! connector pushing into it, UCX receiving into it) the progress thread waits for that
//! event on the host.

//!
//! A listener's receive targets are the connector's push targets: their pool-pointer
//! exports are made when the receive is posted, on the caller's thread
//! ([`DeviceLane::export_receive_targets_ahead`]), so a receive posted before its message
//! arrives does not pay `cuMemPoolExportPointer` (13–19 µs at 1 MB, 0.36–0.5 ms at 1 GB on
//! the H200) between the message's arrival and the connector's copy.

use super::{DeviceFrameError, DeviceLane, PerDevice};
use ferrylink_memory::cuda::{self, ExportRoute, Gpu, PooledEvent, Stream};
use ferrylink_memory::{DeviceBuffer, Frame};

impl DeviceLane {
    /// Makes `stream` (a stream of `dev`, the target's device) wait on the GPU for the
    /// work queued so far on `target`'s producer stream; nothing when it names none.
    pub(super) fn order_after_target_producer(
        &self,
        dev: &PerDevice,
        target: &DeviceBuffer,
        stream: &Stream,
    ) -> Result<(), DeviceFrameError> {
        let Some(producer) = target.producer_stream() else { return Ok(()) };
        let mark = dev.marks.acquire()?;
        mark.record_on_producer(producer)?;
        // The wait takes the record made above; the event may be recorded again later.
        stream.wait_event(&mark)?;
        Ok(())
    }

    /// Waits on the host for the work queued so far on each target's producer stream, so
    /// another process may write the targets; targets naming none cost nothing.
    pub fn wait_for_target_producers<'a>(
        &self,
        targets: impl IntoIterator<Item = &'a DeviceBuffer>,
    ) -> Result<(), DeviceFrameError> {
        for target in targets {
            let Some(producer) = target.producer_stream() else { continue };
            let dev = self.device(target.device_ordinal())?;
            let mark = dev.marks.acquire()?;
            mark.record_on_producer(producer)?;
            mark.synchronize()?;
            tracing::trace!(bytes = target.len(), "receive target: its producer stream's work is done");
        }
        Ok(())
    }

    /// Whether the work queued on each target's producer stream before receive `recv`
    /// was first offered is done: marks are recorded on those streams the first time
    /// (kept in `marks` with the receive's id) and polled after, never waited for.
    pub fn target_producers_done(
        &self,
        recv: u64,
        targets: &[&DeviceBuffer],
        marks: &mut Option<(u64, Vec<PooledEvent>)>,
    ) -> Result<bool, DeviceFrameError> {
        if marks.as_ref().is_none_or(|(id, _)| *id != recv) {
            let mut recorded = Vec::new();
            for target in targets {
                let Some(producer) = target.producer_stream() else { continue };
                let mark = self.device(target.device_ordinal())?.marks.acquire()?;
                mark.record_on_producer(producer)?;
                recorded.push(mark);
            }
            *marks = Some((recv, recorded));
        }
        let (_, recorded) = marks.as_mut().expect("set above");
        for mark in recorded.iter() {
            if !mark.query()? {
                return Ok(false);
            }
        }
        *marks = None;
        Ok(true)
    }

    /// Exports, on the calling thread, the device targets of a receive the connector will
    /// push into that lie in an exportable stream-ordered pool: the export data is
    /// remembered per allocation ([`cuda::export_allocation`]), so the progress thread's
    /// export of the targets when the message arrives is a table hit. Other memory needs
    /// nothing ahead (legacy IPC handles are cached per allocation, VMM chunks per peer).
    /// Failures are left for the progress thread, which meets them again and refuses the
    /// message with the reason.
    pub fn export_receive_targets_ahead(&self, targets: &[Frame]) {
        if self.cuda().is_err() {
            return;
        }
        let Ok(_restore) = cuda::CurrentContextGuard::save() else { return };
        for target in targets.iter().filter_map(Frame::as_device) {
            if let Ok(ExportRoute::Pool(_)) = cuda::export_route(target) {
                let exported =
                    Gpu::get(target.device_ordinal()).and_then(|g| cuda::export_allocation(&g, target.device_ptr()));
                if let Err(e) = exported {
                    tracing::debug!(error = %e, "receive target: export ahead failed");
                }
            }
        }
    }
}
