//! The payload of the core's tests: `ferrylink-memory`'s messages and frames (a
//! dev-dependency), as the transport names them.

use crate::payload::{MemoryIdentity, Payload};
use ferrylink_memory::{Frame, Message, ProducerStream};

/// `ferrylink-memory`'s buffer types.
#[derive(Debug)]
pub enum TestPayload {}

impl Payload for TestPayload {
    type Message = Message;
    type Frame = Frame;
    type Stream = ProducerStream;

    fn header(message: &Message) -> &[u8] {
        &message.header
    }
    fn frames(message: &Message) -> &[Frame] {
        &message.frames
    }
    fn with_frames(message: Message, frames: Vec<Frame>) -> Message {
        Message { header: message.header, frames }
    }
    fn frame_len(frame: &Frame) -> usize {
        frame.len()
    }
    fn is_device(frame: &Frame) -> bool {
        frame.as_device().is_some()
    }
    fn identity(frame: &Frame) -> Option<MemoryIdentity> {
        match frame {
            Frame::Host(h) => {
                h.region().map(|(r, offset)| MemoryIdentity::Host { region: r.region_id(), offset, len: h.len() })
            }
            Frame::Device(d) => {
                Some(MemoryIdentity::Device { ordinal: d.device_ordinal(), ptr: d.device_ptr(), len: d.len() })
            }
        }
    }
}
