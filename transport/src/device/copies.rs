//! Copies into a receive's buffers that the host does not wait for: the receive named a
//! stream (`Endpoint::recv_on`), the copies are enqueued as a landing's are
//! (`landing.rs`: the lane's per-device streams, or the legacy default stream), an event
//! is recorded after them on each, and the named stream waits for
//! those events (`cuStreamWaitEvent`). The message is delivered at once; the progress
//! thread polls the events (`cuEventQuery`, never blocking) and only once they completed
//! lets go of the peer's memory the copies read and acknowledges the message.

use super::{DeviceFrameError, DeviceState, PeerMemory};
use ferrylink_memory::cuda::{CudaResult, PooledEvent};
use ferrylink_memory::{DeviceBuffer, ProducerStream};
use ferrylink_proto::wire::DeviceFrameDescriptor;

/// Copies running for a message already delivered, and what they read.
pub(crate) struct CopiesInFlight {
    /// One event per device whose stream runs copies, recorded after them.
    events: Vec<PooledEvent>,
    /// The peer's memory the copies read (mapping leases, imported pool pointers): let
    /// go of only once the copies completed, and before the acknowledgement.
    _sources: Vec<PeerMemory>,
}

impl CopiesInFlight {
    /// Copies whose completion `events` mark, reading `sources`.
    pub fn new(events: Vec<PooledEvent>, sources: Vec<PeerMemory>) -> Self {
        Self { events, _sources: sources }
    }

    /// Whether every copy completed (`cuEventQuery`; never blocks).
    pub fn done(&self) -> CudaResult<bool> {
        for event in &self.events {
            if !event.query()? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Blocks until every copy completed.
    pub fn wait(&self) -> CudaResult<()> {
        self.events.iter().try_for_each(|e| e.synchronize())
    }
}

impl DeviceState {
    /// Copies each mapped frame into its target and makes `on` wait for the copies
    /// instead of the host. The events to poll come back; none when nothing is left
    /// running (`on` could not be made to wait: the copies were waited for here).
    pub fn copy_in_on(
        &self,
        frames: &[(&DeviceFrameDescriptor, &PeerMemory, &DeviceBuffer)],
        on: &ProducerStream,
    ) -> Result<Vec<PooledEvent>, DeviceFrameError> {
        let used = self.enqueue_copies_in(frames)?;
        let mut events = Vec::with_capacity(used.len());
        for landing in &used {
            let marked = landing.dev.marks.acquire().and_then(|event| event.record(landing.stream()).map(|()| event));
            match marked {
                Ok(event) => events.push(event),
                Err(e) => {
                    // The copies run on: wait for them before the targets can go.
                    super::landing::synchronize_all(&used);
                    return Err(e.into());
                }
            }
        }
        for event in &events {
            if let Err(e) = event.make_stream_wait(on) {
                tracing::warn!(error = %e, "the receive's stream cannot wait for its copies; waiting here");
                for event in &events {
                    event.synchronize()?;
                }
                return Ok(Vec::new());
            }
        }
        tracing::trace!(devices = events.len(), "device landing: copies enqueued, the receive's stream waits");
        Ok(events)
    }
}
