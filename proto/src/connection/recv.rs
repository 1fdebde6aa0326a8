//! The receiving side of a connection: described messages park in order until the
//! peer's GPU work on them is done and a receive (or the unclaimed budget) takes them;
//! they land through the lane, are acknowledged, and go to receives in order. A receive
//! that names a stream may get its message while the lane's copies still run (the
//! stream waits for them); its acknowledgement, and those behind it, wait for the
//! lane's `CopiesDone`: acknowledgements go out in order.

use super::lane::{CopyMismatch, CoreLane, Readiness};
use super::offers::device_layout;
use super::{Connection, Output, Phase};
use crate::error::TransportError;
use crate::payload::Payload;
use crate::stats::Counters;
use crate::wire::{AckResult, DataMessage, FrameDescriptor, WireMessage};
use std::time::Instant;

mod hangup;
mod landing;
mod offered;
mod withdraw;

use super::state::recv::lands_in_receive_buffers;
pub(super) use super::state::recv::DEVICE_RECV_GRACE;
use super::state::recv::{recv_error, Awaits, InLanding, PendingAck, PostedRecv};

impl<P: Payload> Connection<P> {
    /// The user posts receive `id` (into `into`, when given; its copies ordered before
    /// the work on `on` the user enqueues after, when given).
    pub fn recv(
        &mut self,
        id: u64,
        into: Option<Vec<P::Frame>>,
        on: Option<P::Stream>,
        now: Instant,
        lane: &mut dyn CoreLane<P>,
    ) {
        if self.phase == Phase::Dead && self.recv.landed.is_empty() {
            let error = self.dead_error();
            return self.out.push_back(Output::RecvDone { id, result: Err(recv_error(error, into)) });
        }
        self.recv.posted.push_back(PostedRecv { id, into, on });
        self.match_posted(now, lane);
    }

    /// Ends receive `id` with `error`, when it is posted; whether it was.
    pub(super) fn cancel_recv(&mut self, id: u64, error: &TransportError) -> bool {
        let Some(i) = self.recv.posted.iter().position(|r| r.id == id) else { return false };
        let r = self.recv.posted.remove(i).expect("index exists");
        self.out.push_back(Output::RecvDone { id, result: Err(recv_error(error.clone(), r.into)) });
        true
    }

    /// Gives landed messages to posted receives, in order, then lands what waits.
    pub(super) fn match_posted(&mut self, now: Instant, lane: &mut dyn CoreLane<P>) {
        self.pair_landed(lane);
        if self.phase == Phase::Dead {
            let error = self.dead_error();
            for r in std::mem::take(&mut self.recv.posted) {
                self.out.push_back(Output::RecvDone { id: r.id, result: Err(recv_error(error.clone(), r.into)) });
            }
            return;
        }
        self.deliver_parked(now, lane);
    }

    /// Gives landed messages to posted receives, in order.
    fn pair_landed(&mut self, lane: &mut dyn CoreLane<P>) {
        while !self.recv.landed.is_empty() && !self.recv.posted.is_empty() {
            let message = self.recv.landed.pop_front().expect("checked");
            let returned_by = self.recv.returned.pop_front();
            let posted = self.recv.posted.pop_front().expect("checked");
            self.recv.landed_bytes -= P::payload_len(&message);
            let Some(buffers) = posted.into else {
                self.out.push_back(Output::RecvDone { id: posted.id, result: Ok(message) });
                continue;
            };
            if P::has_device_frames(&message) {
                // This receiver copies device frames out of landed memory: offers would
                // only add such copies.
                self.offers.pause();
            }
            match lane.copy_into(&message, buffers) {
                Ok(frames) => {
                    let filled = P::with_frames(message, frames);
                    self.out.push_back(Output::RecvDone { id: posted.id, result: Ok(filled) });
                }
                Err(CopyMismatch { reason, buffers }) => {
                    self.recv.landed_bytes += P::payload_len(&message);
                    self.recv.landed.push_front(message);
                    if let Some(id) = returned_by {
                        self.recv.returned.push_front(id);
                    }
                    let error = TransportError::BufferMismatch(reason);
                    self.out
                        .push_back(Output::RecvDone { id: posted.id, result: Err(recv_error(error, Some(buffers))) });
                }
            }
        }
    }

