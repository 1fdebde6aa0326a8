//! The sending side of a connection: sends wait in order for their producer and for
//! staging room, go out as `Data` (after the `Regions` they need), and end when the peer
//! acknowledges them, when this side pushed them into the listener's buffers, or with
//! the connection.

use super::lane::{CoreLane, DescribeError, Described, ProducerState, Released};
use super::state::send::{InFlight, QueuedSend};
use super::{Connection, Output, Phase};
use crate::error::{SendError, TransportError};
use crate::payload::Payload;
use crate::stats::Counters;
use crate::wire::{
    AckResult, DataMessage, DeviceFrameDescriptor, FrameDescriptor, Limits, RegionAnnouncement, WireMessage,
    MAX_NEW_REGIONS,
};
use std::os::fd::OwnedFd;
use std::time::Instant;

/// Checks an outgoing message against the limits the peer enforces.
fn check_outgoing<P: Payload>(message: &P::Message, limits: &Limits) -> Result<(), String> {
    let (header, frames) = (P::header(message), P::frames(message));
    if header.len() > limits.max_header_bytes {
        return Err(format!("header of {} bytes (at most {})", header.len(), limits.max_header_bytes));
    }
    if frames.len() > limits.max_frames {
        return Err(format!("{} frames (at most {})", frames.len(), limits.max_frames));
    }
    if let Some((i, len)) =
        frames.iter().map(P::frame_len).enumerate().find(|(_, len)| *len as u64 > limits.max_frame_len)
    {
        return Err(format!("frame {i} of {len} bytes (at most {})", limits.max_frame_len));
    }
    Ok(())
}

impl<P: Payload> Connection<P> {
    /// The user sends `message` as request `id`.
    pub fn send(&mut self, id: u64, message: P::Message, now: Instant, lane: &mut dyn CoreLane<P>) {
        if self.phase != Phase::Established {
            let error = self.dead_error();
            return self
                .out
                .push_back(Output::SendDone { id, result: Err(SendError { error, message: Some(message) }) });
        }
        if let Err(reason) = check_outgoing::<P>(&message, &self.settings.limits) {
            let error = TransportError::InvalidMessage(reason);
            return self
                .out
                .push_back(Output::SendDone { id, result: Err(SendError { error, message: Some(message) }) });
        }
        self.send.queued.push_back(QueuedSend { id, message });
        self.pump_sends(now, lane);
    }

    fn send_failed(&mut self, id: u64, error: TransportError, message: Option<P::Message>) {
        self.out.push_back(Output::SendDone { id, result: Err(SendError { error, message }) });
    }

    /// Turns queued sends into wire messages while their producers are done and
    /// staging room lasts.
    pub(super) fn pump_sends(&mut self, now: Instant, lane: &mut dyn CoreLane<P>) {
        self.forget_dropped_regions(lane);
        self.send.awaiting_producer = false;
        let mut sent_data = false;
        while let Some(mut q) = self.send.queued.pop_front() {
            let device = P::has_device_frames(&q.message);
            if device {
                match lane.order_producer(q.id, &q.message) {
                    Ok(ProducerState::Ready) => {}
                    Ok(ProducerState::Running) => {
                        self.send.queued.push_front(q);
                        self.send.awaiting_producer = true;
                        break;
                    }
                    Err(error) => {
                        self.send_failed(q.id, error, Some(q.message));
                        continue;
                    }
                }
                if let Some(offer) = self.take_fitting_offer(&q.message, lane) {
                    self.send_into_offer(q.id, q.message, offer, lane);
                    sent_data = true;
                    if self.phase == Phase::Dead {
                        return;
                    }
                    continue;
                }
            }
            // A receive offer for this message that it does not fill is declined first.
            self.decline_receive_offer_for_next(lane);
            let seq = self.send.next_seq;
            match lane.describe(q.id, seq, &mut q.message) {
                Ok(described) => {
                    self.write_described(q, seq, described, now);
                    sent_data = true;
                }
                Err(DescribeError::StagingFull) => {
                    self.send.queued.push_front(q);
                    break;
                }
                Err(DescribeError::Send(error)) => self.send_failed(q.id, error, Some(q.message)),
                Err(DescribeError::Connection(reason)) => {
                    let flight =
                        InFlight { id: q.id, message: q.message, sent_at: now, awaits_targets: false, acked: None };
                    self.send.in_flight.insert(seq, flight);
                    self.send.next_seq += 1;
                    return self.fail_peer(reason, lane);
                }
            }
        }
        self.out.push_back(Output::Flush);
        if sent_data {
            // A wanted push offer follows the data, written after it (its allocation
            // and export would otherwise delay the data): see `after_flush`.
            self.offers.make_eagerly();
        }
    }

