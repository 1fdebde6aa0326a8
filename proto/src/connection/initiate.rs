//! The initiator's side of a one-sided transfer: checked, then run here or asked of the
//! owner, and ended by the lane's report or the owner's answer (`onesided.rs` has the
//! state, `peer_runs.rs` the owner's side).
//!
//! A prepared transfer ([`TransferSpans::Prepared`]) was checked when the user prepared
//! it, against the same lengths and access, and is not checked again; a lane that keeps
//! work per prepared transfer gets its id. Where the owner runs it and its lane keeps
//! prepared transfers, it is described once (`Prepare`, the owner checks it then) and
//! each transfer names it (`RunPrepared`); both sides forget it when the user drops it
//! (`Unprepare`) or the grant ends.

use super::lane::{CoreLane, DescribedTransfer, ProducerState};
use super::state::onesided::{Pending, Stage};
use super::transfer::{TransferArgs, TransferSpans};
use super::{Connection, Output, Phase};
use crate::error::TransportError;
use crate::payload::Payload;
use crate::region::check_initiator_transfer;
use crate::wire::{TransferMessage, TransferOp, TransferOutcome, WireMessage, MAX_PREPARED, MAX_PREPARED_SPANS};
use std::time::Instant;

impl<P: Payload> Connection<P> {
    /// The user starts transfer `id`. It waits first, on this side, for the GPU work
    /// queued on its local memory's producer stream where the lane says someone other
    /// than this side's own ordered copies reads or writes that memory (the peer, UCX),
    /// and behind any earlier transfer that waits so: transfers start in their order.
    pub fn transfer(&mut self, id: u64, args: TransferArgs<P>, now: Instant, lane: &mut dyn CoreLane<P>) {
        if self.phase != Phase::Established {
            return self.transfer_done(id, Err(self.dead_error()));
        }
        if let Err(error) = self.check_transfer(&args) {
            return self.transfer_done(id, Err(error));
        }
        tracing::trace!(spans = args.spans.as_slice().len(), "transfer checked");
        if self.onesided.awaiting_producer.is_empty() {
            match producer_state(id, &args, lane) {
                Ok(ProducerState::Ready) => return self.start_transfer(id, args, now, lane),
                Ok(ProducerState::Running) => {}
                Err(reason) => return self.transfer_done(id, Err(TransportError::Unsupported(reason))),
            }
        }
        let TransferArgs { op, local, grant, spans, notify } = args;
        let stage = Stage::AwaitingProducer(op, spans);
        let pending = Pending { grant, notify, gated: None, stage, since: now, _local: local };
        self.onesided.transfers.insert(id, pending);
        self.onesided.awaiting_producer.push_back(id);
    }

    /// Starts the transfers that wait for their local memory's producer, in order, while
    /// the lane says that producer's work is done.
    pub(super) fn pump_transfers(&mut self, now: Instant, lane: &mut dyn CoreLane<P>) {
        while let Some(&id) = self.onesided.awaiting_producer.front() {
            let Some(p) = self.onesided.transfers.get(&id) else {
                self.onesided.awaiting_producer.pop_front();
                continue;
            };
            let Stage::AwaitingProducer(op, spans) = &p.stage else {
                self.onesided.awaiting_producer.pop_front();
                continue;
            };
            let state = lane.transfer_producer(id, &spans.local(*op, &p._local, p.grant));
            if matches!(state, Ok(ProducerState::Running)) {
                return;
            }
            self.onesided.awaiting_producer.pop_front();
            let Some(p) = self.onesided.transfers.remove(&id) else { continue };
            let Stage::AwaitingProducer(op, spans) = p.stage else { continue };
            let args = TransferArgs { op, local: p._local, grant: p.grant, spans, notify: p.notify };
            // The region may have gone while the transfer waited (it held no copy of it).
            let result = state.map_err(TransportError::Unsupported).and_then(|_| self.region_usable(args.grant));
            match result {
                Ok(()) => self.start_transfer(id, args, now, lane),
                Err(error) => {
                    lane.discard_transfer_producer(id);
                    self.transfer_done(id, Err(error));
                }
            }
        }
    }

    /// Runs checked transfer `id` here, or asks the owner, as the lane says.
    fn start_transfer(&mut self, id: u64, args: TransferArgs<P>, now: Instant, lane: &mut dyn CoreLane<P>) {
        let prepared = args.spans.prepared();
        let local = args.spans.local(args.op, &args.local, args.grant);
        let stage = if lane.runs_own_transfer(&local) {
            if let Err(reason) = lane.start_transfer(id, &local) {
                return self.transfer_done(id, Err(TransportError::Unsupported(reason)));
            }
            if let Some(region) = self.onesided.imported.get_mut(&args.grant) {
                region.in_flight += 1;
            }
            Stage::Here
        } else if let Some(prepared) = prepared.filter(|p| self.onesided.at_owner.contains_key(p)) {
            tracing::trace!("prepared transfer asked of its owner");
            self.transmit(WireMessage::RunPrepared { id, prepared, notify: args.notify.clone() });
            self.out.push_back(Output::Flush);
            Stage::AtOwner
        } else {
            match lane.describe_transfer(id, &local) {
                Err(reason) => return self.transfer_done(id, Err(TransportError::Unsupported(reason))),
                Ok(Some(described)) => {
                    tracing::trace!("transfer described for the owner");
                    let keeps = lane.keeps_prepared_transfers();
                    let (op, grant) = (args.op, args.grant);
                    self.ask_owner(id, (op, grant, &args.spans), described, args.notify.clone(), keeps);
                    Stage::AtOwner
                }
                Ok(None) => Stage::Describing(args.op, args.spans),
            }
        };
        let (notify, gated) = match stage {
            Stage::Here => self.notify_ahead(id, args.grant, args.notify, lane),
            _ => (args.notify, None),
        };
        let pending = Pending { grant: args.grant, notify, gated, stage, since: now, _local: args.local };
        self.onesided.transfers.insert(id, pending);
    }

