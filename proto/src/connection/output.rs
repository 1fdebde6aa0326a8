//! [`Output`]: what the core hands its driver, in order: messages to transmit, what to do
//! with the channel and the lane, and request completions.

use super::roles::PushRole;
use crate::error::{ConnectError, RecvError, SendError, TransportError};
use crate::lane_kind::LaneKind;
use crate::payload::Payload;
use crate::peer::PeerInfo;
use crate::region::ImportedRegion;
use crate::wire::{Hello, WireMessage};
use std::os::fd::OwnedFd;

/// What the driver is to do, in order.
#[derive(Debug)]
pub enum Output<P: Payload> {
    /// Write this message (with these descriptors) to the peer.
    Transmit {
        /// The message.
        message: WireMessage,
        /// Descriptors that travel with it.
        fds: Vec<OwnedFd>,
    },
    /// Write what is queued now, before the core goes on (data ahead of slow work).
    Flush,
    /// From now on control messages go through the control rings; what was queued so
    /// far still goes by socket.
    UseRing,
    /// Open `lane` to the peer; answer with [`super::Connection::lane_opened`].
    OpenLane {
        /// The lane both sides agreed on.
        lane: LaneKind,
        /// This side's part in connector copies.
        push: PushRole,
        /// What the peer said of itself.
        remote: Box<Hello>,
    },
    /// The connection is established: hand the endpoint to the user.
    Established {
        /// The lane in use.
        lane: LaneKind,
        /// This side's part in connector copies.
        push: PushRole,
        /// Who the peer is.
        peer: Box<PeerInfo>,
    },
    /// The handshake of a connecting side failed: tell the waiting `connect`.
    HandshakeFailed(ConnectError),
    /// The connection is over: close the socket, drop the rings.
    Closed,
    /// The connection is over for this side, which holds buffers the peer may still copy
    /// into: close the socket's writing half, drop the rings, and tell
    /// [`super::Connection::peer_closed`] when the peer hangs up; [`Output::Closed`] follows.
    ClosedAwaitingHangup,
    /// Send request `id` completed.
    SendDone {
        /// The request.
        id: u64,
        /// The message handed back, or why the send failed.
        result: Result<P::Message, SendError<P::Message>>,
    },
    /// Receive request `id` completed.
    RecvDone {
        /// The request.
        id: u64,
        /// The message received, or why not.
        result: Result<P::Message, RecvError<P::Frame>>,
    },
    /// Import request `id` completed.
    ImportDone {
        /// The request.
        id: u64,
        /// What the owner granted, or why not.
        result: Result<ImportedRegion, TransportError>,
    },
    /// One-sided transfer `id` completed.
    TransferDone {
        /// The request.
        id: u64,
        /// How it ended.
        result: Result<(), TransportError>,
    },
    /// Notification receive `id` completed.
    NotificationDone {
        /// The request.
        id: u64,
        /// The notification's bytes, or why none came.
        result: Result<Vec<u8>, TransportError>,
    },
}
