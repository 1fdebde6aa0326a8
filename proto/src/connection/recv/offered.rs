//! Receive offers, listener side: a posted `recv_into`'s own buffers offered to the
//! connector for the very next message (`PushOffer { for_seq: Some(seq) }`), so the
//! connector copies that message straight into them and sends it as `DeviceOffered`
//! frames: one control message instead of `Data`, `PushTargets` and `PushDone`, and the
//! buffers' export happens before the message exists.
//!
//! - Offered only when that receive is sure to get message `seq`: it is the first posted,
//!   nothing arrived that no receive took, no message waits. The receive then leaves the
//!   posted queue and waits in the landings, claiming `seq`, like a receive whose message
//!   is being pushed; its buffers are the lane's meanwhile.
//! - The connector fills them with message `seq`, or declines them before it sends
//!   `seq` (at once when `seq` went before the offer came: then message `seq` waits here
//!   for that answer, and lands the usual way once the receive has its buffers back).
//! - A receive that ends first (its deadline) asks for its buffers back
//!   (`WithdrawOffer`): a decline hands them back with the error; a message already
//!   filling them is delivered instead. A connector that answers neither within the
//!   request timeout fails the connection. A receive whose handle is dropped gives its
//!   claim up like any landing receive (`withdraw.rs`): a filled offer then lands
//!   unclaimed, a declined one's buffers are dropped.

use crate::connection::lane::{CoreLane, Landing, ReceiveOffer};
use crate::connection::offers::offered_frames;
use crate::connection::state::offers::BoundOffer;
use crate::connection::state::recv::{recv_error, Awaits, InLanding, PostedRecv};
use crate::connection::{Connection, Output, Phase, PushRole};
use crate::error::TransportError;
use crate::payload::Payload;
use crate::stats::Counters;
use crate::wire::{DataMessage, FrameDescriptor, WireMessage};
use std::time::Instant;

impl<P: Payload> Connection<P> {
    /// Listener: offers the first posted receive's buffers for the next message, when
    /// that receive is sure to get it (see the module docs).
    pub(in crate::connection) fn offer_front_receive(&mut self, lane: &mut dyn CoreLane<P>) {
        self.offers.receive_offer_pending = false;
        if self.push != PushRole::Target
            || self.phase != Phase::Established
            || self.settings.push_offer_max_bytes == 0
            || self.offers.bound.is_some()
            || !self.recv.parked.is_empty()
            || !self.recv.landed.is_empty()
            || self.recv.landings.iter().any(|l| l.claim.is_none())
        {
            return;
        }
        let Some(front) = self.recv.posted.front() else { return };
        if front.into.as_ref().is_none_or(Vec::is_empty) || self.offers.not_offerable == Some(front.id) {
            return;
        }
        let PostedRecv { id, into, on } = self.recv.posted.pop_front().expect("checked");
        let buffers = into.expect("checked");
        let offer = self.offers.peek_offer_id();
        match lane.offer_receive_buffers(offer, id, buffers) {
            ReceiveOffer::Made { targets, regions } => {
                self.offers.consume_offer_id();
                let seq = self.recv.expected_seq;
                let lens: Vec<u64> = targets.iter().map(|t| t.len).collect();
                let payload = lens.iter().sum();
                self.offers.bound = Some(BoundOffer { offer, seq, lens, withdrawn_at: None, cancelled: None });
                self.recv.landings.push_back(InLanding {
                    seq: Some(seq),
                    claim: Some(id),
                    with_buffers: true,
                    on,
                    payload,
                    awaits: Awaits::Offer { offer },
                    // The offer waits for a message the connector may not have yet.
                    peer_since: None,
                    done: None,
                });
                self.transmit_regions(regions);
                self.transmit(WireMessage::PushOffer { offer, targets, for_seq: Some(seq) });
                self.out.push_back(Output::Flush);
                tracing::trace!(offer, seq, "receive offered");
            }
            ReceiveOffer::NotYet(buffers) => {
                self.recv.posted.push_front(PostedRecv { id, into: Some(buffers), on });
                self.offers.receive_offer_pending = true;
            }
            ReceiveOffer::Never(buffers) => {
                self.recv.posted.push_front(PostedRecv { id, into: Some(buffers), on });
                self.offers.not_offerable = Some(id);
            }
        }
    }

    /// Listener: whether `data` is the message the receive offer is for: `Some(true)`
    /// when it fills the offer, `Some(false)` when it does not (the connector's decline is
    /// on its way), `None` when no offer waits for it.
    pub(super) fn fills_receive_offer(&self, data: &DataMessage) -> Option<bool> {
        let bound = self.offers.bound.as_ref().filter(|b| b.seq == data.seq)?;
        Some(
            data.frames
                .iter()
                .any(|f| matches!(f, FrameDescriptor::DeviceOffered { offer, .. } if *offer == bound.offer)),
        )
    }