    /// Why transfer `args` cannot start (the region gone, or, for spans given with the
    /// call, memory of two kinds or spans that do not fit).
    fn check_transfer(&self, args: &TransferArgs<P>) -> Result<(), TransportError> {
        self.region_usable(args.grant)?;
        let TransferSpans::Given(spans) = &args.spans else { return Ok(()) };
        let Some(region) = self.onesided.imported.get(&args.grant) else { return Ok(()) };
        check_initiator_transfer(args.op, spans, &args.local, (region.len, region.access, region.device))
    }

    /// Why imported region `grant` takes no transfer (revoked, dropped, gone).
    fn region_usable(&self, grant: u64) -> Result<(), TransportError> {
        // The user holds the region (or a prepared transfer on it): only its owner's
        // revocation, or for a prepared transfer the user's dropping it, removed it.
        let region = self.onesided.imported.get(&grant);
        if region.is_some_and(|r| r.dropped && !r.revoked) {
            return Err(TransportError::Revoked("the remote region was dropped".into()));
        }
        let Some(region) = region else {
            let gone = "the remote region is gone (its owner revoked it, or it was dropped)";
            return Err(TransportError::Revoked(gone.into()));
        };
        if region.revoked {
            return Err(TransportError::Revoked("the owner revoked the remote region".into()));
        }
        Ok(())
    }

    /// Asks the owner to run transfer `id` between its region and this side's memory
    /// as `described`: a prepared transfer (`keeps`: the owner's lane keeps them) with
    /// its spans as the user's is described once (`Prepare`) and named from then on,
    /// within the owner's limits; any other is sent whole (`Transfer`).
    fn ask_owner(
        &mut self,
        id: u64,
        (op, grant, spans): (TransferOp, u64, &TransferSpans),
        described: DescribedTransfer,
        notify: Option<Vec<u8>>,
        keeps: bool,
    ) {
        self.transmit_regions(described.regions);
        let onesided = &self.onesided;
        let prepare = match (spans, &described.spans) {
            (TransferSpans::Prepared(p), None) if keeps => Some(p.clone()).filter(|p| {
                onesided.at_owner.len() < MAX_PREPARED && onesided.at_owner_spans + p.spans.len() <= MAX_PREPARED_SPANS
            }),
            _ => None,
        };
        let (local, local_len) = (described.memory, described.len);
        if let Some(p) = prepare {
            let spans = p.spans.clone();
            let message = TransferMessage { id: p.id, op, grant, local, local_len, spans, notify: None };
            self.transmit(WireMessage::Prepare(Box::new(message)));
            self.onesided.at_owner.insert(p.id, (grant, p.spans.len()));
            self.onesided.at_owner_spans += p.spans.len();
            self.transmit(WireMessage::RunPrepared { id, prepared: p.id, notify });
        } else {
            let spans = described.spans.unwrap_or_else(|| spans.clone().into_vec());
            let message = TransferMessage { id, op, grant, local, local_len, spans, notify };
            self.transmit(WireMessage::Transfer(Box::new(message)));
        }
        self.out.push_back(Output::Flush);
    }

    /// The user dropped prepared transfer `prepared`: its lane, and the owner if it
    /// keeps it, let go of what they kept for it.
    pub fn unprepare(&mut self, prepared: u64, lane: &mut dyn CoreLane<P>) {
        lane.release_prepared(prepared, true);
        let Some((_, spans)) = self.onesided.at_owner.remove(&prepared) else { return };
        self.onesided.at_owner_spans -= spans;
        if self.phase == Phase::Established {
            self.transmit(WireMessage::Unprepare { prepared });
            self.out.push_back(Output::Flush);
        }
    }

    pub(super) fn on_transfer_done(&mut self, id: u64, outcome: TransferOutcome, lane: &mut dyn CoreLane<P>) {
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

    /// This side's memory of transfer `id`, which the owner runs, is ready: the owner is
    /// asked.
    pub(super) fn on_transfer_described(
        &mut self,
        id: u64,
        result: Result<DescribedTransfer, String>,
        now: Instant,
        lane: &mut dyn CoreLane<P>,
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
        // Described later: sent whole (a description made per transfer is not kept).
        self.ask_owner(id, (op, grant, &spans), described, notify, false);
    }

    pub(super) fn on_own_transfer_finished(&mut self, id: u64, result: Result<(), String>, lane: &mut dyn CoreLane<P>) {
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
                    self.transmit(WireMessage::Notify { grant: p.grant, data, gate: None });
                    self.out.push_back(Output::Flush);
                }
                Ok(())
            }
            Err(reason) => Err(TransportError::Unsupported(reason)),
        };
        if let (Err(_), Some(gate)) = (&result, p.gated) {
            // The notification went ahead: the owner drops it (if its gate did not open
            // first: the copies' bytes then arrived, and it was true).
            self.transmit(WireMessage::NotifyCancelled { grant: p.grant, gate });
            self.out.push_back(Output::Flush);
        }
        self.transfer_done(id, result);
        self.close_imported_if_idle(p.grant, lane);
    }
}

/// What the lane says of the producer of `args`' local memory (transfer `id`).
fn producer_state<P: Payload>(
    id: u64,
    args: &TransferArgs<P>,
    lane: &mut dyn CoreLane<P>,
) -> Result<ProducerState, String> {
    lane.transfer_producer(id, &args.spans.local(args.op, &args.local, args.grant))
}
