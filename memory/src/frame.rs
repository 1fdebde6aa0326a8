//! Frames and messages: the unit endpoints send.

use crate::{DeviceBuffer, HostBuffer};

/// Where a frame's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// Host memory.
    Host,
    /// Device memory.
    Device,
}

/// One contiguous buffer of a [`Message`].
#[derive(Debug)]
pub enum Frame {
    /// Bytes in host memory.
    Host(HostBuffer),
    /// Bytes in device memory.
    Device(DeviceBuffer),
}

impl Frame {
    /// Number of bytes.
    pub fn len(&self) -> usize {
        match self {
            Frame::Host(b) => b.len(),
            Frame::Device(b) => b.len(),
        }
    }
    /// Whether the frame holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Host or device.
    pub fn kind(&self) -> FrameKind {
        match self {
            Frame::Host(_) => FrameKind::Host,
            Frame::Device(_) => FrameKind::Device,
        }
    }
    /// The host buffer, if this is a host frame.
    pub fn as_host(&self) -> Option<&HostBuffer> {
        match self {
            Frame::Host(b) => Some(b),
            Frame::Device(_) => None,
        }
    }
    /// The host buffer, writable, if this is a host frame.
    pub fn as_host_mut(&mut self) -> Option<&mut HostBuffer> {
        match self {
            Frame::Host(b) => Some(b),
            Frame::Device(_) => None,
        }
    }
    /// The device buffer, if this is a device frame.
    pub fn as_device(&self) -> Option<&DeviceBuffer> {
        match self {
            Frame::Device(b) => Some(b),
            Frame::Host(_) => None,
        }
    }
}

impl From<HostBuffer> for Frame {
    fn from(b: HostBuffer) -> Self {
        Frame::Host(b)
    }
}
impl From<DeviceBuffer> for Frame {
    fn from(b: DeviceBuffer) -> Self {
        Frame::Device(b)
    }
}
impl From<Vec<u8>> for Frame {
    fn from(v: Vec<u8>) -> Self {
        Frame::Host(HostBuffer::from_vec(v))
    }
}

/// What an endpoint sends and receives: a small user header and any number of frames.
#[derive(Debug, Default)]
pub struct Message {
    /// Opaque user bytes (kept small: bounded by the transport's `Config`).
    pub header: Vec<u8>,
    /// The payload buffers, in order.
    pub frames: Vec<Frame>,
}

impl Message {
    /// A message with a header and frames.
    pub fn new(header: impl Into<Vec<u8>>, frames: Vec<Frame>) -> Self {
        Self { header: header.into(), frames }
    }
    /// Total payload bytes (frames only, not the header).
    pub fn payload_len(&self) -> usize {
        self.frames.iter().map(Frame::len).sum()
    }
    /// Payload bytes in device frames.
    pub fn device_bytes(&self) -> usize {
        self.frames.iter().filter_map(Frame::as_device).map(DeviceBuffer::len).sum()
    }
}
