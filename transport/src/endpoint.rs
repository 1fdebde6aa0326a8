//! [`Endpoint`]: one connection to a peer, and what it counts.

use crate::command::{Command, PostedRecvCommand};
use crate::endpoint_shared::EndpointShared;
use crate::error::{RecvError, SendError, TransportError};
use crate::inner::ContextInner;
use crate::request::{Link, RecvRequest, SendRequest};
use crate::slot::Slot;
use ferrylink_memory::cudarc::driver::{sys::CUstream, CudaStream};
use ferrylink_memory::{Frame, Message, ProducerStream};
use ferrylink_proto::lane_kind::LaneKind;
use ferrylink_proto::peer::PeerInfo;
use ferrylink_proto::stats::EndpointStats;
use std::sync::Arc;
use std::time::Instant;

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
            let closed = SendError::new(TransportError::ContextClosed, Some(message));
            let _fresh_slot_takes_it = slot.complete(Err(closed));
        }
        tracing::trace!("send submitted");
        SendRequest::new(slot, self.ctx.config.request_timeout, self.ctx.config.busy_poll, self.link(id))
    }

    /// Receives the next message into buffers of the transport's choosing.
    pub fn recv(&self) -> RecvRequest {
        self.post_recv(None, None)
    }

    /// Receives the next message into `buffers`, which must match its frames one for one
    /// (same kind, same length); a mismatch fails the receive and hands them back.
    ///
    /// A device buffer that names its producer stream (every cudarc slice does;
    /// [`ferrylink_memory::DeviceBuffer::produced_on`]) is written only after the work
    /// queued on that stream before the receive (a kernel still reading or writing it, its
    /// stream-ordered allocation): this process's copies wait for it on the GPU; when the
    /// peer or UCX writes it, the progress thread waits for it on the host first, so
    /// other connections of the context wait too while that work runs.
    pub fn recv_into(&self, buffers: Vec<Frame>) -> RecvRequest {
        self.post_recv(Some(buffers), None)
    }

    /// Receives the next message for a GPU pipeline on `stream`: when this process runs
    /// the copies that land the message's device frames (pulling what the peer sends),
    /// they are enqueued, `stream` is made to wait for them on the GPU, and the request
    /// completes at once, without a host wait. Work enqueued on `stream` after the request
    /// completed sees the bytes; the host, or another stream, must first synchronise with
    /// `stream` (e.g. an event recorded on it). The peer gets its buffers back only once
    /// the copies completed. Every device frame delivered names `stream` as its producer
    /// stream ([`ferrylink_memory::DeviceBuffer::produced_on`]), so a later send of it is
    /// ordered after the work enqueued there. A message whose bytes were complete on
    /// arrival (pushed by the peer, or landed before this receive) is delivered as by
    /// [`Endpoint::recv`]. `stream` must belong to its device's primary context (as
    /// cudarc's streams do).
    pub fn recv_on(&self, stream: &Arc<CudaStream>) -> RecvRequest {
        self.post_recv(None, Some(ProducerStream::Cudarc(stream.clone())))
    }

    /// [`Endpoint::recv_on`] for a raw `CUstream`.
    ///
    /// # Safety
    /// `stream` must be a stream of the primary context of the device the frames land on
    /// (or null, the legacy default stream), alive until the request completed and, as
    /// the delivered frames name it as their producer stream, until every send of them
    /// completed (if the request's handle goes before it completes, its message may go
    /// to the next receive still naming `stream`).
    pub unsafe fn recv_on_raw(&self, stream: CUstream) -> RecvRequest {
        // SAFETY: the caller's contract is `ProducerStream::from_raw`'s.
        let on = unsafe { ProducerStream::from_raw(stream) };
        self.post_recv(None, Some(on))
    }

    /// [`Endpoint::recv_into`] for a GPU pipeline on `stream`: see [`Endpoint::recv_on`].
    pub fn recv_into_on(&self, buffers: Vec<Frame>, stream: &Arc<CudaStream>) -> RecvRequest {
        self.post_recv(Some(buffers), Some(ProducerStream::Cudarc(stream.clone())))
    }

    /// [`Endpoint::recv_into_on`] for a raw `CUstream`.
    ///
    /// # Safety
    /// As for [`Endpoint::recv_on_raw`].
    pub unsafe fn recv_into_on_raw(&self, buffers: Vec<Frame>, stream: CUstream) -> RecvRequest {
        // SAFETY: the caller's contract is `ProducerStream::from_raw`'s.
        let on = unsafe { ProducerStream::from_raw(stream) };
        self.post_recv(Some(buffers), Some(on))
    }

    fn post_recv(&self, into: Option<Vec<Frame>>, on: Option<ProducerStream>) -> RecvRequest {
        let mut target_marks = None;
        if let (true, Some(targets)) = (self.shared.receives_pushes, &into) {
            target_marks = self.ctx.device.prepare_receive_targets(targets);
        }
        let slot = Slot::new();
        let id = self.ctx.next_request_id();
        tracing::trace!("receive posted");
        let posted = PostedRecvCommand { into, on, target_marks };
        let cmd = Command::Recv { ep: self.shared.id, id, posted, slot: slot.clone() };
        if let Err(Command::Recv { posted: PostedRecvCommand { into, .. }, .. }) = self.ctx.submit(cmd) {
            let closed = RecvError::new(TransportError::ContextClosed, into);
            let _fresh_slot_takes_it = slot.complete(Err(closed));
        }
        RecvRequest::new(slot, self.ctx.config.request_timeout, self.ctx.config.busy_poll, self.link(id))
    }

    pub(crate) fn link(&self, id: u64) -> Box<RequestLink> {
        Box::new(RequestLink { ctx: self.ctx.clone(), ep: self.shared.id, id })
    }

    /// The lane this endpoint uses.
    pub fn lane(&self) -> LaneKind {
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

/// How a request of an endpoint reaches its connection: commands to the progress
/// thread. When the thread is gone, nothing needs doing (it ended every request).
pub(crate) struct RequestLink {
    pub(crate) ctx: Arc<ContextInner>,
    pub(crate) ep: usize,
    pub(crate) id: u64,
}

impl RequestLink {
    pub(crate) fn submit(&self, cmd: Command) {
        let _thread_gone = self.ctx.submit(cmd);
    }
}

impl Link<Result<Message, SendError>> for RequestLink {
    fn cancel(&self) {
        self.submit(Command::Cancel { ep: self.ep, id: self.id });
    }
    fn withdraw(&self) {
        self.submit(Command::Withdraw { ep: self.ep, id: self.id });
    }
    /// A send that completed into a dropped handle: the message is dropped here, its
    /// buffers freed.
    fn unclaimed(&self, _result: Result<Message, SendError>) {}
    fn expire_at(&self, at: Instant) {
        self.submit(Command::Expire { ep: self.ep, id: self.id, at });
    }
}

impl Link<Result<Message, RecvError>> for RequestLink {
    fn cancel(&self) {
        self.submit(Command::Cancel { ep: self.ep, id: self.id });
    }
    fn withdraw(&self) {
        self.submit(Command::Withdraw { ep: self.ep, id: self.id });
    }
    /// A message nobody took goes back to the endpoint; an error (and the buffers it
    /// hands back) is dropped.
    fn unclaimed(&self, result: Result<Message, RecvError>) {
        if let Ok(message) = result {
            self.submit(Command::Undelivered { ep: self.ep, id: self.id, message });
        }
    }
    fn expire_at(&self, at: Instant) {
        self.submit(Command::Expire { ep: self.ep, id: self.id, at });
    }
}
