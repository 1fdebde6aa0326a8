//! Which side a connection is: of the handshake ([`Role`]) and of the native lane's
//! connector-copies mode ([`PushRole`]).

use crate::lane_kind::LaneKind;
use crate::policy::DeviceCopies;

/// Which side of the handshake this connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// This side connected; `ring_offered`: its `Hello` offered control rings.
    Connector {
        /// Whether its `Hello` offered control rings.
        ring_offered: bool,
    },
    /// A listener accepted the connection.
    Acceptor,
}

/// This side's part in the native lane's connector-copies mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushRole {
    /// Each receiver copies (pull).
    Off,
    /// This side connected: it copies device frames into the listener's buffers when it
    /// sends (and pulls, as always, when it receives).
    Pusher,
    /// This side listened: it provides buffers for the connector's device frames.
    Target,
}

impl PushRole {
    /// The rule: connector copies run on the native lane when the connecting side asks
    /// for them (its `device_copies` holds).
    pub fn of(lane: LaneKind, copies: DeviceCopies, role: Role) -> Self {
        match (lane, copies, role) {
            (LaneKind::Native, DeviceCopies::Connector, Role::Connector { .. }) => PushRole::Pusher,
            (LaneKind::Native, DeviceCopies::Connector, Role::Acceptor) => PushRole::Target,
            _ => PushRole::Off,
        }
    }
}
