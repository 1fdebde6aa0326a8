//! Push offers on the native lane, listener side: buffers allocated from the exportable
//! pool for the connector's next message, and a posted receive's own buffers offered for
//! the very next message (`connection/recv/offered.rs` for the protocol).

use super::NativeLane;
use crate::device::{describe, DeviceFrameError};
use crate::payload::ReceiveOffer;
use ferrylink_memory::{DeviceBuffer, Frame};
use ferrylink_proto::wire::DeviceFrameDescriptor;

impl NativeLane {
    /// Listener side: buffers of these lengths, allocated and exported for an offer.
    pub(super) fn offer_buffers(&mut self, offer: u64, lens: &[u64]) -> Option<Vec<DeviceFrameDescriptor>> {
        let ordinal = self.device.default_landing_device();
        let buffers: Result<Vec<DeviceBuffer>, DeviceFrameError> =
            lens.iter().map(|&len| self.device.allocate(ordinal, len as usize)).collect();
        let exported = buffers.and_then(|b| {
            let refs: Vec<&DeviceBuffer> = b.iter().collect();
            let targets = self.device.export_targets(&refs, &mut self.device_announced)?;
            if !targets.regions.is_empty() {
                // Offers travel without fds: the exportable pool is legacy IPC memory.
                return Err(DeviceFrameError::Local("an offer buffer needs a region".into()));
            }
            Ok((b, targets.descriptors))
        });
        match exported {
            Ok((buffers, targets)) => {
                self.offers_made.insert(offer, buffers);
                Some(targets)
            }
            Err(e) => {
                tracing::debug!("no push offer: {}", describe(e));
                None
            }
        }
    }

    /// Listener side: a posted receive's own buffers for receive offer `offer`: every one
    /// device memory that exports without a bounce, and the work queued on their producer
    /// streams done (marks recorded on the first try, polled on the next ones: the
    /// progress thread never waits for it).
    pub(super) fn offer_receive(&mut self, offer: u64, recv: u64, buffers: Vec<Frame>) -> ReceiveOffer {
        let targets: Option<Vec<&DeviceBuffer>> = buffers.iter().map(Frame::as_device).collect();
        let Some(targets) = targets else { return ReceiveOffer::Never(buffers) };
        if targets.iter().any(|t| !self.device.is_exportable(t)) {
            return ReceiveOffer::Never(buffers);
        }
        match self.device.target_producers_done(recv, &targets, &mut self.receive_marks) {
            Ok(true) => {}
            Ok(false) => return ReceiveOffer::NotYet(buffers),
            Err(e) => {
                tracing::debug!("receive not offered: {}", describe(e));
                return ReceiveOffer::Never(buffers);
            }
        }
        let exported = match self.device.export_targets(&targets, &mut self.device_announced) {
            Ok(exported) => exported,
            Err(e) => {
                tracing::debug!("receive not offered: {}", describe(e));
                return ReceiveOffer::Never(buffers);
            }
        };
        let lent: Vec<DeviceBuffer> = buffers
            .into_iter()
            .filter_map(|f| match f {
                Frame::Device(d) => Some(d),
                Frame::Host(_) => None, // none: checked above
            })
            .collect();
        self.offers_made.insert(offer, lent);
        ReceiveOffer::Made { targets: exported.descriptors, regions: exported.regions }
    }

    /// Listener side: the buffers of receive offer `offer` back.
    pub(super) fn take_back_receive_offer(&mut self, offer: u64) -> Option<Vec<Frame>> {
        self.offers_made.remove(&offer).map(|lent| lent.into_iter().map(Frame::Device).collect())
    }
}
