//! [`Offers`]: the push offers of one connection, made, held and bound to sends.

use crate::payload::Payload;
use crate::wire::DeviceFrameDescriptor;
use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

/// Offers a listener has outstanding at most.
pub(in crate::connection) const MAX_OFFERS_MADE: usize = 2;

/// Offers of allocated buffers a connector holds at most (more than a listener makes is
/// a lie).
pub(in crate::connection) const MAX_OFFERS_HELD: usize = MAX_OFFERS_MADE;

/// A send copied into an offer, waiting for its copies.
pub(in crate::connection) struct OfferedSend<P: Payload> {
    pub(in crate::connection) id: u64,
    pub(in crate::connection) seq: u64,
    pub(in crate::connection) message: P::Message,
}

/// Connector side: a posted receive's buffers, offered for message `seq` only.
pub(in crate::connection) struct HeldForSeq {
    pub(in crate::connection) offer: u64,
    pub(in crate::connection) targets: Vec<DeviceFrameDescriptor>,
    pub(in crate::connection) seq: u64,
}

/// Listener side: the receive offer outstanding (the receive itself waits in the
/// landings, claiming message `seq`).
pub(in crate::connection) struct BoundOffer {
    pub(in crate::connection) offer: u64,
    pub(in crate::connection) seq: u64,
    pub(in crate::connection) lens: Vec<u64>,
    /// When `WithdrawOffer` went out (the receive ended first): the connector must answer.
    pub(in crate::connection) withdrawn_at: Option<Instant>,
    /// The error the receive ends with when the buffers come back unused.
    pub(in crate::connection) cancelled: Option<crate::error::TransportError>,
}

/// Both sides' offer state of one connection.
pub(in crate::connection) struct Offers<P: Payload> {
    // Connector side.
    /// Offers of allocated buffers received, oldest first: (id, targets).
    pub(in crate::connection) held: VecDeque<(u64, Vec<DeviceFrameDescriptor>)>,
    /// The receive offer held.
    pub(in crate::connection) held_for_seq: Option<HeldForSeq>,
    /// The highest offer id received (ids increase, across both kinds).
    pub(in crate::connection) last_held: Option<u64>,
    /// Sends whose copies into offers run, in order.
    pub(in crate::connection) sending: VecDeque<OfferedSend<P>>,
    // Listener side.
    /// Offers made and not yet used or declined: id → the offered buffers' lengths.
    pub(in crate::connection) made: BTreeMap<u64, Vec<u64>>,
    pub(in crate::connection) next_id: u64,
    /// Frame lengths of the next offer to make, and since when it is wanted.
    pub(in crate::connection) wanted: Option<(Vec<u64>, Instant)>,
    /// A send just went out: make the wanted offer once it is written.
    pub(in crate::connection) eager: bool,
    /// No offers while the receiver copies landed device frames into `recv_into`
    /// buffers (an offered frame would cost it such a copy); a plain receive of a pushed
    /// message resumes them.
    pub(in crate::connection) paused: bool,
    /// The receive offer outstanding.
    pub(in crate::connection) bound: Option<BoundOffer>,
    /// The posted receive the lane cannot offer (or whose offer was declined).
    pub(in crate::connection) not_offerable: Option<u64>,
    /// The lane said "not yet" to offering the front receive: ask again next turn.
    pub(in crate::connection) receive_offer_pending: bool,
    /// The first posted receive may be offered: done after the outputs went out
    /// (`Connection::after_flush`), so a delivery is not held up by the next offer.
    pub(in crate::connection) receive_offer_wanted: bool,
}

impl<P: Payload> Default for Offers<P> {
    fn default() -> Self {
        Self {
            held: Default::default(),
            held_for_seq: Default::default(),
            last_held: Default::default(),
            sending: Default::default(),
            made: Default::default(),
            next_id: Default::default(),
            wanted: Default::default(),
            eager: Default::default(),
            paused: Default::default(),
            bound: Default::default(),
            not_offerable: Default::default(),
            receive_offer_pending: Default::default(),
            receive_offer_wanted: Default::default(),
        }
    }
}

impl<P: Payload> Offers<P> {
    /// Stops making offers; a wanted one is dropped.
    pub fn pause(&mut self) {
        self.paused = true;
        self.wanted = None;
    }

    /// Makes offers again.
    pub fn resume(&mut self) {
        self.paused = false;
    }

    /// Forgets everything but the id counter (the connection ended).
    pub fn clear(&mut self) {
        *self = Offers { next_id: self.next_id, ..Offers::default() };
    }

    /// Whether copies into offers are still running.
    pub fn sends_pending(&self) -> bool {
        !self.sending.is_empty()
    }

    /// The id the next offer gets (listener side).
    pub fn peek_offer_id(&self) -> u64 {
        self.next_id
    }

    /// The id [`Offers::peek_offer_id`] answered is taken (listener side).
    pub fn consume_offer_id(&mut self) {
        self.next_id += 1;
    }

    /// A send went out: a wanted offer is made right after it was written.
    pub fn make_eagerly(&mut self) {
        self.eager = true;
    }

    /// Whether an offer is to be made now, right after a send was written; the flag
    /// holds for that one write only.
    pub fn take_eager_offer(&mut self) -> bool {
        std::mem::take(&mut self.eager) && self.wanted.is_some()
    }

    pub fn start_offered_send(&mut self, id: u64, seq: u64, message: P::Message) {
        self.sending.push_back(OfferedSend { id, seq, message });
    }

    /// The request and message of offered send `seq`, which finished.
    pub fn finish_offered_send(&mut self, seq: u64) -> Option<(u64, P::Message)> {
        let i = self.sending.iter().position(|s| s.seq == seq)?;
        self.sending.remove(i).map(|s| (s.id, s.message))
    }

    /// Every offered send still copying: (seq, request, message).
    pub fn take_offered_sends(&mut self) -> Vec<(u64, u64, P::Message)> {
        self.sending.drain(..).map(|s| (s.seq, s.id, s.message)).collect()
    }
}
