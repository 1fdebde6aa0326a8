//! One connection as the progress thread drives it: its control channel, its protocol
//! core, its lane, and the request slots the core's completions go to.

use super::channel::{ControlChannel, Source};
use super::lane::{open_lane, LaneContext};
use super::requests::{RecvSlot, Requests, SendSlot};
use super::spans;
use crate::accept_queue::AcceptQueue;
use crate::command::RawStream;
use crate::command::{ConnectSlot, PostedRecvCommand};
use crate::config::Config;
use crate::device::ProducerMarks;
use crate::endpoint_shared::EndpointShared;
use crate::error::TransportError;
use crate::lanes::Lane;
use crate::payload::{Connection, LaneEvent, MemoryPayload, Output};
use ferrylink_ipc::control_ring::ControlRingMemory;
use ferrylink_memory::Message;
use ferrylink_proto::connection::lane::{CoreLane, NoLane};
use ferrylink_proto::connection::{Phase, PushRole, Role};
use ferrylink_proto::stats::ContextStats;
use ferrylink_proto::wire::{Hello, Limits, WireMessage};
use mio::{Registry, Token};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Span;

/// How long a context that shuts down waits for a peer to hang up when that peer may
/// still copy into buffers it was lent (`connection/recv/hangup.rs`).
const HANGUP_AT_SHUTDOWN: Duration = Duration::from_secs(2);

/// Who waits for this connection's endpoint.
pub(super) enum Waiter {
    /// A `connect` call (blocking or a future), answered once.
    Connector(Option<ConnectSlot>),
    /// A listener's queue of accepted endpoints.
    Acceptor(Arc<AcceptQueue>),
}

/// A connection on the progress thread.
pub(super) struct ConnDriver {
    id: usize,
    channel: ControlChannel,
    core: Connection,
    lane: Option<Box<dyn Lane>>,
    shared: Option<Arc<EndpointShared>>,
    waiter: Waiter,
    /// The control rings: offered (connector) or mapped from the `Hello` (acceptor),
    /// until both sides use them.
    ring: Option<Arc<ControlRingMemory>>,
    /// The control rings in use (for the lane's gate words, once it is open).
    ring_in_use: Option<Arc<ControlRingMemory>>,
    requests: Requests,
    limits: Limits,
    control_ring_bytes: usize,
    /// The bound of a request awaited as a future (`request_timeout`).
    request_timeout: Duration,
    /// Entered whenever the progress thread handles this connection ([`Self::in_span`]).
    span: Span,
}

