//! [`Payload`]: the buffer types a connection passes between the user and its lane,
//! named by the driver, so that the core depends on no crate that holds memory.
//!
//! The core never touches a message's bytes. It keeps messages and frames while they are
//! queued, in flight or landed, and reads a few facts of them: a header's bytes, how
//! many frames and how long each is, whether a frame is device memory, and what memory
//! a registered frame is (so registering it again shares the entry). The driver names
//! the concrete types (`ferrylink-transport` names `ferrylink-memory`'s `Message`,
//! `Frame` and `ProducerStream`), and every `Connection` is built for them: the
//! functions below are static and inlined, so reading a fact costs what a method of the
//! concrete type costs, with no allocation and no dynamic dispatch.

use std::fmt;

/// What a registered frame is, for the registry's cache: the same memory registered
/// again with the same access shares one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryIdentity {
    /// A range of a shared host region.
    Host {
        /// The region's id in this process.
        region: u64,
        /// Where the range starts in the region.
        offset: usize,
        /// Bytes in the range.
        len: usize,
    },
    /// A range of device memory.
    Device {
        /// The device.
        ordinal: usize,
        /// Where the range starts.
        ptr: u64,
        /// Bytes in the range.
        len: usize,
    },
}

/// The buffer types of one build of the core, and the facts of them the core reads.
///
/// A type that implements it is a name for the set (the transport's is an empty enum);
/// no value of it exists.
pub trait Payload: 'static {
    /// A message: a user header and its frames.
    type Message: fmt::Debug + Send + 'static;
    /// One frame of a message: host or device memory.
    type Frame: fmt::Debug + Send + 'static;
    /// A GPU stream a receive names, which the message's copies are to be ordered
    /// before; the core hands it to the lane untouched.
    type Stream: fmt::Debug + Send + 'static;

    /// The message's header.
    fn header(message: &Self::Message) -> &[u8];
    /// The message's frames, in order.
    fn frames(message: &Self::Message) -> &[Self::Frame];
    /// `message`'s header with `frames` in place of its own (which are dropped).
    fn with_frames(message: Self::Message, frames: Vec<Self::Frame>) -> Self::Message;
    /// Bytes in the frame.
    fn frame_len(frame: &Self::Frame) -> usize;
    /// Whether the frame is device memory.
    fn is_device(frame: &Self::Frame) -> bool;
    /// What memory the frame is, when registering it twice can be recognised.
    fn identity(frame: &Self::Frame) -> Option<MemoryIdentity>;

    /// Bytes in the message's frames (not its header).
    fn payload_len(message: &Self::Message) -> usize {
        Self::frames(message).iter().map(Self::frame_len).sum()
    }
    /// Whether any frame of the message is device memory.
    fn has_device_frames(message: &Self::Message) -> bool {
        Self::frames(message).iter().any(Self::is_device)
    }
}