    /// Listener: message `data` filled the receive offer: it is in the receive's buffers,
    /// delivered in order. `false` when the connection failed.
    pub(super) fn land_receive_offer(&mut self, data: DataMessage, lane: &mut dyn CoreLane<P>) -> bool {
        let bound = self.offers.bound.as_ref().expect("checked by fills_receive_offer");
        let offered = offered_frames(&data);
        let exact = offered.len() == data.frames.len()
            && offered.len() == bound.lens.len()
            && offered
                .iter()
                .enumerate()
                .all(|(i, &(o, index, len))| o == bound.offer && index as usize == i && bound.lens[i] == len);
        if !exact {
            let what = format!("message {} does not match receive offer {}", data.seq, bound.offer);
            self.protocol_error_with(&what, lane);
            return false;
        }
        let bound = self.offers.bound.take().expect("checked above");
        let message = match lane.land(&data, None, Some(bound.offer), None) {
            Landing::Done(message) => message,
            Landing::Failed(f) if f.peer_at_fault => {
                self.protocol_error_with(&f.reason, lane);
                return false;
            }
            Landing::Failed(f) => {
                self.fail_peer(format!("offered message {} could not land: {}", data.seq, f.reason), lane);
                return false;
            }
            _ => {
                self.fail_peer(format!("offered message {} did not land in its offer", data.seq), lane);
                return false;
            }
        };
        let Some(landing) = self.recv.landings.iter_mut().find(|l| l.awaits == Awaits::Offer { offer: bound.offer })
        else {
            self.fail_peer(format!("receive offer {} has no receive", bound.offer), lane);
            return false;
        };
        tracing::trace!(seq = data.seq, offer = bound.offer, "message landed in a receive's own buffers");
        landing.done = Some(message);
        Counters::add(&self.counters.offered_receives, 1);
        self.deliver_landings_in_order();
        true
    }

    /// Listener: the connector declined the receive offer: the receive gets its buffers
    /// back (first in line again), or ends with its error when it was cancelled.
    pub(in crate::connection) fn receive_offer_declined(&mut self, now: Instant, lane: &mut dyn CoreLane<P>) {
        let bound = self.offers.bound.take().expect("checked by the caller");
        let buffers = lane.take_back_offer(bound.offer);
        let Some(at) = self.recv.landings.iter().position(|l| l.awaits == Awaits::Offer { offer: bound.offer }) else {
            return self.fail_peer(format!("receive offer {} has no receive", bound.offer), lane);
        };
        let landing = self.recv.landings.remove(at).expect("index exists");
        match (landing.claim, bound.cancelled) {
            (Some(id), Some(error)) => {
                self.out.push_back(Output::RecvDone { id, result: Err(recv_error(error, buffers)) })
            }
            (Some(id), None) => {
                // Message `seq` goes to it the usual way; no second offer for it.
                self.offers.not_offerable = Some(id);
                self.recv.posted.push_front(PostedRecv { id, into: buffers, on: landing.on });
            }
            // Its handle went: counted unclaimed since (`withdraw_recv`); the buffers go.
            (None, _) => self.recv.landed_bytes -= landing.payload as usize,
        }
        tracing::trace!(offer = bound.offer, "receive offer declined");
        self.match_posted(now, lane);
    }

    /// Listener: receive `id` waits on its offer and ends with `error` (its deadline):
    /// the connector is asked for the buffers back. Whether `id` was such a receive.
    pub(in crate::connection) fn cancel_offered_recv(&mut self, id: u64, error: &TransportError, now: Instant) -> bool {
        let Some(bound) = self.offers.bound.as_mut() else { return false };
        let offer = bound.offer;
        let claimed = self.recv.landings.iter().any(|l| l.awaits == Awaits::Offer { offer } && l.claim == Some(id));
        if !claimed || bound.cancelled.is_some() {
            return claimed;
        }
        bound.cancelled = Some(error.clone());
        bound.withdrawn_at = Some(now);
        self.transmit(WireMessage::WithdrawOffer { offer });
        self.out.push_back(Output::Flush);
        true
    }

    /// Listener: whether a withdrawn receive offer went unanswered past the request
    /// timeout (the connection then fails).
    pub(in crate::connection) fn receive_offer_overdue(&self, now: Instant) -> Option<u64> {
        let bound = self.offers.bound.as_ref()?;
        let at = bound.withdrawn_at?;
        (now.saturating_duration_since(at) > self.settings.request_timeout).then_some(bound.offer)
    }

    /// The connection ends: the receive offer's buffers, taken back from the lane, for
    /// the receive that lent them.
    pub(in crate::connection) fn take_back_lent_buffers(
        &mut self,
        lane: &mut dyn CoreLane<P>,
    ) -> Option<(u64, Vec<P::Frame>)> {
        let bound = self.offers.bound.take()?;
        lane.take_back_offer(bound.offer).map(|buffers| (bound.offer, buffers))
    }
}
