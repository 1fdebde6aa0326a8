//! [`Output`]: what the core hands its driver, in order: messages to transmit, what to do
//! with the channel and the lane, and request completions.

use super::roles::PushRole;
use crate::error::{ConnectError, RecvError, SendError, TransportError};
use crate::lane_kind::LaneKind;
use crate::peer::PeerInfo;
use crate::region::ImportedRegion;
use crate::wire::{Hello, WireMessage};
use ferrylink_memory::Message;
use std::os::fd::OwnedFd;

/// What the driver is to do, in order.
#[derive(Debug)]
pub(crate) enum Output {
    /// Write this message (with these descriptors) to the peer.
    Transmit { message: WireMessage, fds: Vec<OwnedFd> },
    /// Write what is queued now, before the core goes on (data ahead of slow work).
    Flush,
    /// From now on control messages go through the control rings; what was queued so
    /// far still goes by socket.
    UseRing,
    /// Open `lane` to the peer; answer with [`super::Connection::lane_opened`].
    OpenLane { lane: LaneKind, push: PushRole, remote: Box<Hello> },
    /// The connection is established: hand the endpoint to the user.
    Established { lane: LaneKind, push: PushRole, peer: Box<PeerInfo> },
    /// The handshake of a connecting side failed: tell the waiting `connect`.
    HandshakeFailed(ConnectError),
    /// The connection is over: close the socket, drop the rings.
    Closed,
    /// The connection is over for this side, which holds buffers the peer may still copy
    /// into: close the socket's writing half, drop the rings, and tell
    /// [`super::Connection::peer_closed`] when the peer hangs up; [`Output::Closed`] follows.
    ClosedAwaitingHangup,
    /// Send request `id` completed.
    SendDone { id: u64, result: Result<Message, SendError> },
    /// Receive request `id` completed.
    RecvDone { id: u64, result: Result<Message, RecvError> },
    /// Import request `id` completed.
    ImportDone { id: u64, result: Result<ImportedRegion, TransportError> },
    /// One-sided transfer `id` completed.
    TransferDone { id: u64, result: Result<(), TransportError> },
    /// Notification receive `id` completed.
    NotificationDone { id: u64, result: Result<Vec<u8>, TransportError> },
}
