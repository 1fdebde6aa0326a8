//! The owner's side of one-sided transfers: a peer's `Transfer` checked and run by this
//! side's lane, prepared transfers kept (`Prepare`, checked once) and run by name
//! (`RunPrepared`) until `Unprepare` or the grant's end, and each answered with
//! `TransferDone` (the notification delivered here first).

use super::lane::{CoreLane, PeerTransfer};
use super::state::onesided::{PeerPrepared, Running};
use super::Connection;
use super::Output;
use crate::payload::Payload;
use crate::region::{check_spans, RegistrationInner};
use crate::wire::{TransferMessage, TransferOutcome, WireMessage, MAX_PREPARED, MAX_PREPARED_SPANS};
use std::sync::Arc;

impl<P: Payload> Connection<P> {
    /// The registration a peer's transfer `t` runs on, or why this side refuses it. The
    /// caller checked the grant exists.
    fn check_peer_transfer(&self, t: &TransferMessage) -> Result<Arc<RegistrationInner<P>>, String> {
        let granted = self.onesided.grants.get(&t.grant).ok_or("the region's grant ended")?;
        let registration = &granted.registration;
        if granted.revoking {
            return Err("the region was revoked".to_owned());
        }
        if t.local.is_device() != registration.is_device() {
            return Err("a transfer between host and device memory".to_owned());
        }
        check_spans(t.op, &t.spans, t.local_len, registration.len(), registration.access)?;
        Ok(registration.clone())
    }

    /// Answers transfer `id` of the peer's as failed, for `reason`.
    fn refuse_peer_transfer(&mut self, id: u64, reason: String) {
        tracing::warn!("refusing transfer {id} of {}: {reason}", self.peer);
        self.transmit(WireMessage::TransferDone { id, outcome: TransferOutcome::Failed(reason) });
        self.out.push_back(Output::Flush);
    }

    pub(super) fn on_transfer(&mut self, t: TransferMessage, lane: &mut dyn CoreLane<P>) {
        if !self.onesided.grants.contains_key(&t.grant) {
            return self.protocol_error_with(&format!("a transfer on unknown grant {}", t.grant), lane);
        }
        if self.onesided.running.contains_key(&t.id) {
            return self.protocol_error_with(&format!("transfer {} asked for twice", t.id), lane);
        }
        match self.check_peer_transfer(&t) {
            Ok(registration) => {
                tracing::trace!(spans = t.spans.len(), "peer's transfer checked");
                self.run_peer_transfer(t.id, (&t, None), &registration, t.notify.clone(), lane);
            }
            Err(reason) => self.refuse_peer_transfer(t.id, reason),
        }
    }

    /// The peer prepared transfer `t.id` (its id for it) with this side: checked once
    /// and kept for its `RunPrepared`s.
    pub(super) fn on_prepare(&mut self, t: TransferMessage, lane: &mut dyn CoreLane<P>) {
        if !self.onesided.grants.contains_key(&t.grant) {
            return self.protocol_error_with(&format!("a prepared transfer on unknown grant {}", t.grant), lane);
        }
        if self.onesided.peer_prepared.contains_key(&t.id) {
            return self.protocol_error_with(&format!("prepared transfer {} given twice", t.id), lane);
        }
        let spans = self.onesided.peer_prepared_spans + t.spans.len();
        if self.onesided.peer_prepared.len() >= MAX_PREPARED || spans > MAX_PREPARED_SPANS {
            let what = format!("more than {MAX_PREPARED} prepared transfers or {MAX_PREPARED_SPANS} spans of them");
            return self.protocol_error_with(&what, lane);
        }
        let refusal = self.check_peer_transfer(&t).err();
        self.onesided.peer_prepared_spans = spans;
        self.onesided.peer_prepared.insert(t.id, PeerPrepared { message: Arc::new(t), refusal });
    }

