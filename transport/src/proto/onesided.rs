//! One-sided transfers on one connection: imports, transfers, notifications and the end
//! of grants, as the core sees them (the bytes are the lane's).
//!
//! - Import: the importer sends `ImportKey`; the owner checks the key through its lane
//!   (its own context's, live, the secret matching), grants the region described for
//!   this peer (`ImportAnswer`, after the `Regions` it needs) and remembers the grant;
//!   the importer opens it and completes the request.
//! - Transfer: checked on the initiator ([`crate::onesided::check_spans`]), then run by
//!   whichever side the lane says runs copies: this side (its lane reports
//!   `TransferFinished`; a `put`'s notification follows as `Notify`), or the owner
//!   (`Transfer`, checked again there, run, answered with `TransferDone`; the owner
//!   delivers the notification itself). For the owner, the lane may first prepare this
//!   side's memory (`TransferDescribed`, a staging copy) and finish after the answer
//!   (`TransferFinished`, a staging copy into the user's memory).
//! - Revocation: the owner sends `Revoke` for each grant of a revoked registration and
//!   keeps the memory until `RevokeDone` (the importer sends it once none of its copies
//!   use the grant) or the connection's end. An importer that drops its region sends
//!   `Unimport`.
//! - Every pending request ends with the connection; an import or a transfer the owner
//!   leaves unanswered past the request timeout fails it.

use super::lane::{DescribedTransfer, LaneEvent, LaneGrant, LaneOps, LocalTransfer, PeerTransfer};
use super::{Connection, Output, Phase};
use crate::error::TransportError;
use crate::onesided::{check_spans, Access, ImportedRegion, RegistrationInner, RemoteKey};
use crate::wire::{
    GrantedRegion, ImportAnswer, TransferMessage, TransferOp, TransferOutcome, WireAccess, WireMessage, WireSpan,
};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

/// Grants one connection may hold of this side's registrations.
const MAX_GRANTS: usize = 4096;
/// Notifications that may wait for a receive.
const MAX_QUEUED_NOTIFICATIONS: usize = 1 << 16;

/// A region this side imported.
struct Imported {
    len: u64,
    access: Access,
    device: bool,
    /// Transfers of this side's whose copies use it.
    in_flight: usize,
    /// The owner revoked it: answer `RevokeDone` once `in_flight` is 0.
    revoked: bool,
    /// The user dropped it: send `Unimport` once `in_flight` is 0.
    dropped: bool,
}

/// A transfer this side initiated.
struct Pending {
    grant: u64,
    notify: Option<Vec<u8>>,
    /// Who runs it and how far it got.
    stage: Stage,
    /// When it was asked of the owner (when it began, for one this side runs).
    since: Instant,
    /// Held until it ended: the memory the copies read or write.
    _local: Arc<RegistrationInner>,
}

/// How far a transfer this side initiated got.
enum Stage {
    /// This side runs it (its lane reports `TransferFinished`).
    Here,
    /// The owner runs it; this side's lane prepares its memory first (the op and the
    /// user's spans, for the `Transfer` message once it is ready).
    Describing(TransferOp, Vec<WireSpan>),
    /// The owner runs it and was asked (`TransferDone` ends it).
    AtOwner,
    /// The owner ran it; this side's lane finishes its part (`TransferFinished`).
    Finishing,
}

/// A registration of this side granted to the peer.
struct Granted {
    registration: Arc<RegistrationInner>,
    revoking: bool,
}

/// A transfer the peer asked this side to run.
struct Running {
    grant: u64,
    notify: Option<Vec<u8>>,
}

/// The one-sided state of one connection.
#[derive(Default)]
pub(super) struct OneSided {
    importing: BTreeMap<u64, Instant>,
    imported: HashMap<u64, Imported>,
    transfers: HashMap<u64, Pending>,
    grants: HashMap<u64, Granted>,
    next_grant: u64,
    running: HashMap<u64, Running>,
    notifications: VecDeque<Vec<u8>>,
    waiting: VecDeque<u64>,
}

