//! One-sided transfers on one connection: imports, notifications and the end of grants,
//! as the core sees them (the bytes are the lane's). The initiator's side of a transfer
//! is `initiate.rs`, the side that runs a peer's is `peer_runs.rs`.
//!
//! - Import: the importer sends `ImportKey`; the owner checks the key through its lane
//!   (its own context's, live, the secret matching), grants the region described for
//!   this peer (`ImportAnswer`, after the `Regions` it needs) and remembers the grant;
//!   the importer opens it and completes the request.
//! - Transfer: checked on the initiator ([`crate::onesided::check_spans`]; a prepared
//!   transfer's spans once, when prepared), then run by whichever side the lane says runs
//!   copies: this side (its lane reports `TransferFinished`; a `put`'s notification
//!   follows as `Notify`), or the owner (`Transfer`, checked again there, run, answered
//!   with `TransferDone`; the owner delivers the notification itself; a prepared
//!   transfer is sent once as `Prepare` and then named by `RunPrepared`). For the owner,
//!   the lane may first prepare this side's memory (`TransferDescribed`, a staging copy)
//!   and finish after the answer (`TransferFinished`, a staging copy into the user's
//!   memory).
//! - Revocation: the owner sends `Revoke` for each grant of a revoked registration and
//!   keeps the memory until `RevokeDone` (the importer sends it once none of its copies
//!   use the grant) or the connection's end. An importer that drops its region sends
//!   `Unimport`. A grant's end ends the prepared transfers on it, on both sides.
//! - Every pending request ends with the connection; an import or a transfer the owner
//!   leaves unanswered past the request timeout fails it.

use super::lane::{CoreLane, LaneEvent, LaneGrant};
use super::state::onesided::{Granted, Imported, Stage, MAX_GRANTS, MAX_QUEUED_NOTIFICATIONS};
use super::{Connection, Output, Phase};
use crate::error::TransportError;
use crate::payload::Payload;
use crate::region::{Access, ImportedRegion, RemoteKey};
use crate::wire::{GrantedRegion, ImportAnswer, WireAccess, WireMessage};
use std::time::Instant;

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

impl<P: Payload> Connection<P> {
    pub(super) fn transfer_done(&mut self, id: u64, result: Result<(), TransportError>) {
        self.out.push_back(Output::TransferDone { id, result });
    }

    /// The user imports `key` on this connection as request `id` at `now` (its answer is
    /// overdue `request_timeout` later).
    pub fn import(&mut self, id: u64, key: RemoteKey, now: Instant) {
        if self.phase != Phase::Established {
            return self.out.push_back(Output::ImportDone { id, result: Err(self.dead_error()) });
        }
        self.transmit(WireMessage::ImportKey { request: id, key: key.to_bytes().to_vec() });
        self.out.push_back(Output::Flush);
        self.onesided.importing.insert(id, now);
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
    pub fn unimport(&mut self, grant: u64, lane: &mut dyn CoreLane<P>) {
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
    pub(super) fn close_imported_if_idle(&mut self, grant: u64, lane: &mut dyn CoreLane<P>) {
        let Some(region) = self.onesided.imported.get(&grant) else { return };
        if region.in_flight > 0 || !(region.revoked || region.dropped) {
            return;
        }
        let revoked = region.revoked;
        self.onesided.imported.remove(&grant);
        // The owner forgets the prepared transfers on the grant when it ends there.
        let onesided = &mut self.onesided;
        onesided.at_owner.retain(|_, (on, spans)| {
            let keep = *on != grant;
            if !keep {
                onesided.at_owner_spans -= *spans;
            }
            keep
        });
        lane.close_grant(grant);
        if self.phase == Phase::Established {
            self.transmit(if revoked { WireMessage::RevokeDone { grant } } else { WireMessage::Unimport { grant } });
            self.out.push_back(Output::Flush);
        }
    }

    /// One-sided messages from the peer.
    pub(super) fn handle_onesided(&mut self, message: WireMessage, lane: &mut dyn CoreLane<P>) {
        match message {
            WireMessage::ImportKey { request, key } => self.on_import_key(request, &key, lane),
            WireMessage::ImportAnswer { request, answer } => self.on_import_answer(request, answer, lane),
            WireMessage::Transfer(t) => self.on_transfer(*t, lane),
            WireMessage::Prepare(t) => self.on_prepare(*t, lane),
            WireMessage::RunPrepared { id, prepared, notify } => self.on_run_prepared(id, prepared, notify, lane),
            WireMessage::Unprepare { prepared } => self.on_unprepare(prepared, lane),
            WireMessage::TransferDone { id, outcome } => self.on_transfer_done(id, outcome, lane),
            WireMessage::Notify { grant, data, gate } => {
                if !self.onesided.grants.contains_key(&grant) {
                    return self.protocol_error_with(&format!("a notification for unknown grant {grant}"), lane);
                }
                self.receive_notification(data, gate, lane);
            }
            WireMessage::NotifyCancelled { grant, gate } => {
                if !self.onesided.grants.contains_key(&grant) {
                    return self.protocol_error_with(&format!("a cancellation for unknown grant {grant}"), lane);
                }
                self.cancel_gated(gate, lane);
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
                self.forget_peer_prepared(|on| on == grant, lane);
                lane.release_grant(granted.registration.id);
            }
            other => self.protocol_error_with(&format!("unexpected message {}", super::kind(&other)), lane),
        }
    }

    fn on_import_key(&mut self, request: u64, key: &[u8], lane: &mut dyn CoreLane<P>) {
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

    fn grant_for(&mut self, key: &[u8], lane: &mut dyn CoreLane<P>) -> Result<LaneGrant<P>, String> {
        let key = RemoteKey::from_bytes(key).map_err(|e| e.to_string())?;
        if self.onesided.grants.len() >= MAX_GRANTS {
            return Err(format!("this connection holds {MAX_GRANTS} grants already"));
        }
        lane.grant_import(&key)
    }

    fn on_import_answer(&mut self, request: u64, answer: ImportAnswer, lane: &mut dyn CoreLane<P>) {
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

    pub(super) fn deliver_notification(&mut self, data: Vec<u8>, lane: &mut dyn CoreLane<P>) {
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
    pub(super) fn handle_onesided_event(&mut self, event: LaneEvent<P>, now: Instant, lane: &mut dyn CoreLane<P>) {
        match event {
            LaneEvent::TransferFinished { id, result } => self.on_own_transfer_finished(id, result, lane),
            LaneEvent::TransferDescribed { id, result } => self.on_transfer_described(id, result, now, lane),
            LaneEvent::PeerTransferFinished { id, result } => self.on_peer_transfer_finished(id, result, lane),
            _ => {}
        }
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
    pub(super) fn fail_onesided(&mut self, error: &TransportError, lane: &mut dyn CoreLane<P>) {
        self.deliver_opened_at_end(lane);
        let state = std::mem::take(&mut self.onesided);
        for id in state.importing.into_keys() {
            self.out.push_back(Output::ImportDone { id, result: Err(error.clone()) });
        }
        for &id in &state.awaiting_producer {
            lane.discard_transfer_producer(id);
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
        for prepared in state.peer_prepared.into_keys() {
            lane.release_prepared(prepared, false);
        }
        for (_, granted) in state.grants {
            lane.release_grant(granted.registration.id);
        }
        // Notifications already delivered stay for `recv_notification`.
        self.onesided.notifications = state.notifications;
        self.onesided.next_grant = state.next_grant;
    }
}
