//! The tracing spans of the progress thread: one per connection (its id and peer, then
//! the peer's pid and uid and the lane once the handshake ends) and one per transfer (a
//! send, a receive or a one-sided transfer: its request id, bytes and direction). The
//! context's span is entered by the thread for its whole life (`context.rs`).
//!
//! The driver enters a connection's span whenever it handles that connection (readiness,
//! its control ring, its turn, a user's command), and a transfer's span when it takes the
//! request and when it completes it, so the events of that work, the core's and the
//! lanes' included, carry their fields. Without a subscriber that wants them the macros
//! below make disabled spans: no field is computed, nothing is allocated, and entering or
//! cloning one does nothing (docs/decisions/0040-tracing-spans.md).

use crate::payload::TransferArgs;
use ferrylink_memory::Message;
use ferrylink_proto::lane_kind::LaneKind;
use ferrylink_proto::peer::PeerInfo;
use ferrylink_proto::wire::TransferOp;
use tracing::field::Empty;
use tracing::Span;

/// The span of connection `id` with `peer` (as the socket names it); the peer's pid, uid
/// and the lane are recorded once the handshake ends ([`record_established`]).
pub(super) fn connection_span(id: usize, peer: &str) -> Span {
    tracing::info_span!("connection", conn = id, peer, peer_pid = Empty, peer_uid = Empty, lane = Empty)
}

/// Records what the handshake said into a connection's span.
pub(super) fn record_established(span: &Span, lane: LaneKind, peer: &PeerInfo) {
    if span.is_disabled() {
        return;
    }
    span.record("peer_pid", peer.pid);
    span.record("peer_uid", peer.uid);
    span.record("lane", tracing::field::display(lane));
}

/// The span of send request `id`.
pub(super) fn send_span(id: u64, message: &Message) -> Span {
    tracing::debug_span!("transfer", id, bytes = message.payload_len(), direction = "send")
}

/// The span of receive request `id`; its bytes are recorded when it completes
/// ([`record_received`]).
pub(super) fn recv_span(id: u64) -> Span {
    tracing::debug_span!("transfer", id, bytes = Empty, direction = "recv")
}

/// Records the bytes a receive got into its span.
pub(super) fn record_received(span: &Span, message: &Message) {
    if !span.is_disabled() {
        span.record("bytes", message.payload_len());
    }
}

/// The span of one-sided transfer request `id` (`put` or `get`).
pub(super) fn onesided_span(id: u64, args: &TransferArgs) -> Span {
    let direction = match args.op {
        TransferOp::Put => "put",
        TransferOp::Get => "get",
    };
    tracing::debug_span!("transfer", id, bytes = args.spans.as_slice().iter().map(|s| s.len).sum::<u64>(), direction)
}
