//! Receives whose handles were dropped or whose waiters gave up: withdrawing one (posted,
//! or with its message still landing) and taking back a message that completed into one,
//! so that no message is lost and receives keep getting messages in the order they were
//! posted.

use crate::connection::lane::CoreLane;
use crate::connection::state::recv::{recv_error, Awaits, InLanding, PostedRecv};
use crate::connection::{Connection, Output};
use crate::error::TransportError;
use crate::payload::Payload;
use std::time::Instant;

impl<P: Payload> Connection<P> {
    /// The waiter of receive `id` gave up while its message is landing: the receive gives
    /// the message up as a withdrawn one does (it goes to the next receive once landed)
    /// and ends with `error` now, not when the landing ends, which a stalled peer may
    /// never let happen. Not when the message lands in the receive's own buffers (they
    /// cannot be handed back while the lane fills them). Whether it ended.
    pub(in crate::connection) fn cancel_landing_recv(&mut self, id: u64, error: &TransportError) -> bool {
        let landing_unbuffered = self.recv.landings.iter().any(|l| l.claim == Some(id) && !l.with_buffers);
        if !landing_unbuffered || !self.withdraw_recv(id) {
            return false;
        }
        self.out.push_back(Output::RecvDone { id, result: Err(recv_error(error.clone(), None)) });
        true
    }

    /// Withdraws receive `id`: a posted one goes (its buffers dropped). One whose message
    /// is still landing gives the message up, and so does every later receive whose
    /// message is landing: those messages land unclaimed and those receives are posted
    /// again, in order, so each message still goes to the receives in the order they were
    /// posted (m1 to the next receive, m2 to the one after; otherwise a later receive
    /// would get a later message first). Not when a later landing fills a `recv_into`'s
    /// own buffers (they cannot be given back): then `id` is not withdrawn and its
    /// message comes back when it completed ([`Connection::return_undelivered`]).
    /// Either way, when receives posted after `id` already got later messages (a landing
    /// completes out of turn: a push, a UCX transfer), the given-up message reaches the
    /// next receive after them: it cannot go back in time. With one receive outstanding
    /// at a time (the `select!` pattern) the order always holds. Whether it was withdrawn.
    pub(in crate::connection) fn withdraw_recv(&mut self, id: u64) -> bool {
        if let Some(i) = self.recv.posted.iter().position(|r| r.id == id) {
            drop(self.recv.posted.remove(i));
            return true;
        }
        let Some(start) = self.recv.landings.iter().position(|l| l.claim == Some(id)) else { return false };
        let later = self.recv.landings.iter().skip(start + 1).filter(|l| l.claim.is_some());
        if later.clone().any(|l| l.with_buffers) {
            return false;
        }
        let mut reposted = Vec::new();
        for landing in self.recv.landings.iter_mut().skip(start) {
            let Some(claim) = landing.claim.take() else { continue };
            // Counted as unclaimed from now on, as if it had started landing so.
            self.recv.landed_bytes += landing.payload as usize;
            if claim != id {
                reposted.push(PostedRecv { id: claim, into: None, on: landing.on.take() });
            }
        }
        for r in reposted.into_iter().rev() {
            self.recv.posted.push_front(r);
        }
        // Messages that landed unclaimed while the given-up one was landing came after it:
        // they wait behind it (those that came back from dropped receives stay in front).
        let returned = self.recv.returned.len().min(self.recv.landed.len());
        for message in self.recv.landed.drain(returned..).collect::<Vec<_>>() {
            let payload = P::payload_len(&message) as u64;
            let (claim, on, done) = (None, None, Some(message));
            self.recv.landings.push_back(InLanding {
                // Delivered in queue order, never looked up by sequence number.
                seq: None,
                claim,
                with_buffers: false,
                on,
                payload,
                awaits: Awaits::Done,
                peer_since: None,
                done,
            });
        }
        true
    }

    /// `message` went to receive `id`, whose handle went without taking it: it goes back
    /// to the front of the undelivered messages, behind those that came back from
    /// earlier receives and ahead of the rest (receives get messages in order, so this
    /// is the order they came in), and to the next receive.
    pub fn return_undelivered(&mut self, id: u64, message: P::Message, now: Instant, lane: &mut dyn CoreLane<P>) {
        if let Some(seq) = self.recv.acks.iter().find(|a| a.claim == Some(id) && a.result.is_none()).map(|a| a.seq) {
            // The next receive may name no stream: the copies must be done first.
            if let Err(f) = lane.wait_copies(seq) {
                return self.fail_peer(format!("waiting for the copies of message {seq}: {}", f.reason), lane);
            }
            self.copies_done(seq);
        }
        let at = self.recv.returned.partition_point(|&earlier| earlier < id);
        self.recv.returned.insert(at, id);
        self.recv.landed_bytes += P::payload_len(&message);
        self.recv.landed.insert(at, message);
        self.match_posted(now, lane);
    }

    /// Whether receive `id` is posted and has taken no message yet (tests).
    #[cfg(test)]
    pub fn is_posted(&self, id: u64) -> bool {
        self.recv.posted.iter().any(|r| r.id == id)
    }
}