/// A transfer as the user asked for it.
pub(crate) struct TransferArgs {
    pub op: TransferOp,
    pub local: Arc<RegistrationInner>,
    pub grant: u64,
    pub spans: Vec<WireSpan>,
    pub notify: Option<Vec<u8>>,
}

fn to_wire(access: Access) -> WireAccess {
    match access {
        Access::Read => WireAccess::Read,
        Access::Write => WireAccess::Write,
        Access::ReadWrite => WireAccess::ReadWrite,
    }
}

fn from_wire(access: WireAccess) -> Access {
    match access {
        WireAccess::Read => Access::Read,
        WireAccess::Write => Access::Write,
        WireAccess::ReadWrite => Access::ReadWrite,
    }
}

impl Connection {
    fn transfer_done(&mut self, id: u64, result: Result<(), TransportError>) {
        self.out.push_back(Output::TransferDone { id, result });
    }

    /// The user imports `key` on this connection as request `id`.
    pub fn import(&mut self, id: u64, key: RemoteKey) {
        if self.phase != Phase::Established {
            return self.out.push_back(Output::ImportDone { id, result: Err(self.dead_error()) });
        }
        self.transmit(WireMessage::ImportKey { request: id, key: key.to_bytes().to_vec() });
        self.out.push_back(Output::Flush);
        self.onesided.importing.insert(id, Instant::now());
    }

    /// The user starts transfer `id`.
    pub fn transfer(&mut self, id: u64, args: TransferArgs, now: Instant, lane: &mut dyn LaneOps) {
        if self.phase != Phase::Established {
            return self.transfer_done(id, Err(self.dead_error()));
        }
        // The user holds the region: only its owner's revocation removed it.
        let Some(region) = self.onesided.imported.get(&args.grant) else {
            let error = TransportError::Revoked("the owner revoked the remote region".into());
            return self.transfer_done(id, Err(error));
        };
        if region.revoked || region.dropped {
            let error = TransportError::Revoked("the owner revoked the remote region".into());
            return self.transfer_done(id, Err(error));
        }
        if region.device != args.local.is_device() {
            let error = TransportError::Unsupported("a transfer between host and device memory".into());
            return self.transfer_done(id, Err(error));
        }
        if let Err(reason) = check_spans(args.op, &args.spans, args.local.len(), region.len, region.access) {
            return self.transfer_done(id, Err(TransportError::InvalidMessage(reason)));
        }
        tracing::trace!(spans = args.spans.len(), "transfer checked");
        let local = LocalTransfer { op: args.op, local: &args.local, grant: args.grant, spans: &args.spans };
        let stage = if lane.runs_own_transfer(&local) {
            if let Err(reason) = lane.start_transfer(id, &local) {
                return self.transfer_done(id, Err(TransportError::Unsupported(reason)));
            }
            if let Some(region) = self.onesided.imported.get_mut(&args.grant) {
                region.in_flight += 1;
            }
            Stage::Here
        } else {
            match lane.describe_transfer(id, &local) {
                Err(reason) => return self.transfer_done(id, Err(TransportError::Unsupported(reason))),
                Ok(Some(described)) => {
                    self.ask_owner(id, (args.op, args.grant, args.spans), described, args.notify.clone());
                    Stage::AtOwner
                }
                Ok(None) => Stage::Describing(args.op, args.spans),
            }
        };
        let pending = Pending { grant: args.grant, notify: args.notify, stage, since: now, _local: args.local };
        self.onesided.transfers.insert(id, pending);
    }

    /// Asks the owner to run transfer `id` between its region and this side's memory
    /// as `described`.
    fn ask_owner(
        &mut self,
        id: u64,
        (op, grant, spans): (TransferOp, u64, Vec<WireSpan>),
        described: DescribedTransfer,
        notify: Option<Vec<u8>>,
    ) {
        self.transmit_regions(described.regions);
        let message = TransferMessage {
            id,
            op,
            grant,
            local: described.memory,
            local_len: described.len,
            spans: described.spans.unwrap_or(spans),
            notify,
        };
        self.transmit(WireMessage::Transfer(Box::new(message)));
        self.out.push_back(Output::Flush);
    }