    fn write_described(&mut self, q: QueuedSend<P>, seq: u64, described: Described, now: Instant) {
        let Described { frames, regions, staged_bytes, bounced_bytes } = described;
        self.transmit_regions(regions);
        let awaits_targets = frames.iter().any(|f| matches!(f, FrameDescriptor::DevicePush { .. }));
        let data = DataMessage { seq, header: P::header(&q.message).to_vec(), frames };
        self.transmit(WireMessage::Data(data));
        tracing::trace!(seq, pushed = awaits_targets, "data message queued");
        Counters::add(&self.counters.staged_bytes, staged_bytes);
        Counters::add(&self.counters.bounced_bytes, bounced_bytes);
        let flight = InFlight { id: q.id, message: q.message, sent_at: now, awaits_targets, acked: None };
        self.send.in_flight.insert(seq, flight);
        self.send.next_seq += 1;
    }

    /// Announces regions (their fds attached), at most [`MAX_NEW_REGIONS`] per message.
    pub(super) fn transmit_regions(&mut self, regions: Vec<(RegionAnnouncement, OwnedFd)>) {
        let mut regions = regions.into_iter().peekable();
        while regions.peek().is_some() {
            let (list, fds): (Vec<_>, Vec<_>) = regions.by_ref().take(MAX_NEW_REGIONS).unzip();
            self.out.push_back(Output::Transmit { message: WireMessage::Regions(list), fds });
        }
    }

    /// Connector-copies mode, connector side: the copies of `message` into the offered
    /// buffers are enqueued and the message described at once; the send completes when
    /// the lane reports the copies done.
    fn send_into_offer(
        &mut self,
        id: u64,
        message: P::Message,
        (offer, targets): (u64, Vec<DeviceFrameDescriptor>),
        lane: &mut dyn CoreLane<P>,
    ) {
        let seq = self.send.next_seq;
        match lane.send_into_offer(id, seq, &message, offer, &targets) {
            Ok(frames) => {
                if frames.iter().any(|f| matches!(f, FrameDescriptor::DeviceOffered { gate: Some(_), .. })) {
                    Counters::add(&self.counters.offered_sends_gated, 1);
                }
                let data = DataMessage { seq, header: P::header(&message).to_vec(), frames };
                self.transmit(WireMessage::Data(data));
                tracing::trace!(seq, offer, "data message queued, copying into an offer");
                self.send.next_seq += 1;
                self.offers.start_offered_send(id, seq, message);
            }
            Err(failure) if failure.peer_at_fault => {
                let error = TransportError::PeerFailed { peer: self.peer.clone(), reason: failure.reason.clone() };
                self.send_failed(id, error, Some(message));
                self.protocol_error_with(&format!("push offer {offer} does not map: {}", failure.reason), lane);
            }
            Err(failure) => {
                self.transmit(WireMessage::DeclineOffer { offer });
                let reason = format!("copying into the listener's offer: {}", failure.reason);
                self.send_failed(id, TransportError::InvalidMessage(reason), Some(message));
            }
        }
    }

    /// The copies of an offered send finished (`failure`: or failed).
    pub(super) fn on_offered_send_done(&mut self, seq: u64, failure: Option<String>) {
        let Some((id, message)) = self.offers.finish_offered_send(seq) else { return };
        match failure {
            None => {
                tracing::trace!("copies into the offer done");
                Counters::add(&self.counters.messages_sent, 1);
                Counters::add(&self.counters.offered_sends, 1);
                Counters::add(&self.counters.payload_bytes_sent, P::payload_len(&message) as u64);
                self.out.push_back(Output::SendDone { id, result: Ok(message) });
            }
            Some(reason) => {
                let error = TransportError::InvalidMessage(format!("copying into the listener's offer: {reason}"));
                self.send_failed(id, error, Some(message));
            }
        }
    }