    /// The peer asks this side to run prepared transfer `prepared` as its transfer `id`.
    pub(super) fn on_run_prepared(
        &mut self,
        id: u64,
        prepared: u64,
        notify: Option<Vec<u8>>,
        lane: &mut dyn CoreLane<P>,
    ) {
        if self.onesided.running.contains_key(&id) {
            return self.protocol_error_with(&format!("transfer {id} asked for twice"), lane);
        }
        let Some(kept) = self.onesided.peer_prepared.get(&prepared) else {
            return self.protocol_error_with(&format!("a run of unknown prepared transfer {prepared}"), lane);
        };
        let (message, refusal) = (kept.message.clone(), kept.refusal.clone());
        // Checked when prepared; the grant may have been revoked since.
        let checked = match refusal {
            Some(reason) => Err(reason),
            None => self.check_grant_of(&message),
        };
        match checked {
            Ok(registration) => {
                tracing::trace!("peer's prepared transfer taken");
                self.run_peer_transfer(id, (&message, Some(prepared)), &registration, notify, lane);
            }
            Err(reason) => self.refuse_peer_transfer(id, reason),
        }
    }

    /// The registration of a prepared transfer's grant, unless it is being revoked.
    fn check_grant_of(&self, t: &TransferMessage) -> Result<Arc<RegistrationInner<P>>, String> {
        match self.onesided.grants.get(&t.grant) {
            Some(g) if !g.revoking => Ok(g.registration.clone()),
            _ => Err("the region was revoked".to_owned()),
        }
    }

    /// The peer dropped prepared transfer `prepared`.
    pub(super) fn on_unprepare(&mut self, prepared: u64, lane: &mut dyn CoreLane<P>) {
        if !self.onesided.peer_prepared.contains_key(&prepared) {
            return self.protocol_error_with(&format!("the end of unknown prepared transfer {prepared}"), lane);
        }
        self.forget_peer_prepared_one(prepared, lane);
    }

    fn forget_peer_prepared_one(&mut self, prepared: u64, lane: &mut dyn CoreLane<P>) {
        if let Some(kept) = self.onesided.peer_prepared.remove(&prepared) {
            self.onesided.peer_prepared_spans -= kept.message.spans.len();
            lane.release_prepared(prepared, false);
        }
    }

    /// Forgets the peer's prepared transfers whose grant `ended` says ended.
    pub(super) fn forget_peer_prepared(&mut self, ended: impl Fn(u64) -> bool, lane: &mut dyn CoreLane<P>) {
        let gone: Vec<u64> =
            self.onesided.peer_prepared.iter().filter(|(_, p)| ended(p.message.grant)).map(|(&id, _)| id).collect();
        for prepared in gone {
            self.forget_peer_prepared_one(prepared, lane);
        }
    }

    /// Has the lane run the peer's transfer `id` (`t`, checked; `prepared`: the prepared
    /// transfer it runs) on `registration`.
    fn run_peer_transfer(
        &mut self,
        id: u64,
        (t, prepared): (&TransferMessage, Option<u64>),
        registration: &Arc<RegistrationInner<P>>,
        notify: Option<Vec<u8>>,
        lane: &mut dyn CoreLane<P>,
    ) {
        let run = PeerTransfer {
            op: t.op,
            registration,
            peer_memory: &t.local,
            peer_len: t.local_len,
            spans: &t.spans,
            prepared,
        };
        match lane.run_peer_transfer(id, &run) {
            Ok(()) => {
                self.onesided.running.insert(id, Running { grant: t.grant, notify });
            }
            Err(f) if f.peer_at_fault => self.protocol_error_with(&f.reason, lane),
            Err(f) => {
                self.transmit(WireMessage::TransferDone { id, outcome: TransferOutcome::Failed(f.reason) });
                self.out.push_back(Output::Flush);
            }
        }
    }

    /// The lane finished the peer's transfer `id`: its notification is delivered (the
    /// data is there) and the peer answered.
    pub(super) fn on_peer_transfer_finished(
        &mut self,
        id: u64,
        result: Result<(), String>,
        lane: &mut dyn CoreLane<P>,
    ) {
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
}