    /// The user waits for a notification as request `id`.
    pub fn recv_notification(&mut self, id: u64) {
        if let Some(data) = self.onesided.notifications.pop_front() {
            return self.out.push_back(Output::NotificationDone { id, result: Ok(data) });
        }
        if self.phase == Phase::Dead {
            return self.out.push_back(Output::NotificationDone { id, result: Err(self.dead_error()) });
        }
        self.onesided.waiting.push_back(id);
    }

    /// A notification that completed into a dropped handle goes back to the front.
    pub fn return_notification(&mut self, data: Vec<u8>) {
        match self.onesided.waiting.pop_front() {
            Some(id) => self.out.push_back(Output::NotificationDone { id, result: Ok(data) }),
            None => self.onesided.notifications.push_front(data),
        }
    }

    /// Ends notification receive `id` with `error` (its deadline), when it waits; or
    /// withdraws it (`error` None). Whether it waited.
    pub(super) fn end_notification_wait(&mut self, id: u64, error: Option<&TransportError>) -> bool {
        let Some(at) = self.onesided.waiting.iter().position(|&w| w == id) else { return false };
        self.onesided.waiting.remove(at);
        if let Some(error) = error {
            self.out.push_back(Output::NotificationDone { id, result: Err(error.clone()) });
        }
        true
    }

    /// The user dropped its region of grant `grant`.
    pub fn unimport(&mut self, grant: u64, lane: &mut dyn LaneOps) {
        let Some(region) = self.onesided.imported.get_mut(&grant) else { return };
        region.dropped = true;
        self.close_imported_if_idle(grant, lane);
    }

    /// This context revoked registration `registration`: the peer is told of each grant.
    pub fn revoke_registration(&mut self, registration: u64) {
        let mut grants: Vec<u64> = Vec::new();
        for (&grant, g) in self.onesided.grants.iter_mut() {
            if g.registration.id == registration && !g.revoking {
                g.revoking = true;
                grants.push(grant);
            }
        }
        grants.sort_unstable();
        for grant in grants {
            self.transmit(WireMessage::Revoke { grant });
        }
        self.out.push_back(Output::Flush);
    }

    /// An imported grant no copy uses any more goes, when it was revoked or dropped.
    fn close_imported_if_idle(&mut self, grant: u64, lane: &mut dyn LaneOps) {
        let Some(region) = self.onesided.imported.get(&grant) else { return };
        if region.in_flight > 0 || !(region.revoked || region.dropped) {
            return;
        }
        let revoked = region.revoked;
        self.onesided.imported.remove(&grant);
        lane.close_grant(grant);
        if self.phase == Phase::Established {
            self.transmit(if revoked { WireMessage::RevokeDone { grant } } else { WireMessage::Unimport { grant } });
            self.out.push_back(Output::Flush);
        }
    }

    /// One-sided messages from the peer.
    pub(super) fn handle_onesided(&mut self, message: WireMessage, lane: &mut dyn LaneOps) {
        match message {
            WireMessage::ImportKey { request, key } => self.on_import_key(request, &key, lane),
            WireMessage::ImportAnswer { request, answer } => self.on_import_answer(request, answer, lane),
            WireMessage::Transfer(t) => self.on_transfer(*t, lane),
            WireMessage::TransferDone { id, outcome } => self.on_transfer_done(id, outcome, lane),
            WireMessage::Notify { grant, data } => {
                if !self.onesided.grants.contains_key(&grant) {
                    return self.protocol_error_with(&format!("a notification for unknown grant {grant}"), lane);
                }
                self.deliver_notification(data, lane);
            }
            WireMessage::Revoke { grant } => {
                // A region this side dropped already (its `Unimport` crossed this) is gone.
                if let Some(region) = self.onesided.imported.get_mut(&grant) {
                    region.revoked = true;
                    self.close_imported_if_idle(grant, lane);
                }
            }
            WireMessage::RevokeDone { grant } | WireMessage::Unimport { grant } => {
                let Some(granted) = self.onesided.grants.remove(&grant) else {
                    return self.protocol_error_with(&format!("the end of unknown grant {grant}"), lane);
                };
                lane.release_grant(granted.registration.id);
            }
            other => self.protocol_error_with(&format!("unexpected message {}", super::kind(&other)), lane),
        }
    }