    pub(super) fn on_ack(&mut self, seq: u64, result: AckResult, now: Instant, lane: &mut dyn CoreLane<P>) {
        let Some(mut flight) = self.send.in_flight.remove(&seq) else {
            return self.protocol_error_with(&format!("acknowledgement of unknown message {seq}"), lane);
        };
        // A pushed message is answered by `PushTargets`, or refused (the listener could not
        // take it: no memory, over its limits) with an acknowledgement.
        let refused_push = flight.awaits_targets && matches!(result, AckResult::Refused(_));
        if flight.acked.is_some() || (flight.awaits_targets && !refused_push) {
            self.send.in_flight.insert(seq, flight);
            return self.protocol_error_with(&format!("message {seq} acknowledged out of turn"), lane);
        }
        flight.awaits_targets = false;
        match lane.release(seq, &mut flight.message, true) {
            Released::Whole => {
                self.complete_send(flight, result);
                self.pump_sends(now, lane);
            }
            Released::Pending => {
                // Handed back once every transfer gave its frame back (`SendFinished`).
                flight.acked = Some(result);
                self.send.in_flight.insert(seq, flight);
            }
            Released::FramesLost => {
                let error = TransportError::InvalidMessage("a frame stayed inside UCX after its send completed".into());
                self.send_failed(flight.id, error, None);
                self.pump_sends(now, lane);
            }
        }
    }

    /// The lane gave back the frames of an acknowledged send.
    pub(super) fn on_send_finished(&mut self, seq: u64, now: Instant, lane: &mut dyn CoreLane<P>) {
        let Some(flight) = self.send.in_flight.get(&seq) else { return };
        if flight.acked.is_none() {
            return;
        }
        let mut flight = self.send.in_flight.remove(&seq).expect("looked up above");
        match lane.release(seq, &mut flight.message, true) {
            Released::Whole => {
                let result = flight.acked.take().expect("checked above");
                self.complete_send(flight, result);
            }
            Released::Pending => {
                self.send.in_flight.insert(seq, flight);
                return;
            }
            Released::FramesLost => {
                let error = TransportError::InvalidMessage("a frame stayed inside UCX after its send completed".into());
                self.send_failed(flight.id, error, None);
            }
        }
        self.match_posted(now, lane);
        self.pump_sends(now, lane);
    }

    /// Connector-copies mode, connector side: fill the listener's buffers, say so, and
    /// hand the message back.
    pub(super) fn on_push_targets(
        &mut self,
        seq: u64,
        targets: Vec<DeviceFrameDescriptor>,
        now: Instant,
        lane: &mut dyn CoreLane<P>,
    ) {
        let Some(mut flight) = self.send.in_flight.remove(&seq) else {
            return self.protocol_error_with(&format!("push targets for unknown message {seq}"), lane);
        };
        if !flight.awaits_targets {
            self.send.in_flight.insert(seq, flight);
            return self.protocol_error_with(&format!("push targets for message {seq}, which has none to fill"), lane);
        }
        flight.awaits_targets = false;
        match lane.push(seq, &flight.message, &targets) {
            Ok(()) => {
                self.transmit(WireMessage::PushDone { seq });
                match lane.release(seq, &mut flight.message, true) {
                    Released::Whole => self.complete_send(flight, AckResult::Delivered),
                    Released::Pending => {
                        // Delivered; handed back once the lane gave the frames back.
                        flight.acked = Some(AckResult::Delivered);
                        self.send.in_flight.insert(seq, flight);
                    }
                    Released::FramesLost => {
                        let error =
                            TransportError::InvalidMessage("a frame stayed with the lane after its push".into());
                        self.send_failed(flight.id, error, None);
                    }
                }
                self.pump_sends(now, lane);
            }
            Err(failure) => {
                self.send.in_flight.insert(seq, flight);
                let reason = format!("copying message {seq} into the listener's buffers: {}", failure.reason);
                if failure.peer_at_fault {
                    self.protocol_error_with(&reason, lane)
                } else {
                    self.fail_peer(reason, lane)
                }
            }
        }
    }

    /// Hands an acknowledged message back to its sender.
    fn complete_send(&mut self, flight: InFlight<P>, result: AckResult) {
        let result = match result {
            AckResult::Delivered => {
                Counters::add(&self.counters.messages_sent, 1);
                Counters::add(&self.counters.payload_bytes_sent, P::payload_len(&flight.message) as u64);
                Ok(flight.message)
            }
            AckResult::Refused(reason) => {
                let error = TransportError::Refused { peer: self.peer.clone(), reason };
                Err(SendError { error, message: Some(flight.message) })
            }
        };
        self.out.push_back(Output::SendDone { id: flight.id, result });
    }

