//! [`MemoryPayload`]: the protocol core built for `ferrylink-memory`'s buffers, and the
//! names this crate gives the core's types so built.
//!
//! `ferrylink-proto` names no buffer type: its connection, lane seam, registrations and
//! errors take the types of a [`Payload`]. This crate's is `ferrylink-memory`'s
//! `Message`, `Frame` and `ProducerStream`; the aliases below let the rest of the crate
//! write `Connection`, `LaneEvent` or `SendError` as if the core named them itself.

use ferrylink_memory::{Frame, Message, ProducerStream};
use ferrylink_proto::connection::lane;
use ferrylink_proto::payload::{MemoryIdentity, Payload};

/// `ferrylink-memory`'s buffer types, as the protocol core sees them. No value of it
/// exists: it names the types.
#[derive(Debug)]
pub enum MemoryPayload {}

impl Payload for MemoryPayload {
    type Message = Message;
    type Frame = Frame;
    type Stream = ProducerStream;

    #[inline]
    fn header(message: &Message) -> &[u8] {
        &message.header
    }
    #[inline]
    fn frames(message: &Message) -> &[Frame] {
        &message.frames
    }
    #[inline]
    fn with_frames(message: Message, frames: Vec<Frame>) -> Message {
        Message { header: message.header, frames }
    }
    #[inline]
    fn frame_len(frame: &Frame) -> usize {
        frame.len()
    }
    #[inline]
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

/// The protocol state of one connection.
pub(crate) type Connection = ferrylink_proto::connection::Connection<MemoryPayload>;
/// What the core hands the driver.
pub(crate) type Output = ferrylink_proto::connection::Output<MemoryPayload>;
/// A one-sided transfer as the user asks for it.
pub(crate) type TransferArgs = ferrylink_proto::connection::TransferArgs<MemoryPayload>;
/// Work a lane finished after the call that started it.
pub(crate) type LaneEvent = lane::LaneEvent<MemoryPayload>;
/// What landing a message started.
pub(crate) type Landing = lane::Landing<MemoryPayload>;
/// What a lane made of a posted receive's buffers offered to the connector.
pub(crate) type ReceiveOffer = lane::ReceiveOffer<MemoryPayload>;
/// A copy into a receive's own buffers that did not fit.
pub(crate) type CopyMismatch = lane::CopyMismatch<MemoryPayload>;
/// A registration granted to the peer, described for it.
pub(crate) type LaneGrant = lane::LaneGrant<MemoryPayload>;
/// A transfer as the user asked for it, as the lane sees it.
pub(crate) type LocalTransfer<'a> = lane::LocalTransfer<'a, MemoryPayload>;
/// A transfer the peer asked this side to run.
pub(crate) type PeerTransfer<'a> = lane::PeerTransfer<'a, MemoryPayload>;
/// One registration's memory and what it grants.
pub(crate) type RegistrationInner = ferrylink_proto::region::RegistrationInner<MemoryPayload>;
/// A context's registrations.
pub(crate) type Registry = ferrylink_proto::region::Registry<MemoryPayload>;
