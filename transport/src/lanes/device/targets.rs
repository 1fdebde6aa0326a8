//! Receive targets the caller may still be using on a stream. A target that names its
//! producer stream (every cudarc slice does, `DeviceBuffer::produced_on` names one) can
//! have work queued there that the transport's write must come after: a kernel still
//! writing or reading the buffer, or the stream-ordered allocation itself, whose memory
//! may be a block freed on that stream by work that is still running. This process's own
//! copies into the target wait on the GPU (an event recorded on the producer stream,
//! waited on by the copy stream); before another process writes the target (the
//! connector pushing into it, UCX receiving into it) the progress thread waits for that
//! event on the host.

use super::{DeviceFrameError, DeviceLane, PerDevice};
use ferrylink_memory::cuda::Stream;
use ferrylink_memory::DeviceBuffer;

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
}
