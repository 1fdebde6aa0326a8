//! User types ↔ messages: the [`IntoFrames`] / [`FromFrames`] traits, the header tags
//! of the built-in impls, and those impls (bytes, host and device buffers, frame lists,
//! messages).

use super::error::{Failure, SerializeError};
use crate::{DeviceBuffer, Frame, HostBuffer, Message};

/// A value that can become a [`Message`] (header + frames).
pub trait IntoFrames {
    /// The message.
    fn into_frames(self) -> Message;
}

/// A value that can be rebuilt from a [`Message`]; the message comes back on mismatch.
pub trait FromFrames: Sized {
    /// The value.
    fn from_frames(msg: Message) -> Result<Self, Failure<Message>>;
}

/// Both directions.
pub trait Serializable: IntoFrames + FromFrames {}
impl<T: IntoFrames + FromFrames> Serializable for T {}

/// Header tag of a byte buffer (one host frame).
pub const TAG_BYTES: &[u8] = b"ferrylink:bytes";
/// Header tag of a [`DeviceBuffer`] (one device frame).
pub const TAG_DEVICE: &[u8] = b"ferrylink:device";
/// Header tag of a `Vec<Frame>`.
pub const TAG_FRAMES: &[u8] = b"ferrylink:frames";

fn describe(msg: &Message) -> String {
    let kinds: Vec<_> = msg.frames.iter().map(|f| format!("{:?}", f.kind())).collect();
    format!("header {:?}, frames [{}]", String::from_utf8_lossy(&msg.header), kinds.join(", "))
}

fn one_frame(msg: Message, tag: &[u8], expected: &'static str, device: bool) -> Result<Frame, Failure<Message>> {
    let Message { header, mut frames } = msg;
    if header == tag && frames.len() == 1 {
        if let Some(f) = frames.pop() {
            if f.as_device().is_some() == device {
                return Ok(f);
            }
            frames.push(f);
        }
    }
    let msg = Message { header, frames };
    let found = describe(&msg);
    Err(Failure::new(SerializeError::WrongType { expected, found }, msg))
}

fn wrong_kind(f: Frame, expected: &'static str) -> Failure<Message> {
    let msg = Message::new(Vec::new(), vec![f]);
    let found = describe(&msg);
    Failure::new(SerializeError::WrongType { expected, found }, msg)
}

impl IntoFrames for Vec<u8> {
    fn into_frames(self) -> Message {
        Message::new(TAG_BYTES, vec![Frame::Host(HostBuffer::from_vec(self))])
    }
}
impl IntoFrames for &[u8] {
    fn into_frames(self) -> Message {
        self.to_vec().into_frames()
    }
}
impl IntoFrames for HostBuffer {
    fn into_frames(self) -> Message {
        Message::new(TAG_BYTES, vec![Frame::Host(self)])
    }
}
impl IntoFrames for DeviceBuffer {
    fn into_frames(self) -> Message {
        Message::new(TAG_DEVICE, vec![Frame::Device(self)])
    }
}
impl IntoFrames for Vec<Frame> {
    fn into_frames(self) -> Message {
        Message::new(TAG_FRAMES, self)
    }
}
impl IntoFrames for Message {
    fn into_frames(self) -> Message {
        self
    }
}

impl FromFrames for Vec<u8> {
    /// Copies the bytes out (a pooled buffer's chunks go back to the pool).
    fn from_frames(msg: Message) -> Result<Self, Failure<Message>> {
        match one_frame(msg, TAG_BYTES, "byte buffer", false)? {
            Frame::Host(h) => Ok(h.to_vec()),
            f @ Frame::Device(_) => Err(wrong_kind(f, "host frame")),
        }
    }
}
impl FromFrames for HostBuffer {
    fn from_frames(msg: Message) -> Result<Self, Failure<Message>> {
        match one_frame(msg, TAG_BYTES, "host buffer", false)? {
            Frame::Host(h) => Ok(h),
            f @ Frame::Device(_) => Err(wrong_kind(f, "host frame")),
        }
    }
}
impl FromFrames for DeviceBuffer {
    fn from_frames(msg: Message) -> Result<Self, Failure<Message>> {
        match one_frame(msg, TAG_DEVICE, "device buffer", true)? {
            Frame::Device(d) => Ok(d),
            f @ Frame::Host(_) => Err(wrong_kind(f, "device frame")),
        }
    }
}
impl FromFrames for Vec<Frame> {
    /// Any message's frames (the untyped view: the header is not checked).
    fn from_frames(msg: Message) -> Result<Self, Failure<Message>> {
        Ok(msg.frames)
    }
}
impl FromFrames for Message {
    fn from_frames(msg: Message) -> Result<Self, Failure<Message>> {
        Ok(msg)
    }
}
