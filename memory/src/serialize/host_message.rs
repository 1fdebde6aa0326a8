//! A message whose frames are all on the host ([`HostMessage`]), and where each frame was
//! before ([`FrameOrigin`]).

use super::error::{Failure, SerializeError};
use crate::{Frame, HostBuffer, Message};

/// Where a frame of a [`HostMessage`] lived before serialization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameOrigin {
    /// It was a host frame.
    Host,
    /// It was a device frame on this device.
    Device {
        /// The CUDA device ordinal.
        ordinal: usize,
    },
}

/// A message whose frames are all in host memory, remembering where each came from.
#[derive(Debug, Default)]
pub struct HostMessage {
    /// The user header.
    pub header: Vec<u8>,
    /// The frames, in order.
    pub frames: Vec<HostBuffer>,
    /// Per frame, where it lived before (same length as `frames`).
    pub origins: Vec<FrameOrigin>,
}

impl HostMessage {
    /// Wraps a message that has host frames only; gives it back if it has device frames.
    pub fn from_host_message(msg: Message) -> Result<Self, Failure<Message>> {
        if msg.frames.iter().any(|f| f.as_device().is_some()) {
            return Err(Failure::new(
                SerializeError::Layout("message has device frames; use device_to_host".into()),
                msg,
            ));
        }
        let Message { header, frames } = msg;
        let frames: Vec<HostBuffer> = frames
            .into_iter()
            .filter_map(|f| match f {
                Frame::Host(h) => Some(h),
                Frame::Device(_) => None,
            })
            .collect();
        let origins = vec![FrameOrigin::Host; frames.len()];
        Ok(Self { header, frames, origins })
    }

    /// Total payload bytes.
    pub fn payload_len(&self) -> usize {
        self.frames.iter().map(HostBuffer::len).sum()
    }

    /// Whether any frame came from a device.
    pub fn has_device_origin(&self) -> bool {
        self.origins.iter().any(|o| matches!(o, FrameOrigin::Device { .. }))
    }

    /// A message with these host frames (origins forgotten).
    pub fn into_message(self) -> Message {
        Message::new(self.header, self.frames.into_iter().map(Frame::Host).collect())
    }
}