    /// Before the connection fails: sends the peer acknowledged were delivered; once the
    /// lane gave their frames back they complete as successes.
    pub(super) fn settle_acknowledged_sends(&mut self, lane: &mut dyn CoreLane<P>) {
        let acked: Vec<u64> = self.send.in_flight.iter().filter(|(_, f)| f.acked.is_some()).map(|(&s, _)| s).collect();
        if acked.is_empty() {
            return;
        }
        lane.settle(&acked);
        for seq in acked {
            let mut flight = self.send.in_flight.remove(&seq).expect("listed above");
            match lane.release(seq, &mut flight.message, true) {
                Released::Whole => {
                    let result = flight.acked.take().expect("acknowledged");
                    self.complete_send(flight, result);
                }
                Released::FramesLost => {
                    // Delivered, but a frame is still the lane's: the message cannot come back.
                    let error = TransportError::PeerClosed { peer: self.peer.clone() };
                    self.send_failed(flight.id, error, None);
                }
                Released::Pending => {
                    self.send.in_flight.insert(seq, flight);
                }
            }
        }
    }

    /// Ends every send with `error`, handing back each message the lane can give back.
    pub(super) fn fail_sends(&mut self, error: &TransportError, lane: &mut dyn CoreLane<P>) {
        for q in std::mem::take(&mut self.send.queued) {
            self.send_failed(q.id, error.clone(), Some(q.message));
        }
        for (seq, mut flight) in std::mem::take(&mut self.send.in_flight) {
            let message = match lane.release(seq, &mut flight.message, false) {
                Released::Whole => Some(flight.message),
                Released::Pending | Released::FramesLost => None,
            };
            let done = Output::SendDone { id: flight.id, result: Err(SendError { error: error.clone(), message }) };
            match &mut self.held_for_hangup {
                // The peer may still be reading the message: it goes back once the peer
                // hung up (`recv/hangup.rs`).
                Some(held) => held.defer(done),
                None => self.out.push_back(done),
            }
        }
        for (seq, id, mut message) in self.offers.take_offered_sends() {
            // The lane waits for the copies before the message goes back.
            let whole = matches!(lane.release(seq, &mut message, false), Released::Whole);
            self.send_failed(id, error.clone(), whole.then_some(message));
        }
    }

    /// A request's waiter gave up on it.
    pub fn cancel(&mut self, id: u64, now: Instant, lane: &mut dyn CoreLane<P>) {
        let timed_out = TransportError::TimedOut(self.settings.request_timeout);
        if let Some(i) = self.send.queued.iter().position(|q| q.id == id) {
            let q = self.send.queued.remove(i).expect("index exists");
            lane.discard_send(id);
            self.send_failed(id, timed_out, Some(q.message));
        } else if self.cancel_recv(id, &timed_out)
            || self.cancel_landing_recv(id, &timed_out)
            || self.cancel_offered_recv(id, &timed_out, now)
            || self.end_notification_wait(id, Some(&timed_out))
        {
        } else if let Some(seq) = self.send.in_flight.iter().find(|(_, f)| f.id == id).map(|(&s, _)| s) {
            // The peer holds our memory and has not answered in time: treat it as dead.
            let timeout = self.settings.request_timeout;
            self.fail_peer(format!("message {seq} not acknowledged within {timeout:?}"), lane);
        }
    }

    /// The user dropped request `id` before it completed: a send still queued (behind
    /// its producer or staging room) is withdrawn, its message dropped and never
    /// described; a posted receive is withdrawn, its buffers dropped. Whether one was;
    /// anything further along completes as usual (a send in flight still reaches the
    /// peer, a message landing for a receive goes to it).
    pub fn withdraw(&mut self, id: u64, lane: &mut dyn CoreLane<P>) -> bool {
        if let Some(i) = self.send.queued.iter().position(|q| q.id == id) {
            drop(self.send.queued.remove(i));
            lane.discard_send(id);
            return true;
        }
        self.withdraw_recv(id) || self.end_notification_wait(id, None)
    }

    /// Tells the peer to unmap regions this side has dropped.
    pub(super) fn forget_dropped_regions(&mut self, lane: &mut dyn CoreLane<P>) {
        for region_id in lane.dropped_regions() {
            self.transmit(WireMessage::ForgetRegion { region_id });
        }
    }
}