    pub(super) fn on_data(&mut self, data: DataMessage, now: Instant, lane: &mut dyn CoreLane<P>) {
        if data.seq != self.recv.expected_seq {
            let expected = self.recv.expected_seq;
            return self.protocol_error_with(&format!("message {} arrived where {expected} was due", data.seq), lane);
        }
        self.recv.expected_seq += 1;
        self.recv.parked.push_back((data, now));
        self.deliver_parked(now, lane);
    }

    /// Lands parked messages while someone waits for them or the unclaimed budget allows.
    pub(super) fn deliver_parked(&mut self, now: Instant, lane: &mut dyn CoreLane<P>) {
        self.recv.awaiting_peer_gpu = false;
        while let Some((front, arrived)) = self.recv.parked.front() {
            // The peer's GPU work on the frames (its producer's, or its copies into our
            // offer) must be done; `handle_timeout` comes back.
            match lane.readiness(front) {
                Readiness::Ready => {}
                Readiness::Pending => {
                    self.recv.awaiting_peer_gpu = true;
                    break;
                }
                Readiness::Failed(f) if f.peer_at_fault => return self.protocol_error_with(&f.reason, lane),
                Readiness::Failed(f) => {
                    return self.fail_peer(format!("polling the peer's ready event: {}", f.reason), lane)
                }
            }
            // The message a receive offer waits for: in the receive's own buffers, or (not
            // filling them) after the connector's decline, which is on its way.
            match self.fills_receive_offer(front) {
                Some(false) => break,
                Some(true) => {
                    let (data, _) = self.recv.parked.pop_front().expect("front exists");
                    if !self.land_receive_offer(data, lane) {
                        return;
                    }
                    continue;
                }
                None => {}
            }
            let payload: u64 = front.frames.iter().map(FrameDescriptor::len).sum();
            let waits_for_buffers = lands_in_receive_buffers(front);
            let arrived = *arrived;
            // A receive may take a message as it lands only when no unclaimed message is
            // ahead of it, landing or landed (one whose `recv_into` did not fit).
            let unclaimed_ahead = !self.recv.landed.is_empty() || self.recv.landings.iter().any(|l| l.claim.is_none());
            let has_recv = !unclaimed_ahead && !self.recv.posted.is_empty();
            if !has_recv && waits_for_buffers && now.saturating_duration_since(arrived) < DEVICE_RECV_GRACE {
                // A device message waits a moment for its receive, so a `recv_into` posted
                // just after it arrived gets the one copy directly into its buffers.
                break;
            }
            let over_budget = self.recv.landed_bytes > 0
                && self.recv.landed_bytes as u64 + payload > self.settings.unexpected_max_bytes as u64;
            if !has_recv && over_budget {
                break;
            }
            let recv = if has_recv { self.recv.posted.pop_front() } else { None };
            let (data, _) = self.recv.parked.pop_front().expect("front exists");
            if !self.land_one(data, recv, payload, now, lane) {
                return;
            }
        }
        // An offered message that landed unclaimed may have a `recv_into` waiting for it.
        self.pair_landed(lane);
        // The first posted receive may be offered now: once what was delivered went out.
        self.offers.receive_offer_wanted = true;
    }

    /// A landed message goes to its receive or waits for one. `count_unclaimed`: its
    /// bytes were not counted as unclaimed when it started landing.
    fn deliver(&mut self, claim: Option<u64>, message: P::Message, count_unclaimed: bool) {
        Counters::add(&self.counters.messages_received, 1);
        Counters::add(&self.counters.payload_bytes_received, P::payload_len(&message) as u64);
        match claim {
            Some(id) => {
                tracing::trace!("message delivered to a receive");
                self.out.push_back(Output::RecvDone { id, result: Ok(message) });
            }
            None => {
                if count_unclaimed {
                    self.recv.landed_bytes += P::payload_len(&message);
                }
                self.recv.landed.push_back(message);
            }
        }
    }