    fn on_import_key(&mut self, request: u64, key: &[u8], lane: &mut dyn LaneOps) {
        let answer = match self.grant_for(key, lane) {
            Ok(LaneGrant { registration, memory, regions }) => {
                let grant = self.onesided.next_grant;
                self.onesided.next_grant += 1;
                let region =
                    GrantedRegion { grant, len: registration.len(), access: to_wire(registration.access), memory };
                self.onesided.grants.insert(grant, Granted { registration, revoking: false });
                self.transmit_regions(regions);
                ImportAnswer::Granted(region)
            }
            Err(reason) => ImportAnswer::Refused(reason),
        };
        self.transmit(WireMessage::ImportAnswer { request, answer });
        self.out.push_back(Output::Flush);
    }

    fn grant_for(&mut self, key: &[u8], lane: &mut dyn LaneOps) -> Result<LaneGrant, String> {
        let key = RemoteKey::from_bytes(key).map_err(|e| e.to_string())?;
        if self.onesided.grants.len() >= MAX_GRANTS {
            return Err(format!("this connection holds {MAX_GRANTS} grants already"));
        }
        lane.grant_import(&key)
    }

    fn on_import_answer(&mut self, request: u64, answer: ImportAnswer, lane: &mut dyn LaneOps) {
        if self.onesided.importing.remove(&request).is_none() {
            return self.protocol_error_with(&format!("an answer to unknown import {request}"), lane);
        }
        let peer = self.peer.clone();
        let region = match answer {
            ImportAnswer::Refused(reason) => {
                let error = TransportError::Refused { peer, reason };
                return self.out.push_back(Output::ImportDone { id: request, result: Err(error) });
            }
            ImportAnswer::Granted(region) => region,
        };
        if self.onesided.imported.contains_key(&region.grant) {
            return self.protocol_error_with(&format!("grant {} given twice", region.grant), lane);
        }
        if let Err(reason) = lane.open_grant(&region) {
            // The owner's description does not hold: give the grant back.
            self.transmit(WireMessage::Unimport { grant: region.grant });
            let error = TransportError::Refused { peer, reason: format!("the granted region does not open: {reason}") };
            return self.out.push_back(Output::ImportDone { id: request, result: Err(error) });
        }
        let device = region.memory.is_device();
        let access = from_wire(region.access);
        let imported = Imported { len: region.len, access, device, in_flight: 0, revoked: false, dropped: false };
        self.onesided.imported.insert(region.grant, imported);
        let info = ImportedRegion { grant: region.grant, len: region.len, access, device };
        self.out.push_back(Output::ImportDone { id: request, result: Ok(info) });
    }

    fn on_transfer(&mut self, t: TransferMessage, lane: &mut dyn LaneOps) {
        let Some(granted) = self.onesided.grants.get(&t.grant) else {
            return self.protocol_error_with(&format!("a transfer on unknown grant {}", t.grant), lane);
        };
        if self.onesided.running.contains_key(&t.id) {
            return self.protocol_error_with(&format!("transfer {} asked for twice", t.id), lane);
        }
        let registration = granted.registration.clone();
        let peer_device = t.local.is_device();
        let refusal = if granted.revoking {
            Some("the region was revoked".to_owned())
        } else if peer_device != registration.is_device() {
            Some("a transfer between host and device memory".to_owned())
        } else {
            check_spans(t.op, &t.spans, t.local_len, registration.len(), registration.access).err()
        };
        if let Some(reason) = refusal {
            tracing::warn!("refusing transfer {} of {}: {reason}", t.id, self.peer);
            let outcome = TransferOutcome::Failed(reason);
            self.transmit(WireMessage::TransferDone { id: t.id, outcome });
            return self.out.push_back(Output::Flush);
        }
        tracing::trace!(spans = t.spans.len(), "peer's transfer checked");
        let run = PeerTransfer {
            op: t.op,
            registration: &registration,
            peer_memory: &t.local,
            peer_len: t.local_len,
            spans: &t.spans,
        };
        match lane.run_peer_transfer(t.id, &run) {
            Ok(()) => {
                self.onesided.running.insert(t.id, Running { grant: t.grant, notify: t.notify });
            }
            Err(f) if f.peer_at_fault => self.protocol_error_with(&f.reason, lane),
            Err(f) => {
                self.transmit(WireMessage::TransferDone { id: t.id, outcome: TransferOutcome::Failed(f.reason) });
                self.out.push_back(Output::Flush);
            }
        }
    }

