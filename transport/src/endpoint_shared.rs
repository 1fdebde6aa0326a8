//! [`EndpointShared`]: what the progress thread and the user's `Endpoint` both hold of
//! one established connection.

use ferrylink_proto::lane_kind::LaneKind;
use ferrylink_proto::peer::PeerInfo;
use ferrylink_proto::stats::Counters;
use std::sync::Arc;

/// What the progress thread and the user's handle share.
pub(crate) struct EndpointShared {
    /// The endpoint's id in its context.
    pub id: usize,
    /// The lane its connection uses.
    pub lane: LaneKind,
    /// Whether control messages go through shared-memory rings (see `driver/channel.rs`).
    pub control_ring: bool,
    /// Whether this side runs the copies of its device sends (connector-copies mode,
    /// connector side; see `device/`).
    pub copies_locally: bool,
    /// Whether the peer pushes its device sends into this side's buffers (connector-copies
    /// mode, listener side): a receive's device targets are exported for it.
    pub receives_pushes: bool,
    /// Who the peer is.
    pub peer: PeerInfo,
    /// The connection's counters, read by `Endpoint::stats`.
    pub counters: Arc<Counters>,
}
