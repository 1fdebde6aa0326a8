//! What the native lane holds of one-sided transfers: the grants it opened
//! ([`OpenedGrant`]) and the device copies running ([`OneSidedCopies`]).

use crate::device::{PeerMemory, SpanCopies};
use crate::payload::RegistrationInner;
use ferrylink_proto::wire::DeviceFrameDescriptor;
use std::sync::Arc;

/// A grant this side imported, opened for its life.
pub(super) enum OpenedGrant {
    Host { region_id: u64, offset: u64 },
    Device(Box<(DeviceFrameDescriptor, PeerMemory)>),
}

/// Device copies of a transfer running, and what they use.
pub(super) struct OneSidedCopies {
    pub(super) id: u64,
    /// This side initiated it (else the peer did).
    pub(super) own: bool,
    pub(super) copies: SpanCopies,
    pub(super) _registration: Arc<RegistrationInner>,
    pub(super) _peer: Option<Arc<PeerMemory>>,
}
