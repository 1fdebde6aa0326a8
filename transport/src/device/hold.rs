//! [`DeviceHold`]: what a sent message's device frames hold until the peer acknowledges
//! it.

use super::ordering::ProducerMarks;
use ferrylink_memory::DeviceBuffer;

/// What a sent message holds until the peer acknowledges it.
#[derive(Default)]
pub(crate) struct DeviceHold {
    /// Copies of frames nothing could export, in the exportable pool.
    pub(in crate::device) bounces: Vec<DeviceBuffer>,
    /// Bytes bounced for this send.
    pub bounced_bytes: u64,
    /// The producer marks the copies wait on (returned to the pool only after the ack,
    /// when the peer's wait on them was long enqueued).
    pub producer: ProducerMarks,
}

impl DeviceHold {
    /// A hold for a send whose copies wait on `producer`.
    pub fn with_producer(producer: ProducerMarks) -> Self {
        Self { bounces: Vec::new(), bounced_bytes: 0, producer }
    }
}
