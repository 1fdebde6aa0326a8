//! [`Endpoint`]: one connection to a peer, and what it counts.

use crate::command::{Command, EndpointShared};
use crate::error::{RecvError, SendError, TransportError};
use crate::inner::ContextInner;
use crate::negotiate::Lane;
use crate::peer::PeerInfo;
use crate::request::{RecvRequest, SendRequest, Slot};
use crate::stats::EndpointStats;
use ferrylink_memory::{Frame, Message};
use std::sync::Arc;

/// A connection to one peer. Sends and receives are ordered; many may be in flight.
/// Dropping the endpoint closes it (pending requests end with `EndpointClosed`).
pub struct Endpoint {
    pub(crate) shared: Arc<EndpointShared>,
    pub(crate) ctx: Arc<ContextInner>,
}

impl Endpoint {
    /// Sends a message. The request completes when the peer has the data; `wait()` then
    /// hands the message back so its buffers can be reused.
    pub fn send(&self, message: Message) -> SendRequest {
        tracing::trace!("send called");
        let slot = Slot::new();
        let id = self.ctx.next_request_id();
        let producer = self.ctx.device.mark_producers_on_caller_thread(&message, self.shared.copies_locally);
        let cmd = Command::Send { ep: self.shared.id, id, message, slot: slot.clone(), producer };
        if let Err(Command::Send { message, .. }) = self.ctx.submit(cmd) {
            slot.complete(Err(SendError { error: TransportError::ContextClosed, message: Some(message) }));
        }
        tracing::trace!("send submitted");
        SendRequest::new(slot, self.ctx.config.request_timeout, self.ctx.config.busy_poll, self.canceller(id))
    }

    /// Receives the next message into buffers of the transport's choosing.
    pub fn recv(&self) -> RecvRequest {
        self.post_recv(None)
    }

    /// Receives the next message into `buffers`, which must match its frames one for one
    /// (same kind, same length); a mismatch fails the receive and hands them back.
    pub fn recv_into(&self, buffers: Vec<Frame>) -> RecvRequest {
        self.post_recv(Some(buffers))
    }

    fn post_recv(&self, into: Option<Vec<Frame>>) -> RecvRequest {
        let slot = Slot::new();
        let id = self.ctx.next_request_id();
        tracing::trace!("receive posted");
        let cmd = Command::Recv { ep: self.shared.id, id, into, slot: slot.clone() };
        if let Err(Command::Recv { into, .. }) = self.ctx.submit(cmd) {
            slot.complete(Err(RecvError { error: TransportError::ContextClosed, buffers: into }));
        }
        RecvRequest::new(slot, self.ctx.config.request_timeout, self.ctx.config.busy_poll, self.canceller(id))
    }

    fn canceller(&self, id: u64) -> Box<dyn Fn() + Send + Sync> {
        let ctx = self.ctx.clone();
        let ep = self.shared.id;
        Box::new(move || {
            let _ = ctx.submit(Command::Cancel { ep, id });
        })
    }

    /// The lane this endpoint uses.
    pub fn lane(&self) -> Lane {
        self.shared.lane
    }

    /// Whether this endpoint's control messages travel through shared-memory rings
    /// rather than its Unix socket (both sides support them and neither turned them off
    /// with `FERRYLINK_CONTROL_RING_BYTES=0`).
    pub fn uses_control_ring(&self) -> bool {
        self.shared.control_ring
    }

    /// The peer.
    pub fn peer(&self) -> &PeerInfo {
        &self.shared.peer
    }

    /// This endpoint's counters.
    pub fn stats(&self) -> EndpointStats {
        self.shared.counters.snapshot()
    }

    /// Closes the endpoint (the same as dropping it).
    pub fn close(self) {}
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let _ = self.ctx.submit(Command::Close { ep: self.shared.id });
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("lane", &self.shared.lane)
            .field("peer", &self.shared.peer.to_string())
            .finish()
    }
}
