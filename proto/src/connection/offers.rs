//! Push offers: the connector-copies mode without the `PushTargets` round trip.
//!
//! After the listener delivered a pushed message whose frames are all device frames (of
//! at most `push_offer_max_bytes` in all), it offers buffers of the same lengths for the
//! connector's next message (`PushOffer`). A connector whose next device message has
//! exactly those lengths copies into them and sends `Data` with `DeviceOffered` frames
//! at once; the listener delivers when the ready events in them completed and sends no
//! acknowledgement; the connector's send completes when its copies completed. A message
//! that looks different makes the connector decline the offer (`DeclineOffer`). At most
//! two offers are outstanding per connection; the listener never withdraws one, so the
//! sides cannot race; an offer dies with the connection.
//!
//! A listener's posted `recv_into` is offered too, its own buffers for the very next
//! message (`PushOffer.for_seq`; `recv/offered.rs`): the connector fills them with that
//! message or declines them before it sends it, and the listener may ask for them back
//! (`WithdrawOffer`, when the receive ends first). At most one such offer is outstanding,
//! besides the two of allocated buffers.
//!
//! This module keeps the protocol's part (which offers exist, which fits, when to make
//! one); the buffers themselves are the lane's.

use super::lane::CoreLane;
use super::state::offers::{HeldForSeq, MAX_OFFERS_HELD, MAX_OFFERS_MADE};
use super::{Connection, Output, PushRole};
use crate::payload::Payload;
use crate::wire::{DataMessage, DeviceFrameDescriptor, FrameDescriptor, WireMessage};
use std::time::{Duration, Instant};

/// How long a wanted offer waits for a send to ride along with before it goes alone.
pub(super) const OFFER_IDLE_DELAY: Duration = Duration::from_micros(20);

/// The device frame lengths of a message, when every frame is a device frame.
pub(super) fn device_layout<P: Payload>(message: &P::Message) -> Option<Vec<u64>> {
    let lens: Option<Vec<u64>> =
        P::frames(message).iter().map(|f| P::is_device(f).then(|| P::frame_len(f) as u64)).collect();
    lens.filter(|l| !l.is_empty())
}

impl<P: Payload> Connection<P> {
    /// Connector: the listener offers buffers for a future message (`for_seq`: a
    /// receive's own, for that message only).
    pub(super) fn on_push_offer(
        &mut self,
        offer: u64,
        targets: Vec<DeviceFrameDescriptor>,
        for_seq: Option<u64>,
        lane: &mut dyn CoreLane<P>,
    ) {
        if self.push != PushRole::Pusher {
            return self.protocol_error_with("push offer to a side that does not push", lane);
        }
        let full = match for_seq {
            None => self.offers.held.len() >= MAX_OFFERS_HELD,
            Some(_) => self.offers.held_for_seq.is_some(),
        };
        if full || self.offers.last_held.is_some_and(|last| last >= offer) {
            return self.protocol_error_with(&format!("push offer {offer} out of turn"), lane);
        }
        if targets.is_empty() {
            return self.protocol_error_with(&format!("push offer {offer} has no buffers"), lane);
        }
        self.offers.last_held = Some(offer);
        let Some(seq) = for_seq else { return self.offers.held.push_back((offer, targets)) };
        let next = self.send.next_seq();
        if seq > next {
            return self
                .protocol_error_with(&format!("push offer {offer} for message {seq}, not yet sent {next}"), lane);
        }
        if seq < next {
            // Message `seq` went before the offer came: the listener waits for this answer.
            return self.transmit(WireMessage::DeclineOffer { offer });
        }
        lane.offer_received(offer, &targets);
        self.offers.held_for_seq = Some(HeldForSeq { offer, targets, seq });
    }

    /// Connector: the receive offer for the message about to be sent, taken (when it
    /// fits `message`, `Some`; else declined, before that message goes).
    fn take_receive_offer(
        &mut self,
        message: Option<&P::Message>,
        lane: &mut dyn CoreLane<P>,
    ) -> Option<(u64, Vec<DeviceFrameDescriptor>)> {
        let next = self.send.next_seq();
        let held = self.offers.held_for_seq.take_if(|h| h.seq == next)?;
        let fits = message.and_then(device_layout::<P>).is_some_and(|lens| {
            lens.len() == held.targets.len() && lens.iter().zip(&held.targets).all(|(l, t)| *l == t.len)
        });
        if fits {
            return Some((held.offer, held.targets));
        }
        // The lane lets go of the offer's buffers before the listener may hand them back.
        lane.offer_given_up(held.offer);
        self.transmit(WireMessage::DeclineOffer { offer: held.offer });
        None
    }

    /// Connector: a message without device frames is about to go: a receive offer for it
    /// is declined first.
    pub(super) fn decline_receive_offer_for_next(&mut self, lane: &mut dyn CoreLane<P>) {
        let _declined = self.take_receive_offer(None, lane);
    }

    /// Connector: the listener wants offer `offer` back: declined when still unused
    /// (one already filled is answered by its message).
    pub(super) fn on_withdraw_offer(&mut self, offer: u64, lane: &mut dyn CoreLane<P>) {
        if self.push != PushRole::Pusher {
            return self.protocol_error_with("withdrawal of an offer from a side that makes them", lane);
        }
        let bound = self.offers.held_for_seq.take_if(|h| h.offer == offer).is_some();
        let before = self.offers.held.len();
        self.offers.held.retain(|(id, _)| *id != offer);
        if bound {
            lane.offer_given_up(offer);
        }
        if bound || self.offers.held.len() != before {
            self.transmit(WireMessage::DeclineOffer { offer });
        }
    }

