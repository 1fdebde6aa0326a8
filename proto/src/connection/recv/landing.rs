//! Landing one message a receive (or the unclaimed budget) took: through the lane, into
//! the receive's buffers or fresh memory, delivered at once or once the lane's copies or
//! the peer's push are done.

use crate::connection::lane::{CoreLane, Landing};
use crate::connection::offers::device_layout;
use crate::connection::state::recv::{check_targets, recv_error, Awaits, InLanding, PendingAck, PostedRecv};
use crate::connection::{Connection, Output};
use crate::error::TransportError;
use crate::payload::Payload;
use crate::wire::{AckResult, DataMessage, WireMessage};
use std::time::Instant;

impl<P: Payload> Connection<P> {
    /// Lands one message (for `recv`, when a receive took it); `false` when the
    /// connection failed.
    pub(super) fn land_one(
        &mut self,
        data: DataMessage,
        recv: Option<PostedRecv<P>>,
        payload: u64,
        now: Instant,
        lane: &mut dyn CoreLane<P>,
    ) -> bool {
        // Connector-copies mode: a message the connector already copied into our offer.
        let offer = match self.take_offered(&data) {
            Ok(offer) => offer,
            Err(reason) => {
                if let Some(r) = recv {
                    self.recv.posted.push_front(r);
                }
                self.protocol_error_with(&reason, lane);
                return false;
            }
        };
        let (recv, offer_again) = self.claim_for_landing(&data, recv, offer.is_some());
        let (claim, into, on) = match recv {
            Some(PostedRecv { id, into, on }) => (Some(id), into, on),
            None => (None, None, None),
        };
        let into_callers_buffers = into.is_some();
        let started = now;
        let landing = lane.land(&data, into, offer, on.as_ref());
        tracing::trace!(seq = data.seq, ?started, "message landing started");
        let seq = data.seq;
        match landing {
            Landing::Done(message) => {
                if offer.is_none() {
                    self.ack(seq, AckResult::Delivered);
                }
                self.landed_whole(seq, message, claim, payload, (offer, offer_again), now)
            }
            Landing::DoneCopying(message) => {
                // Delivered now; acknowledged once the copies completed (`CopiesDone`).
                self.recv.acks.push_back(PendingAck { seq, claim, result: None });
                self.landed_whole(seq, message, claim, payload, (offer, offer_again), now)
            }
            Landing::AwaitsPush { targets, regions } => {
                self.transmit_regions(regions);
                self.transmit(WireMessage::PushTargets { seq, targets });
                let claimed = claim.map(|id| (id, into_callers_buffers, on));
                self.start_landing(seq, claimed, payload, Awaits::Push { into_callers_buffers }, now);
            }
            Landing::InProgress => {
                let claimed = claim.map(|id| (id, into_callers_buffers, on));
                self.start_landing(seq, claimed, payload, Awaits::Lane, now)
            }
            Landing::Refused { reason, into } if offer.is_some() => {
                // Its sender expects no answer, so it could not be told of a refusal.
                if let Some(id) = claim {
                    self.recv.posted.push_front(PostedRecv { id, into, on });
                }
                self.fail_peer(format!("offered message {seq} could not land: {reason}"), lane);
                return false;
            }
            Landing::Refused { reason, into } => {
                tracing::warn!("refusing message {seq} from {}: {reason}", self.peer);
                self.ack(seq, AckResult::Refused(reason));
                // The receive got nothing: it waits for the next message.
                if let Some(id) = claim {
                    self.recv.posted.push_front(PostedRecv { id, into, on });
                }
            }
            Landing::Failed(f) => {
                if let Some(id) = claim {
                    let error = TransportError::PeerFailed { peer: self.peer.clone(), reason: f.reason.clone() };
                    self.out.push_back(Output::RecvDone { id, result: Err(recv_error(error, None)) });
                }
                if f.peer_at_fault {
                    self.protocol_error_with(&f.reason, lane);
                } else {
                    self.fail_peer(f.reason, lane);
                }
                return false;
            }
        }
        true
    }

    /// Who takes a message about to land, and into what: the receive (unless an offered
    /// message would cost it a copy: it lands as it is and `pair_landed` copies it into
    /// the caller's buffers; no offer follows then), its `recv_into` buffers when they fit
    /// the descriptors (else that receive fails, buffers back, and the message lands in
    /// fresh memory for the next one). Whether an offer may follow.
    fn claim_for_landing(
        &mut self,
        data: &DataMessage,
        recv: Option<PostedRecv<P>>,
        offered: bool,
    ) -> (Option<PostedRecv<P>>, bool) {
        let mut offer_again = true;
        let recv = match recv {
            Some(r) if offered && r.into.is_some() => {
                self.recv.posted.push_front(r);
                offer_again = false;
                None
            }
            other => other,
        };
        let Some(PostedRecv { id, into: Some(buffers), on }) = recv else { return (recv, offer_again) };
        match check_targets::<P>(&data.frames, &buffers) {
            Ok(()) => (Some(PostedRecv { id, into: Some(buffers), on }), offer_again),
            Err(reason) => {
                let error = TransportError::BufferMismatch(reason);
                self.out.push_back(Output::RecvDone { id, result: Err(recv_error(error, Some(buffers))) });
                (None, offer_again)
            }
        }
    }

    /// A message landed whole (its acknowledgement sent or held by the caller): delivered
    /// in order, and an offer of its shape wanted.
    fn landed_whole(
        &mut self,
        seq: u64,
        message: P::Message,
        claim: Option<u64>,
        payload: u64,
        (offer, offer_again): (Option<u64>, bool),
        now: Instant,
    ) {
        let layout = if offer.is_some() && offer_again { device_layout::<P>(&message) } else { None };
        if offer.is_some() && claim.is_some() {
            self.offers.resume();
        }
        if claim.is_none() && self.recv.landings.iter().any(|l| l.claim.is_none()) {
            // An unclaimed message ahead is still landing: a receive must not take this
            // one first.
            self.recv.landed_bytes += P::payload_len(&message);
            let landing = InLanding {
                seq: Some(seq),
                claim,
                with_buffers: false,
                on: None,
                payload,
                awaits: Awaits::Done,
                peer_since: None,
                done: Some(message),
            };
            self.recv.landings.push_back(landing);
        } else {
            self.deliver(claim, message, true);
        }
        self.want_offer(layout, now);
    }

    /// `claimed`: the receive that took it, whether into its own buffers, its stream;
    /// `now`: when the peer's part (`awaits`) began.
    fn start_landing(
        &mut self,
        seq: u64,
        claimed: Option<(u64, bool, Option<P::Stream>)>,
        payload: u64,
        awaits: Awaits,
        now: Instant,
    ) {
        if claimed.is_none() {
            self.recv.landed_bytes += payload as usize;
        }
        let (claim, with_buffers, on) = match claimed {
            Some((id, with_buffers, on)) => (Some(id), with_buffers, on),
            None => (None, false, None),
        };
        self.recv.landings.push_back(InLanding {
            seq: Some(seq),
            claim,
            with_buffers,
            on,
            payload,
            awaits,
            peer_since: Some(now),
            done: None,
        });
    }
}
