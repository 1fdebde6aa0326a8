//! [`OneSided`]: the one-sided state of one connection: imports, transfers this side
//! initiated, grants of its registrations, transfers the peer runs here, notifications.

use crate::proto::transfer::TransferSpans;
use crate::region::{Access, RegistrationInner};
use crate::wire::{NotifyGate, TransferMessage, TransferOp};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

/// Grants one connection may hold of this side's registrations.
pub(in crate::proto) const MAX_GRANTS: usize = 4096;

/// Notifications that may wait for a receive.
pub(in crate::proto) const MAX_QUEUED_NOTIFICATIONS: usize = 1 << 16;

/// A region this side imported.
pub(in crate::proto) struct Imported {
    pub(in crate::proto) len: u64,
    pub(in crate::proto) access: Access,
    pub(in crate::proto) device: bool,
    /// Transfers of this side's whose copies use it.
    pub(in crate::proto) in_flight: usize,
    /// The owner revoked it: answer `RevokeDone` once `in_flight` is 0.
    pub(in crate::proto) revoked: bool,
    /// The user dropped it: send `Unimport` once `in_flight` is 0.
    pub(in crate::proto) dropped: bool,
}

/// A transfer this side initiated.
pub(in crate::proto) struct Pending {
    pub(in crate::proto) grant: u64,
    pub(in crate::proto) notify: Option<Vec<u8>>,
    /// The notification went ahead of the copies with this gate (`notify` is then
    /// `None`): a failure cancels it (`NotifyCancelled`).
    pub(in crate::proto) gated: Option<NotifyGate>,
    /// Who runs it and how far it got.
    pub(in crate::proto) stage: Stage,
    /// When it was asked of the owner (when it began, for one this side runs).
    pub(in crate::proto) since: Instant,
    /// Held until it ended: the memory the copies read or write.
    pub(in crate::proto) _local: Arc<RegistrationInner>,
}

/// How far a transfer this side initiated got.
pub(in crate::proto) enum Stage {
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
pub(in crate::proto) struct Granted {
    pub(in crate::proto) registration: Arc<RegistrationInner>,
    pub(in crate::proto) revoking: bool,
}

/// A transfer the peer asked this side to run.
pub(in crate::proto) struct Running {
    pub(in crate::proto) grant: u64,
    pub(in crate::proto) notify: Option<Vec<u8>>,
}

/// A transfer the peer prepared with this side (`Prepare`), run by each `RunPrepared`.
pub(in crate::proto) struct PeerPrepared {
    /// As the peer described it (`notify` unused).
    pub(in crate::proto) message: Arc<TransferMessage>,
    /// Why this side refuses to run it (checked once, when prepared).
    pub(in crate::proto) refusal: Option<String>,
}

/// The one-sided state of one connection.
#[derive(Default)]
pub(in crate::proto) struct OneSided {
    pub(in crate::proto) importing: BTreeMap<u64, Instant>,
    pub(in crate::proto) imported: HashMap<u64, Imported>,
    pub(in crate::proto) transfers: HashMap<u64, Pending>,
    /// Transfers in `Stage::AwaitingProducer`, in the order they started.
    pub(in crate::proto) awaiting_producer: VecDeque<u64>,
    pub(in crate::proto) grants: HashMap<u64, Granted>,
    pub(in crate::proto) next_grant: u64,
    pub(in crate::proto) running: HashMap<u64, Running>,
    pub(in crate::proto) notifications: VecDeque<Vec<u8>>,
    /// Notifications received and not delivered yet, in order: each waits for its gate
    /// (`gated.rs`), and every one behind it for it.
    pub(in crate::proto) gated: VecDeque<(Vec<u8>, Option<NotifyGate>)>,
    pub(in crate::proto) waiting: VecDeque<u64>,
    /// Prepared transfers of this side's the owner keeps: their grant and span count.
    pub(in crate::proto) at_owner: HashMap<u64, (u64, usize)>,
    /// Spans of `at_owner`.
    pub(in crate::proto) at_owner_spans: usize,
    /// Prepared transfers of the peer's this side keeps.
    pub(in crate::proto) peer_prepared: HashMap<u64, PeerPrepared>,
    /// Spans of `peer_prepared`.
    pub(in crate::proto) peer_prepared_spans: usize,
}