    fn on_transfer_done(&mut self, id: u64, outcome: TransferOutcome, lane: &mut dyn LaneOps) {
        match self.onesided.transfers.get(&id) {
            Some(p) if matches!(p.stage, Stage::AtOwner) => {}
            _ => return self.protocol_error_with(&format!("transfer {id} answered out of turn"), lane),
        }
        let done = outcome == TransferOutcome::Done;
        let result = match (lane.transfer_answered(id, done), outcome) {
            (Ok(false), _) => {
                if let Some(p) = self.onesided.transfers.get_mut(&id) {
                    p.stage = Stage::Finishing;
                }
                return;
            }
            (Ok(true), TransferOutcome::Done) => Ok(()),
            (Ok(true), TransferOutcome::Failed(reason)) => {
                Err(TransportError::Refused { peer: self.peer.clone(), reason })
            }
            (Err(reason), _) => Err(TransportError::Unsupported(reason)),
        };
        self.onesided.transfers.remove(&id);
        self.transfer_done(id, result);
    }

    fn deliver_notification(&mut self, data: Vec<u8>, lane: &mut dyn LaneOps) {
        tracing::trace!("notification delivered");
        if let Some(id) = self.onesided.waiting.pop_front() {
            return self.out.push_back(Output::NotificationDone { id, result: Ok(data) });
        }
        if self.onesided.notifications.len() >= MAX_QUEUED_NOTIFICATIONS {
            let what = format!("more than {MAX_QUEUED_NOTIFICATIONS} notifications nobody receives");
            return self.fail_peer(what, lane);
        }
        self.onesided.notifications.push_back(data);
    }

    /// One-sided lane events.
    pub(super) fn handle_onesided_event(&mut self, event: LaneEvent, now: Instant, lane: &mut dyn LaneOps) {
        match event {
            LaneEvent::TransferFinished { id, result } => self.on_own_transfer_finished(id, result, lane),
            LaneEvent::TransferDescribed { id, result } => self.on_transfer_described(id, result, now, lane),
            LaneEvent::PeerTransferFinished { id, result } => {
                tracing::trace!("peer's transfer finished");
                let Some(r) = self.onesided.running.remove(&id) else { return };
                let revoked = self.onesided.grants.get(&r.grant).is_none_or(|g| g.revoking);
                let outcome = match result {
                    Ok(()) if revoked => TransferOutcome::Failed("the region was revoked during the transfer".into()),
                    Ok(()) => TransferOutcome::Done,
                    Err(reason) => TransferOutcome::Failed(reason),
                };
                if let (TransferOutcome::Done, Some(data)) = (&outcome, r.notify) {
                    self.deliver_notification(data, lane);
                }
                self.transmit(WireMessage::TransferDone { id, outcome });
                self.out.push_back(Output::Flush);
            }
            _ => {}
        }
    }

