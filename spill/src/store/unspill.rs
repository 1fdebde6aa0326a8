//! Bringing entries back up: host frames that came from a device go back to it when a
//! device allocator is configured and the device budget can take them.

use std::hash::Hash;

use ferrylink_memory::serialize::{host_to_device, FrameOrigin, HostMessage};
use ferrylink_memory::{Frame, Message};

use super::state::{usage_of_origins, Shared, State};
use crate::SpillError;

impl Shared {
    /// Brings host frames back to the device when they came from one and an allocator is
    /// configured and the device budget can take them (making room). `Unspill::Host(hm)`: they
    /// stay on the host (no allocator, or larger than the budget).
    pub(super) fn to_device<K: Eq + Hash + Clone>(&self, st: &mut State<K>, hm: HostMessage) -> Unspill {
        let Some(alloc) = self.alloc.as_ref().filter(|_| hm.has_device_origin()) else {
            return Unspill::Host(hm);
        };
        let usage = usage_of_origins(&hm.frames, &hm.origins);
        if usage.iter().any(|u| u.1 > self.device_budget) {
            return Unspill::Host(hm);
        }
        for &(d, b) in &usage {
            if let Err(e) = self.make_room_device(st, d, b) {
                return Unspill::Failed(e, hm);
            }
        }
        match host_to_device(hm, |d, l| alloc.alloc(d, l)) {
            Ok(m) => {
                st.stats.unspilled_to_device += 1;
                Unspill::Device(m)
            }
            Err(f) => Unspill::Failed(f.error.into(), f.value),
        }
    }
}

/// Outcome of bringing host frames back to the device.
pub(super) enum Unspill {
    /// On the device now.
    Device(Message),
    /// Staying on the host (nothing to do, no allocator, or over the device budget).
    Host(HostMessage),
    /// Copy or allocation failed; the host message is intact.
    Failed(SpillError, HostMessage),
}

pub(super) fn host_message(msg: Message, origins: Vec<FrameOrigin>) -> HostMessage {
    let frames = msg
        .frames
        .into_iter()
        .filter_map(|f| match f {
            Frame::Host(h) => Some(h),
            Frame::Device(_) => None,
        })
        .collect();
    HostMessage { header: msg.header, frames, origins }
}

pub(super) fn split_host(hm: HostMessage) -> (Message, Vec<FrameOrigin>) {
    let HostMessage { header, frames, origins } = hm;
    (Message::new(header, frames.into_iter().map(Frame::Host).collect()), origins)
}