impl ConnDriver {
    /// A connection whose handshake starts; a connecting side writes its `Hello`
    /// (offering `ring`, whose descriptor goes along) at once.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: usize,
        raw: RawStream,
        waiter: Waiter,
        peer: String,
        local: Hello,
        ring: Option<(Arc<ControlRingMemory>, OwnedFd)>,
        config: &Config,
        registry: &Registry,
    ) -> std::io::Result<Self> {
        let role = match waiter {
            Waiter::Connector(_) => Role::Connector { ring_offered: ring.is_some() },
            Waiter::Acceptor(_) => Role::Acceptor,
        };
        let span = spans::connection_span(id, &peer);
        let _in_connection = span.clone().entered();
        let core = Connection::new(config.core_settings(), role, local, peer, Instant::now());
        let channel = ControlChannel::new(raw, registry, Token(id), core.counters().clone())?;
        let mut conn = Self {
            id,
            channel,
            core,
            lane: None,
            shared: None,
            waiter,
            ring: None,
            ring_in_use: None,
            requests: Requests::default(),
            limits: config.wire_limits(),
            control_ring_bytes: config.control_ring_bytes,
            request_timeout: config.request_timeout,
            span,
        };
        if let Role::Connector { .. } = role {
            let mut hello = conn.core.hello().clone();
            let mut fds = Vec::new();
            if let Some((memory, fd)) = ring {
                hello.control_ring = Some(memory.ring_bytes() as u64);
                fds.push(fd);
                conn.ring = Some(memory);
            }
            conn.channel.queue(&WireMessage::Hello(hello), fds);
            if let Err(reason) = conn.channel.flush(true) {
                tracing::debug!("writing the Hello failed: {reason}");
            }
        }
        Ok(conn)
    }

    /// Runs `f` on this connection inside its span, so the events of the work it does
    /// carry the connection's fields. A disabled span (no subscriber wants it) is cloned,
    /// entered and left without a call into tracing.
    pub(super) fn in_span<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        let _in_connection = self.span.clone().entered();
        f(self)
    }

    /// The request slots (for the one-sided requests, `onesided.rs`).
    pub(super) fn requests_mut(&mut self) -> &mut Requests {
        &mut self.requests
    }

    /// Runs `f` on the core with the lane (a placeholder before the handshake ends),
    /// then carries out what the core asks for.
    pub(super) fn drive(
        &mut self,
        ctx: &LaneContext,
        f: impl FnOnce(&mut Connection, &mut dyn CoreLane<MemoryPayload>, &mut ControlChannel),
    ) {
        let mut none = NoLane;
        let lane: &mut dyn CoreLane<MemoryPayload> = match self.lane.as_deref_mut() {
            Some(lane) => lane,
            None => &mut none,
        };
        f(&mut self.core, lane, &mut self.channel);
        self.carry_out(ctx);
    }

    /// Carries out the core's outputs until it has none, writing what is queued.
    fn carry_out(&mut self, ctx: &LaneContext) {
        // The clock is read only when a step after the flush needs it (rarely).
        let mut now = None;
        loop {
            while let Some(output) = self.core.poll_output() {
                self.carry_out_one(output, ctx);
            }
            let handshaking = self.core.phase() != Phase::Established;
            if let Err(reason) = self.channel.flush(handshaking) {
                self.with_lane(|core, lane| core.fail_peer(reason, lane));
                continue;
            }
            self.with_lane(|core, lane| core.after_flush(|| *now.get_or_insert_with(Instant::now), lane));
            if !self.core.has_output() {
                return;
            }
        }
    }

    fn with_lane(&mut self, f: impl FnOnce(&mut Connection, &mut dyn CoreLane<MemoryPayload>)) {
        let mut none = NoLane;
        let lane: &mut dyn CoreLane<MemoryPayload> = match self.lane.as_deref_mut() {
            Some(lane) => lane,
            None => &mut none,
        };
        f(&mut self.core, lane);
    }

    fn carry_out_one(&mut self, output: Output, ctx: &LaneContext) {
        match output {
            Output::Transmit { message, fds } => self.channel.queue(&message, fds),
            Output::Flush => {
                let handshaking = self.core.phase() != Phase::Established;
                if let Err(reason) = self.channel.flush(handshaking) {
                    self.with_lane(|core, lane| core.fail_peer(reason, lane));
                }
            }
            Output::UseRing => match self.ring.take() {
                Some(memory) => {
                    let connector = matches!(self.waiter, Waiter::Connector(_));
                    self.channel.start_ring(&memory, connector);
                    self.ring_in_use = Some(memory);
                    self.lend_ring_to_lane();
                }
                None => self.with_lane(|core, lane| {
                    core.protocol_error_with("control rings taken into use that were never set up", lane)
                }),
            },
            Output::OpenLane { lane, push, remote } => {
                let opened = open_lane(lane, push, &remote, ctx, self.id);
                let result = match opened {
                    Ok(l) => {
                        self.lane = Some(l);
                        self.lend_ring_to_lane();
                        Ok((lane, *remote))
                    }
                    Err(reason) => Err(reason),
                };
                self.core.lane_opened(result);
            }
            Output::Established { lane, push, peer } => self.established(lane, push, *peer),
            Output::HandshakeFailed(error) => {
                if let Waiter::Connector(reply) = &mut self.waiter {
                    if let Some(reply) = reply.take() {
                        let _connect_gave_up = reply.complete(Err(error));
                    }
                }
            }
            Output::Closed => self.channel.close(),
            Output::ClosedAwaitingHangup => self.channel.close_for_writing(),
            Output::SendDone { id, result } => self.requests.finish_send(id, result),
            Output::ImportDone { id, result } => {
                if let Some(region) = self.requests.finish_import(id, result) {
                    // Its handle is gone: the region goes back to its owner.
                    self.with_lane(|core, lane| core.unimport(region.grant, lane));
                }
            }
            Output::TransferDone { id, result } => self.requests.finish_transfer(id, result),
            Output::NotificationDone { id, result } => {
                if let Some(data) = self.requests.finish_notification(id, result) {
                    self.core.return_notification(data);
                }
            }
            Output::RecvDone { id, result } => {
                if let Some(message) = self.requests.finish_recv(id, result) {
                    // Its receive's handle is gone: the next receive gets it.
                    let now = Instant::now();
                    self.with_lane(|core, lane| core.return_undelivered(id, message, now, lane));
                }
            }
        }
    }

    fn established(
        &mut self,
        lane: ferrylink_proto::lane_kind::LaneKind,
        push: PushRole,
        peer: ferrylink_proto::peer::PeerInfo,
    ) {
        spans::record_established(&self.span, lane, &peer);
        let shared = Arc::new(EndpointShared {
            id: self.id,
            lane,
            control_ring: self.channel.uses_ring(),
            copies_locally: push == PushRole::Pusher,
            receives_pushes: push == PushRole::Target,
            peer,
            counters: self.core.counters().clone(),
        });
        self.channel.start_counting();
        self.shared = Some(shared.clone());
        let delivered = match &mut self.waiter {
            Waiter::Connector(reply) => reply.take().is_some_and(|r| r.complete(Ok(shared)).is_ok()),
            Waiter::Acceptor(accepted) => accepted.push(shared).is_ok(),
        };
        if !delivered {
            // Nobody waits for this endpoint any more (connect timed out, listener dropped).
            self.with_lane(|core, lane| core.abandon(lane));
        }
    }

    /// Socket readiness: read everything, act on every complete message, write replies.
    pub fn on_ready(&mut self, ctx: &LaneContext) {
        if self.core.phase() == Phase::Dead {
            if self.core.awaits_hangup() && self.channel.peer_hung_up() {
                self.drive(ctx, |core, lane, _| core.peer_closed(lane));
            }
            return;
        }
        let eof = match self.channel.read_socket() {
            Ok(eof) => eof,
            Err(reason) => return self.drive(ctx, |core, lane, _| core.fail_peer(reason, lane)),
        };
        self.handle_buffered(Source::Socket, ctx);
        if eof && self.core.phase() != Phase::Dead {
            // What the peer wrote into the ring before it went is still to be read.
            self.poll_ring(ctx);
            if self.core.phase() != Phase::Dead {
                self.drive(ctx, |core, lane, _| core.peer_closed(lane));
            }
        }
        self.carry_out(ctx);
    }

    /// Control-ring mode: reads and acts on what the peer wrote into its ring; whether
    /// anything was there.
    pub fn poll_ring(&mut self, ctx: &LaneContext) -> bool {
        if !self.channel.uses_ring() {
            return false;
        }
        match self.channel.read_ring() {
            Ok(0) => false,
            Ok(_) => {
                self.handle_buffered(Source::Ring, ctx);
                self.carry_out(ctx);
                true
            }
            Err(reason) => {
                self.drive(ctx, |core, lane, _| core.protocol_error_with(&reason, lane));
                true
            }
        }
    }

    /// Decodes and acts on every complete message read from `source`.
    fn handle_buffered(&mut self, source: Source, ctx: &LaneContext) {
        while self.core.phase() != Phase::Dead {
            let message = match self.channel.next_message(source, &self.limits) {
                Ok(Some(message)) => message,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!("peer sent a bad message: {e}");
                    return self.drive(ctx, |core, lane, _| core.fail_peer(e.to_string(), lane));
                }
            };
            tracing::trace!(kind = ferrylink_proto::connection::kind(&message), ?source, "control message read");
            if source == Source::Ring {
                self.pull_descriptors_for(&message, ctx);
            }
            if let WireMessage::Hello(hello) = &message {
                if self.core.phase() == Phase::Handshaking && matches!(self.waiter, Waiter::Acceptor(_)) {
                    let peer = self.core.peer().to_owned();
                    self.ring = self.channel.map_offered_ring(hello.control_ring, self.control_ring_bytes, &peer);
                    self.core.set_ring_taken(self.ring.is_some());
                }
            }
            let now = Instant::now();
            // Replies queue up; what was read is written out once, by the caller.
            let mut none = NoLane;
            let lane: &mut dyn CoreLane<MemoryPayload> = match self.lane.as_deref_mut() {
                Some(lane) => lane,
                None => &mut none,
            };
            self.core.handle_message(message, &mut self.channel.fds_in, now, lane);
            while let Some(output) = self.core.poll_output() {
                self.carry_out_one(output, ctx);
            }
        }
    }

    /// Control-ring mode: a ring message that passes descriptors had them sent ahead on
    /// the socket; read the socket now if they are not here yet.
    fn pull_descriptors_for(&mut self, message: &WireMessage, ctx: &LaneContext) {
        let WireMessage::Regions(list) = message else { return };
        if self.channel.fds_in.len() >= list.len() {
            return;
        }
        match self.channel.read_socket() {
            Ok(_) => self.handle_buffered(Source::Socket, ctx),
            Err(reason) => self.drive(ctx, |core, lane, _| core.fail_peer(reason, lane)),
        }
    }

    /// The user sends `message` (its producer's marks recorded on the sending thread).
    pub fn send(
        &mut self,
        id: u64,
        message: Message,
        slot: SendSlot,
        producer: Option<ProducerMarks>,
        ctx: &LaneContext,
    ) {
        if slot.is_abandoned() {
            // Dropped before the progress thread took it: withdrawn, never sent.
            return;
        }
        let span = spans::send_span(id, &message);
        self.requests.add_send(id, slot, span.clone());
        let _in_transfer = span.entered();
        if let (Some(marks), Some(lane)) = (producer, self.lane.as_deref_mut()) {
            lane.note_producer(id, marks);
        }
        let now = Instant::now();
        self.drive(ctx, |core, lane, _| core.send(id, message, now, lane));
    }

    /// The user posts a receive (its copies ending with `on` waiting, when given).
    pub fn recv(&mut self, id: u64, posted: PostedRecvCommand, slot: RecvSlot, ctx: &LaneContext) {
        if slot.is_abandoned() {
            return;
        }
        let PostedRecvCommand { into, on, target_marks } = posted;
        if let (Some(marks), Some(lane)) = (target_marks, self.lane.as_deref_mut()) {
            lane.note_target_marks(id, marks);
        }
        let span = spans::recv_span(id);
        self.requests.add_recv(id, slot, on.clone(), span.clone());
        let _in_transfer = span.entered();
        let now = Instant::now();
        self.drive(ctx, |core, lane, _| core.recv(id, into, on, now, lane));
    }

    /// A request's waiter timed out.
    pub fn cancel(&mut self, id: u64, ctx: &LaneContext) {
        let now = Instant::now();
        self.drive(ctx, |core, lane, _| core.cancel(id, now, lane));
    }

    /// A request's handle went before it completed: withdrawn if it has not started.
    pub fn withdraw(&mut self, id: u64, ctx: &LaneContext) {
        let mut withdrawn = false;
        self.drive(ctx, |core, lane, _| withdrawn = core.withdraw(id, lane));
        if withdrawn {
            self.requests.withdrawn(id);
        }
    }

    /// A message completed into receive `id` whose handle went without taking it.
    pub fn undelivered(&mut self, id: u64, message: Message, ctx: &LaneContext) {
        let now = Instant::now();
        self.drive(ctx, |core, lane, _| core.return_undelivered(id, message, now, lane));
    }

    /// Request `id` is awaited as a future: it ends at `at` unless answered by then.
    pub fn expire_at(&mut self, id: u64, at: Instant) {
        self.requests.set_deadline(id, at);
    }

    /// When the soonest future's deadline is.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.requests.next_deadline()
    }

    /// Ends the futures whose deadline passed as `wait()` ends a request then: cancelled
    /// in the core, and if the core cannot answer at once (a message is landing in the
    /// receive's own buffers), timed out in the slot.
    fn expire_due(&mut self, now: Instant, ctx: &LaneContext) {
        for id in self.requests.take_due(now) {
            self.cancel(id, ctx);
            self.requests.time_out(id, self.request_timeout);
        }
    }

    /// Once both the control rings are in use and the lane is open, the lane may use the
    /// rings' gate words.
    fn lend_ring_to_lane(&mut self) {
        if let (Some(ring), Some(lane)) = (&self.ring_in_use, self.lane.as_deref_mut()) {
            let connector = matches!(self.waiter, Waiter::Connector(_));
            lane.use_control_ring(ring, connector);
        }
    }

    /// The user dropped the endpoint.
    pub fn close_by_user(&mut self, ctx: &LaneContext) {
        self.drive(ctx, |core, lane, _| core.close_by_user(lane));
    }

    /// Once per turn (`now`: the turn's time): deadlines, retries, and what the lane
    /// finished. Whether GPU or lane work is pending (the progress thread then keeps
    /// turning).
    pub fn turn(&mut self, ctx: &LaneContext, now: Instant) -> bool {
        // An endpoint nobody holds any more (never accepted before the listener went, or
        // its handle is gone without a Close yet) is closed.
        if self.shared.as_ref().is_some_and(|s| Arc::strong_count(s) == 1) {
            self.close_by_user(ctx);
        }
        self.expire_due(now, ctx);
        self.drive(ctx, |core, lane, _| core.handle_timeout(now, lane));
        let mut events = Vec::new();
        let busy = self.lane.as_deref_mut().is_some_and(|lane| lane.poll(&mut events));
        for event in events {
            if matches!(event, LaneEvent::Failed { .. }) {
                // What the peer wrote before its lane failed counts first: a peer that
                // acknowledged a message and then closed leaves its UCX endpoint failing
                // with its `Ack` (and its hang-up) still unread on the control stream.
                self.on_ready(ctx);
                self.poll_ring(ctx);
            }
            self.drive(ctx, |core, lane, _| core.handle_lane_event(event, now, lane));
        }
        busy || self.core.wants_spin(now)
    }

    /// Whether the UCX worker must be progressed for this connection.
    pub fn uses_ucx(&self) -> bool {
        self.lane.as_deref().is_some_and(|l| l.uses_ucx())
    }

    /// Whether this connection's messages travel through control rings (established,
    /// not dead): its socket then has little to say.
    pub fn ring_carries_messages(&self) -> bool {
        self.channel.uses_ring() && self.core.phase() == Phase::Established
    }

    /// Whether control messages wait for room in a full ring.
    pub fn ring_output_blocked(&self) -> bool {
        self.channel.ring_output_blocked()
    }

    /// See [`ControlChannel::arm_ring_sleep`].
    pub fn arm_ring_sleep(&mut self) -> bool {
        self.channel.arm_ring_sleep()
    }

    /// See [`ControlChannel::disarm_ring_sleep`].
    pub fn disarm_ring_sleep(&mut self) {
        self.channel.disarm_ring_sleep();
    }

    /// Whether the progress thread can forget this connection.
    pub fn is_finished(&self) -> bool {
        self.core.is_finished()
    }

    /// The context shuts down. Buffers lent to a peer that may still copy into them
    /// are held until it hangs up, here for at most [`HANGUP_AT_SHUTDOWN`] (the
    /// progress thread ends next).
    pub fn shut_down(&mut self, ctx: &LaneContext) {
        self.drive(ctx, |core, lane, _| core.fail(TransportError::ContextClosed, lane));
        if self.core.awaits_hangup() {
            if !self.channel.wait_for_hangup(HANGUP_AT_SHUTDOWN) {
                tracing::warn!("a peer did not hang up within {HANGUP_AT_SHUTDOWN:?} of the context's end");
            }
            self.drive(ctx, |core, lane, _| core.peer_closed(lane));
        }
    }

    /// Adds what this connection holds to the context's statistics.
    pub fn add_stats(&self, s: &mut ContextStats) {
        self.core.add_stats(s);
        if let Some(lane) = &self.lane {
            lane.add_stats(s);
        }
    }
}