    /// This side's memory of transfer `id`, which the owner runs, is ready: the owner is
    /// asked.
    fn on_transfer_described(
        &mut self,
        id: u64,
        result: Result<DescribedTransfer, String>,
        now: Instant,
        lane: &mut dyn LaneOps,
    ) {
        let Some(p) = self.onesided.transfers.get_mut(&id) else { return };
        if !matches!(p.stage, Stage::Describing(..)) {
            // Not waiting for a description: the lane reported twice; nothing changes.
            return tracing::warn!("transfer {id} described out of turn");
        }
        let Stage::Describing(op, spans) = std::mem::replace(&mut p.stage, Stage::AtOwner) else { return };
        let described = match result {
            Ok(described) => described,
            Err(reason) => {
                self.onesided.transfers.remove(&id);
                return self.transfer_done(id, Err(TransportError::Unsupported(reason)));
            }
        };
        // The owner may have revoked the region (or the user dropped it) meanwhile: its
        // grant is gone there, and asking would be a protocol error.
        let grant = p.grant;
        if self.onesided.imported.get(&grant).is_none_or(|r| r.revoked || r.dropped) {
            self.onesided.transfers.remove(&id);
            // Ended without the owner: the lane lets go of what it prepared (nothing of
            // it is left to fail).
            let _over = lane.transfer_answered(id, false);
            let error = TransportError::Revoked("the owner revoked the remote region".into());
            return self.transfer_done(id, Err(error));
        }
        let Some(p) = self.onesided.transfers.get_mut(&id) else { return };
        p.since = now;
        let (grant, notify) = (p.grant, p.notify.clone());
        self.ask_owner(id, (op, grant, spans), described, notify);
    }

    fn on_own_transfer_finished(&mut self, id: u64, result: Result<(), String>, lane: &mut dyn LaneOps) {
        tracing::trace!("own transfer finished");
        match self.onesided.transfers.get(&id).map(|p| &p.stage) {
            Some(Stage::Here) => {}
            Some(Stage::Finishing) => {
                // The owner ran it and delivered the notification; this side's part is done.
                self.onesided.transfers.remove(&id);
                return self.transfer_done(id, result.map_err(TransportError::Unsupported));
            }
            _ => return,
        }
        let Some(p) = self.onesided.transfers.remove(&id) else { return };
        let revoked = match self.onesided.imported.get_mut(&p.grant) {
            Some(region) => {
                region.in_flight = region.in_flight.saturating_sub(1);
                region.revoked
            }
            None => true,
        };
        let result = match result {
            Ok(()) if revoked => {
                Err(TransportError::Revoked("the owner revoked the region during the transfer".into()))
            }
            Ok(()) => {
                if let Some(data) = p.notify {
                    self.transmit(WireMessage::Notify { grant: p.grant, data });
                    self.out.push_back(Output::Flush);
                }
                Ok(())
            }
            Err(reason) => Err(TransportError::Unsupported(reason)),
        };
        self.transfer_done(id, result);
        self.close_imported_if_idle(p.grant, lane);
    }

    /// Peers' regions this side holds open.
    pub(super) fn onesided_imported_count(&self) -> usize {
        self.onesided.imported.len()
    }

    /// The oldest import or owner-run transfer unanswered past `timeout`, described.
    pub(super) fn onesided_overdue(&self, now: Instant, timeout: std::time::Duration) -> Option<String> {
        let late = |since: &Instant| now.saturating_duration_since(*since) > timeout;
        if let Some((id, _)) = self.onesided.importing.iter().find(|(_, since)| late(since)) {
            return Some(format!("import {id} not answered within {timeout:?}"));
        }
        self.onesided
            .transfers
            .iter()
            .find(|(_, p)| matches!(p.stage, Stage::AtOwner) && late(&p.since))
            .map(|(id, _)| format!("transfer {id} not answered within {timeout:?}"))
    }

    /// The connection ended: every one-sided request ends with `error`; grants go.
    pub(super) fn fail_onesided(&mut self, error: &TransportError, lane: &mut dyn LaneOps) {
        let state = std::mem::take(&mut self.onesided);
        for id in state.importing.into_keys() {
            self.out.push_back(Output::ImportDone { id, result: Err(error.clone()) });
        }
        let mut ids: Vec<u64> = state.transfers.into_keys().collect();
        ids.sort_unstable();
        for id in ids {
            self.transfer_done(id, Err(error.clone()));
        }
        for id in state.waiting {
            self.out.push_back(Output::NotificationDone { id, result: Err(error.clone()) });
        }
        for (grant, _) in state.imported {
            lane.close_grant(grant);
        }
        for (_, granted) in state.grants {
            lane.release_grant(granted.registration.id);
        }
        // Notifications already delivered stay for `recv_notification`.
        self.onesided.notifications = state.notifications;
        self.onesided.next_grant = state.next_grant;
    }
}
