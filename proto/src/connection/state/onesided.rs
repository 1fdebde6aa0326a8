//! [`OneSided`]: the one-sided state of one connection: imports, transfers this side
//! initiated, grants of its registrations, transfers the peer runs here, notifications.

use crate::connection::transfer::TransferSpans;
use crate::payload::Payload;
use crate::region::{Access, RegistrationInner};
use crate::wire::{NotifyGate, TransferMessage, TransferOp};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

/// Grants one connection may hold of this side's registrations.
pub(in crate::connection) const MAX_GRANTS: usize = 4096;

/// Notifications that may wait for a receive.
pub(in crate::connection) const MAX_QUEUED_NOTIFICATIONS: usize = 1 << 16;

/// A region this side imported.
pub(in crate::connection) struct Imported {
    pub(in crate::connection) len: u64,
    pub(in crate::connection) access: Access,
    pub(in crate::connection) device: bool,
    /// Transfers of this side's whose copies use it.
    pub(in crate::connection) in_flight: usize,
    /// The owner revoked it: answer `RevokeDone` once `in_flight` is 0.
    pub(in crate::connection) revoked: bool,
    /// The user dropped it: send `Unimport` once `in_flight` is 0.
    pub(in crate::connection) dropped: bool,
}

/// A transfer this side initiated.
pub(in crate::connection) struct Pending<P: Payload> {
    pub(in crate::connection) grant: u64,
    pub(in crate::connection) notify: Option<Vec<u8>>,
    /// The notification went ahead of the copies with this gate (`notify` is then
    /// `None`): a failure cancels it (`NotifyCancelled`).
    pub(in crate::connection) gated: Option<NotifyGate>,
    /// Who runs it and how far it got.
    pub(in crate::connection) stage: Stage,
    /// When it was asked of the owner (when it began, for one this side runs).
    pub(in crate::connection) since: Instant,
    /// Held until it ended: the memory the copies read or write.
    pub(in crate::connection) _local: Arc<RegistrationInner<P>>,
}

/// How far a transfer this side initiated got.
pub(in crate::connection) enum Stage {
    /// It waits for the GPU work queued on its local memory's producer stream (the lane
    /// polls it), before the peer or UCX may read or write that memory.
    AwaitingProducer(TransferOp, TransferSpans),
    /// This side runs it (its lane reports `TransferFinished`).
    Here,
    /// The owner runs it; this side's lane prepares its memory first (the op and the
    /// user's spans, for the `Transfer` message once it is ready).
    Describing(TransferOp, TransferSpans),
    /// The owner runs it and was asked (`TransferDone` ends it).
    AtOwner,
    /// The owner ran it; this side's lane finishes its part (`TransferFinished`).
    Finishing,
}

/// A registration of this side granted to the peer.
pub(in crate::connection) struct Granted<P: Payload> {
    pub(in crate::connection) registration: Arc<RegistrationInner<P>>,
    pub(in crate::connection) revoking: bool,
}

/// A transfer the peer asked this side to run.
pub(in crate::connection) struct Running {
    pub(in crate::connection) grant: u64,
    pub(in crate::connection) notify: Option<Vec<u8>>,
}

/// A transfer the peer prepared with this side (`Prepare`), run by each `RunPrepared`.
pub(in crate::connection) struct PeerPrepared {
    /// As the peer described it (`notify` unused).
    pub(in crate::connection) message: Arc<TransferMessage>,
    /// Why this side refuses to run it (checked once, when prepared).
    pub(in crate::connection) refusal: Option<String>,
}

/// The one-sided state of one connection.
pub(in crate::connection) struct OneSided<P: Payload> {
    pub(in crate::connection) importing: BTreeMap<u64, Instant>,
    pub(in crate::connection) imported: HashMap<u64, Imported>,
    pub(in crate::connection) transfers: HashMap<u64, Pending<P>>,
    /// Transfers in `Stage::AwaitingProducer`, in the order they started.
    pub(in crate::connection) awaiting_producer: VecDeque<u64>,
    pub(in crate::connection) grants: HashMap<u64, Granted<P>>,
    pub(in crate::connection) next_grant: u64,
    pub(in crate::connection) running: HashMap<u64, Running>,
    pub(in crate::connection) notifications: VecDeque<Vec<u8>>,
    /// Notifications received and not delivered yet, in order: each waits for its gate
    /// (`gated.rs`), and every one behind it for it.
    pub(in crate::connection) gated: VecDeque<(Vec<u8>, Option<NotifyGate>)>,
    pub(in crate::connection) waiting: VecDeque<u64>,
    /// Prepared transfers of this side's the owner keeps: their grant and span count.
    pub(in crate::connection) at_owner: HashMap<u64, (u64, usize)>,
    /// Spans of `at_owner`.
    pub(in crate::connection) at_owner_spans: usize,
    /// Prepared transfers of the peer's this side keeps.
    pub(in crate::connection) peer_prepared: HashMap<u64, PeerPrepared>,
    /// Spans of `peer_prepared`.
    pub(in crate::connection) peer_prepared_spans: usize,
}

impl<P: Payload> Default for OneSided<P> {
    fn default() -> Self {
        Self {
            importing: Default::default(),
            imported: Default::default(),
            transfers: Default::default(),
            awaiting_producer: Default::default(),
            grants: Default::default(),
            next_grant: Default::default(),
            running: Default::default(),
            notifications: Default::default(),
            gated: Default::default(),
            waiting: Default::default(),
            at_owner: Default::default(),
            at_owner_spans: Default::default(),
            peer_prepared: Default::default(),
            peer_prepared_spans: Default::default(),
        }
    }
}