    /// The lane landed message `seq` (UCX transfers): deliver, in order.
    pub(super) fn on_landed(&mut self, seq: u64, message: P::Message, now: Instant, lane: &mut dyn CoreLane<P>) {
        let Some(landing) = self.recv.landings.iter_mut().find(|l| l.seq == Some(seq) && l.awaits == Awaits::Lane)
        else {
            return self.fail_peer(format!("message {seq} landed, but none such was landing"), lane);
        };
        landing.done = Some(message);
        self.deliver_landings_in_order();
        self.match_posted(now, lane);
        self.pump_sends(now, lane);
    }

    /// Connector-copies mode, listener side: the connector filled message `seq`.
    pub(super) fn on_push_done(&mut self, seq: u64, now: Instant, lane: &mut dyn CoreLane<P>) {
        let front = self.recv.landings.front();
        let Some(Awaits::Push { into_callers_buffers }) = front.filter(|l| l.seq == Some(seq)).map(|l| l.awaits) else {
            return self.protocol_error_with(&format!("push of message {seq} done out of turn"), lane);
        };
        let landing = self.recv.landings.pop_front().expect("checked");
        let message = match lane.finish_push(seq) {
            Ok(message) => message,
            Err(f) => return self.fail_peer(f.reason, lane),
        };
        // Receives into the caller's buffers get no offers (see `land_one`).
        let layout = if into_callers_buffers { None } else { device_layout::<P>(&message) };
        if landing.claim.is_some() && !into_callers_buffers {
            self.offers.resume();
        }
        self.deliver(landing.claim, message, false);
        self.deliver_landings_in_order();
        self.want_offer(layout, now);
        self.match_posted(now, lane);
    }

    /// A message whose landing waits on the peer (its push, a lane transfer) longer than
    /// the request timeout: the peer or the path to it stalled (a vanished host sends no
    /// hang-up), and the connection fails as a send unacknowledged as long fails it.
    pub(super) fn landing_overdue(&self, now: Instant) -> Option<u64> {
        let timeout = self.settings.request_timeout;
        let overdue = |l: &&InLanding<P>| {
            l.done.is_none() && l.peer_since.is_some_and(|at| now.saturating_duration_since(at) > timeout)
        };
        self.recv.landings.iter().find(overdue).and_then(|l| l.seq)
    }

    /// Delivers the landings at the front that are done, in order (acknowledging those
    /// the lane finished).
    fn deliver_landings_in_order(&mut self) {
        while self.recv.landings.front().is_some_and(|l| l.done.is_some()) {
            let landing = self.recv.landings.pop_front().expect("checked");
            let message = landing.done.expect("checked");
            if let (Awaits::Lane, Some(seq)) = (landing.awaits, landing.seq) {
                self.ack(seq, AckResult::Delivered);
            }
            self.deliver(landing.claim, message, false);
        }
    }
}

impl<P: Payload> Connection<P> {
    /// Acknowledges message `seq`, in order: behind acknowledgements held for copies.
    fn ack(&mut self, seq: u64, result: AckResult) {
        if self.recv.acks.is_empty() {
            return self.transmit(WireMessage::Ack { seq, result });
        }
        self.recv.acks.push_back(PendingAck { seq, claim: None, result: Some(result) });
    }

    /// The copies of message `seq` are done: its acknowledgement, and the ones held
    /// behind it, go out; whether it was awaited.
    fn copies_done(&mut self, seq: u64) -> bool {
        let Some(pending) = self.recv.acks.iter_mut().find(|a| a.seq == seq && a.result.is_none()) else {
            return false;
        };
        pending.result = Some(AckResult::Delivered);
        while self.recv.acks.front().is_some_and(|a| a.result.is_some()) {
            let Some(PendingAck { seq, result: Some(result), .. }) = self.recv.acks.pop_front() else { break };
            self.transmit(WireMessage::Ack { seq, result });
        }
        true
    }

    /// The lane's copies of message `seq`, delivered while they ran, completed.
    pub(super) fn on_copies_done(&mut self, seq: u64, lane: &mut dyn CoreLane<P>) {
        if !self.copies_done(seq) {
            self.fail_peer(format!("the copies of message {seq} completed, but none such ran"), lane);
        }
    }
}
