//! What a side lent its peer outlives a connection this side ends.
//!
//! The connector copies into the buffers the listener offered (a receive's own, or
//! buffers the lane allocated) whenever it sends, and the side that copies reads the
//! other's messages out of its memory until it acknowledges them. Such a copy may be
//! enqueued, or running on the GPU, when this side ends the connection (its user closes
//! the endpoint, the context shuts down, a deadline or a protocol error). Handing those
//! buffers and messages back then (to the receive that lent them, the pool, the sender)
//! would let a late copy write into memory that is the user's again, or another
//! message's, and would let the user free a stream-ordered allocation the peer still has
//! imported, which CUDA forbids.
//!
//! So when the peer may still copy, the connection ends with its socket's writing half
//! closed ([`Output::ClosedAwaitingHangup`]) and what it lent held: the peer reads EOF,
//! ends its side, and its lane's close waits for its copies and lets go of its imports
//! before its socket closes. The EOF that follows here ([`Connection::peer_closed`])
//! releases everything: the receive's buffers come back with its error, the lane's own
//! are dropped, the sends' messages come back with theirs. A peer that never hangs up is
//! waited for one request timeout. When the peer ended the connection itself (its
//! `Goodbye` or its EOF), its copies are over already and nothing is held.

use crate::connection::lane::CoreLane;
use crate::connection::recv::Awaits;
use crate::connection::{Connection, Output};
use crate::error::TransportError;
use crate::payload::Payload;
use std::time::Instant;

use crate::connection::state::hangup::HeldForHangup;

impl<P: Payload> Connection<P> {
    /// `fail`: the receive offer's buffers, back from the lane. Given back now (returned)
    /// unless the peer may still copy into or out of what this side lent it: then they,
    /// the lane's lent buffers and the described sends are held until the peer hangs up
    /// (`None`).
    pub(in crate::connection) fn lent_buffers_at_end(
        &mut self,
        error: &TransportError,
        lane: &mut dyn CoreLane<P>,
    ) -> Option<(u64, Vec<P::Frame>)> {
        let lent = self.take_back_lent_buffers(lane);
        let peer_ended = matches!(error, TransportError::PeerClosed { .. });
        let lent_anything = lent.is_some() || lane.has_lent_buffers() || self.send.described_count() > 0;
        if peer_ended || !lent_anything {
            return lent;
        }
        lane.hold_lent_buffers();
        tracing::debug!(peer = %self.peer, "buffers lent to the peer are held until it hangs up");
        self.held_for_hangup = Some(HeldForHangup { lent, error: error.clone(), deadline: None, deferred: Vec::new() });
        None
    }

    /// Whether the connection waits for its peer to hang up before it lets go of what
    /// it lent.
    pub fn awaits_hangup(&self) -> bool {
        self.held_for_hangup.is_some()
    }

    /// The peer hung up (or will not be waited for longer): the lent buffers and the
    /// messages it could read go back.
    pub(in crate::connection) fn release_held(&mut self, lane: &mut dyn CoreLane<P>) {
        let Some(held) = self.held_for_hangup.take() else { return };
        lane.release_lent_buffers();
        self.out.extend(held.deferred);
        if let Some((offer, buffers)) = held.lent {
            let at = self.recv.landings.iter().position(|l| l.awaits == Awaits::Offer { offer });
            match at.map(|at| self.recv.landings.remove(at)) {
                Some(Some(landing)) if landing.claim.is_some() => {
                    let id = landing.claim.expect("checked");
                    let error = crate::error::RecvError { error: held.error, buffers: Some(buffers) };
                    self.out.push_back(Output::RecvDone { id, result: Err(error) });
                }
                // Nobody waits for them any more: they are dropped, the peer being done.
                _ => drop(buffers),
            }
        }
        self.out.push_back(Output::Closed);
    }

    /// A dead connection's timeout check: a peer that has not hung up within the request
    /// timeout is not waited for longer.
    pub(in crate::connection) fn hangup_overdue(&mut self, now: Instant, lane: &mut dyn CoreLane<P>) {
        let timeout = self.settings.request_timeout;
        let Some(held) = &mut self.held_for_hangup else { return };
        let deadline = *held.deadline.get_or_insert(now + timeout);
        if now >= deadline {
            tracing::warn!(peer = %self.peer, "the peer did not hang up within {timeout:?}: lent buffers released");
            self.release_held(lane);
        }
    }
}