    /// Listener: the connector will not use an offer (a receive offer: the receive gets
    /// its buffers back, `recv/offered.rs`).
    pub(super) fn on_decline_offer(&mut self, offer: u64, now: Instant, lane: &mut dyn CoreLane<P>) {
        if self.push == PushRole::Target && self.offers.bound.as_ref().is_some_and(|b| b.offer == offer) {
            return self.receive_offer_declined(now, lane);
        }
        if self.push != PushRole::Target || self.offers.made.remove(&offer).is_none() {
            return self.protocol_error_with(&format!("decline of unknown push offer {offer}"), lane);
        }
        lane.drop_offer(offer);
        tracing::trace!(offer, "push offer declined");
    }

    /// Connector: the offer `message` can be copied into: the receive offer for it when
    /// it fits, else the oldest one held when that fits it exactly. An offer that does not
    /// fit a device message is declined.
    pub(super) fn take_fitting_offer(
        &mut self,
        message: &P::Message,
        lane: &mut dyn CoreLane<P>,
    ) -> Option<(u64, Vec<DeviceFrameDescriptor>)> {
        if self.push != PushRole::Pusher {
            return None;
        }
        if let Some(taken) = self.take_receive_offer(Some(message), lane) {
            return Some(taken);
        }
        if self.offers.held.is_empty() {
            return None;
        }
        if !P::has_device_frames(message) {
            return None; // a host message leaves the offer for the next device one
        }
        let (id, targets) = self.offers.held.pop_front().expect("checked");
        let fits = device_layout::<P>(message)
            .is_some_and(|lens| lens.len() == targets.len() && lens.iter().zip(&targets).all(|(l, t)| *l == t.len));
        if fits {
            return Some((id, targets));
        }
        self.transmit(WireMessage::DeclineOffer { offer: id });
        None
    }

    /// Listener: the offer a `DeviceOffered` message fills, after checking that it
    /// fills exactly that offer; `Ok(None)` for other messages.
    pub(super) fn take_offered(&mut self, data: &DataMessage) -> Result<Option<u64>, String> {
        let offered = offered_frames(data);
        let Some(&(offer, _, _)) = offered.first() else { return Ok(None) };
        if self.push != PushRole::Target {
            return Err(format!("message {} fills a push offer, but this side makes none", data.seq));
        }
        if offered.len() != data.frames.len() {
            return Err(format!("message {} mixes offered frames with others", data.seq));
        }
        let Some(lens) = self.offers.made.get(&offer) else {
            return Err(format!("message {} fills unknown push offer {offer}", data.seq));
        };
        let exact = lens.len() == offered.len()
            && offered
                .iter()
                .enumerate()
                .all(|(i, &(o, index, len))| o == offer && index as usize == i && lens[i] == len);
        if !exact {
            return Err(format!("message {} does not match push offer {offer}", data.seq));
        }
        self.offers.made.remove(&offer);
        Ok(Some(offer))
    }

    /// Listener: after a pushed message of `layout` was delivered, an offer of the same
    /// shape is wanted (when offers are on, fewer than two are outstanding and it is
    /// small enough).
    pub(super) fn want_offer(&mut self, layout: Option<Vec<u64>>, now: Instant) {
        let Some(lens) = layout else { return };
        let total: u64 = lens.iter().sum();
        if self.push != PushRole::Target
            || total == 0
            || total > self.settings.push_offer_max_bytes
            || self.offers.made.len() >= MAX_OFFERS_MADE
            || self.offers.paused
        {
            return;
        }
        self.offers.wanted = Some((lens, now));
    }

    /// Listener: makes the wanted offer now (`eager`: a send just went out and the offer
    /// rides behind it) or once it waited `OFFER_IDLE_DELAY` for one.
    pub(super) fn make_offer(&mut self, eager: bool, now: Instant, lane: &mut dyn CoreLane<P>) {
        if eager {
            self.offers.eager = false;
        }
        match &self.offers.wanted {
            Some((_, since)) if eager || now.saturating_duration_since(*since) >= OFFER_IDLE_DELAY => {}
            _ => return,
        }
        let (lens, _) = self.offers.wanted.take().expect("checked");
        let offer = self.offers.peek_offer_id();
        match lane.make_offer(offer, &lens) {
            Some(targets) => {
                self.offers.consume_offer_id();
                self.offers.made.insert(offer, lens);
                self.transmit(WireMessage::PushOffer { offer, targets, for_seq: None });
                self.out.push_back(Output::Flush);
            }
            // Only a missed shortcut: the next message takes the PushTargets path.
            None => tracing::debug!("no push offer"),
        }
    }
}

/// `(offer, index, len)` of each of `data`'s frames that fills a receive offer
/// (`FrameDescriptor::DeviceOffered`), in order.
pub(super) fn offered_frames(data: &DataMessage) -> Vec<(u64, u32, u64)> {
    data.frames
        .iter()
        .filter_map(|f| match f {
            FrameDescriptor::DeviceOffered { offer, index, len, .. } => Some((*offer, *index, *len)),
            _ => None,
        })
        .collect()
}
