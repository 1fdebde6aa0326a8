//! [`Connection`]: the protocol state of one connection, what it is made of
//! (`state/`), and what every part of the protocol shares: creating it, feeding it
//! messages, lane events and the time, draining its outputs, failing and closing it.
//! Each part of the protocol adds its handlers in its own file (`send.rs`, `recv.rs`,
//! `offers.rs`, `onesided.rs`, …).

use super::lane::{CoreLane, LaneEvent, NoLane};
use super::state::hangup::HeldForHangup;
use super::state::offers::Offers;
use super::state::onesided::OneSided;
use crate::error::{ConnectError, TransportError};
use crate::payload::Payload;
use crate::stats::{ContextStats, Counters};
use crate::wire::{Hello, Limits, WireMessage};

use super::state::recv::RecvSide;
use super::state::send::SendSide;
use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::output::Output;
use super::roles::{PushRole, Role};

/// How often an idle connection asks its lane which regions the user dropped.
pub(in crate::connection) const REGION_SWEEP_EVERY: Duration = Duration::from_micros(100);

/// What the core needs of the configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Longest a peer may leave a transfer unacknowledged.
    pub request_timeout: Duration,
    /// Longest a handshake may take.
    pub connect_timeout: Duration,
    /// Bytes that may land ahead of the user's receives.
    pub unexpected_max_bytes: usize,
    /// Listener side: largest message a push offer is made for (0: none).
    pub push_offer_max_bytes: u64,
    /// The limits the peer enforces on what this side sends.
    pub limits: Limits,
}

/// How far a connection got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// `Hello` and `Welcome` are under way.
    Handshaking,
    /// Handshake done; the driver is opening the lane.
    OpeningLane,
    /// The lane is open: messages and transfers flow.
    Established,
    /// The connection is gone; the core stays until the user closes the endpoint, so
    /// requests get the error and landed messages can still be received.
    Dead,
}

/// The protocol state of one connection, built for the buffer types `P` names.
pub struct Connection<P: Payload> {
    pub(in crate::connection) settings: Settings,
    pub(in crate::connection) role: Role,
    /// This side's introduction on this connection.
    pub(in crate::connection) local: Hello,
    pub(in crate::connection) phase: Phase,
    /// Who the peer is, for error messages.
    pub(in crate::connection) peer: String,
    pub(in crate::connection) created: Instant,
    /// When the lane was last asked which regions the user dropped (an idle turn asks
    /// at most every [`REGION_SWEEP_EVERY`]; a send always asks first).
    pub(in crate::connection) regions_swept_at: Instant,
    pub(in crate::connection) push: PushRole,
    /// The connecting side's `connect` still waits for an answer.
    pub(in crate::connection) reply_pending: bool,
    /// Acceptor: the driver mapped the control rings the peer's `Hello` offered.
    pub(in crate::connection) ring_taken: bool,
    pub(in crate::connection) user_closed: bool,
    pub(in crate::connection) established: bool,
    pub(in crate::connection) error: Option<TransportError>,
    pub(in crate::connection) counters: Arc<Counters>,
    pub(in crate::connection) send: SendSide<P>,
    pub(in crate::connection) recv: RecvSide<P>,
    pub(in crate::connection) offers: Offers<P>,
    pub(in crate::connection) onesided: OneSided<P>,
    /// Ended by this side while the peer may still copy into lent buffers
    /// (`recv/hangup.rs`).
    pub(in crate::connection) held_for_hangup: Option<HeldForHangup<P>>,
    pub(in crate::connection) out: VecDeque<Output<P>>,
}

impl<P: Payload> Connection<P> {
    /// A connection whose handshake starts now. A connecting side's driver transmits
    /// [`Connection::hello`] first.
    pub fn new(settings: Settings, role: Role, local: Hello, peer: String, now: Instant) -> Self {
        Self {
            settings,
            reply_pending: matches!(role, Role::Connector { .. }),
            ring_taken: false,
            role,
            local,
            phase: Phase::Handshaking,
            peer,
            created: now,
            regions_swept_at: now,
            push: PushRole::Off,
            user_closed: false,
            established: false,
            error: None,
            counters: Arc::new(Counters::default()),
            send: SendSide::default(),
            recv: RecvSide::default(),
            offers: Offers::default(),
            held_for_hangup: None,
            onesided: OneSided::default(),
            out: VecDeque::new(),
        }
    }

    /// Acceptor: whether the driver mapped the control rings the `Hello` about to be
    /// handled offers (it maps them before, with the descriptor that came along).
    pub fn set_ring_taken(&mut self, taken: bool) {
        self.ring_taken = taken;
    }

    /// This side's introduction on this connection.
    pub fn hello(&self) -> &Hello {
        &self.local
    }

    /// The counters this connection keeps (shared with the user's endpoint).
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// The next thing for the driver to do.
    pub fn poll_output(&mut self) -> Option<Output<P>> {
        self.out.pop_front()
    }

    /// Whether outputs wait for the driver.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// Who the peer is, for messages.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Where the connection is.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Whether the driver can forget this connection.
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Dead && (self.user_closed || !self.established) && self.held_for_hangup.is_none()
    }

    /// Whether the driver should keep turning without sleeping: GPU work it polls is
    /// running, a notification waits for its gate, or a pushed message waits a moment
    /// for its receive.
    pub fn wants_spin(&self, now: Instant) -> bool {
        self.phase == Phase::Established
            && (self.send.awaiting_producer
                || !self.onesided.awaiting_producer.is_empty()
                || self.recv.awaiting_peer_gpu
                || self.offers.sends_pending()
                || self.offers.receive_offer_pending
                || !self.onesided.gated.is_empty()
                || self.recv.device_waits_for_recv(now))
    }

    pub(in crate::connection) fn transmit(&mut self, message: WireMessage) {
        self.out.push_back(Output::Transmit { message, fds: Vec::new() });
    }

    /// Acts on a decoded message from the peer. `fds`: descriptors that came with the
    /// control stream and no message has claimed yet (region announcements take theirs).
    pub fn handle_message(
        &mut self,
        message: WireMessage,
        fds: &mut VecDeque<OwnedFd>,
        now: Instant,
        lane: &mut dyn CoreLane<P>,
    ) {
        match (self.phase, message) {
            // A wake-up, or the carrier of descriptors a ring message takes.
            (_, WireMessage::Wake) => {}
            (Phase::Dead, _) => {}
            (Phase::Handshaking, message) => self.handshake(message),
            (Phase::OpeningLane, _) => self.protocol_error("a message before the lane was open"),
            (Phase::Established, WireMessage::Hello(_) | WireMessage::Welcome { .. }) => {
                self.protocol_error_with("a second handshake on an established connection", lane)
            }
            (Phase::Established, WireMessage::Reject { reason }) => {
                self.fail_peer(format!("the peer gave up: {reason}"), lane)
            }
            (Phase::Established, WireMessage::Goodbye) => {
                let peer = self.peer.clone();
                self.fail(TransportError::PeerClosed { peer }, lane)
            }
            (Phase::Established, message) => self.handle_session_message(message, fds, now, lane),
        }
    }

    pub(in crate::connection) fn handle_session_message(
        &mut self,
        message: WireMessage,
        fds: &mut VecDeque<OwnedFd>,
        now: Instant,
        lane: &mut dyn CoreLane<P>,
    ) {
        match message {
            WireMessage::Regions(list) => {
                if fds.len() < list.len() {
                    let have = fds.len();
                    let what = format!("{} regions announced but {have} descriptors arrived", list.len());
                    return self.protocol_error_with(&what, lane);
                }
                if let Err(reason) = lane.import_regions(&list, fds) {
                    self.protocol_error_with(&reason, lane);
                }
            }
            WireMessage::Data(data) => self.on_data(data, now, lane),
            WireMessage::Ack { seq, result } => self.on_ack(seq, result, now, lane),
            WireMessage::ForgetRegion { region_id } => lane.forget_region(region_id),
            WireMessage::PushTargets { seq, targets } if self.push == PushRole::Pusher => {
                self.on_push_targets(seq, targets, now, lane)
            }
            WireMessage::PushDone { seq } if self.push == PushRole::Target => self.on_push_done(seq, now, lane),
            WireMessage::PushOffer { offer, targets, for_seq } => self.on_push_offer(offer, targets, for_seq, lane),
            WireMessage::DeclineOffer { offer } => self.on_decline_offer(offer, now, lane),
            WireMessage::WithdrawOffer { offer } => self.on_withdraw_offer(offer, lane),
            message @ (WireMessage::ImportKey { .. }
            | WireMessage::ImportAnswer { .. }
            | WireMessage::Transfer(_)
            | WireMessage::Prepare(_)
            | WireMessage::RunPrepared { .. }
            | WireMessage::Unprepare { .. }
            | WireMessage::TransferDone { .. }
            | WireMessage::Notify { .. }
            | WireMessage::NotifyCancelled { .. }
            | WireMessage::Revoke { .. }
            | WireMessage::RevokeDone { .. }
            | WireMessage::Unimport { .. }) => self.handle_onesided(message, lane),
            other => self.protocol_error_with(&format!("unexpected message {}", kind(&other)), lane),
        }
    }

    /// Acts on work the lane finished.
    pub fn handle_lane_event(&mut self, event: LaneEvent<P>, now: Instant, lane: &mut dyn CoreLane<P>) {
        if self.phase != Phase::Established {
            return;
        }
        match event {
            LaneEvent::SendFinished { seq } => self.on_send_finished(seq, now, lane),
            LaneEvent::Landed { seq, message } => self.on_landed(seq, message, now, lane),
            LaneEvent::CopiesDone { seq } => self.on_copies_done(seq, lane),
            LaneEvent::OfferedSendDone { seq } => self.on_offered_send_done(seq, None),
            LaneEvent::OfferedSendFailed { seq, reason } => self.on_offered_send_done(seq, Some(reason)),
            LaneEvent::Failed { reason } => self.fail_peer(reason, lane),
            event @ (LaneEvent::TransferFinished { .. }
            | LaneEvent::PeerTransferFinished { .. }
            | LaneEvent::TransferDescribed { .. }) => self.handle_onesided_event(event, now, lane),
        }
    }

    /// Once per driver turn: deadlines (handshake, unacknowledged sends), sends waiting
    /// for their producer, messages waiting for the peer's GPU work or their receive's
    /// grace, offers waiting for a send to ride along with, regions dropped.
    pub fn handle_timeout(&mut self, now: Instant, lane: &mut dyn CoreLane<P>) {
        match self.phase {
            Phase::Handshaking | Phase::OpeningLane
                if now.saturating_duration_since(self.created) > self.settings.connect_timeout =>
            {
                let within = self.settings.connect_timeout;
                self.fail_peer(format!("handshake not finished within {within:?}"), lane);
            }
            Phase::Established => {
                // An idle sender still tells the peer to unmap regions it dropped (not on
                // every turn: the lane walks every region it announced to answer).
                if now.saturating_duration_since(self.regions_swept_at) >= REGION_SWEEP_EVERY {
                    self.regions_swept_at = now;
                    self.forget_dropped_regions(lane);
                }
                let timeout = self.settings.request_timeout;
                if let Some(seq) = self.send.overdue(now, timeout) {
                    return self.fail_peer(format!("message {seq} not acknowledged within {timeout:?}"), lane);
                }
                if let Some(seq) = self.landing_overdue(now) {
                    return self.fail_peer(format!("message {seq} not landed within {timeout:?}"), lane);
                }
                if let Some(what) = self.onesided_overdue(now, timeout) {
                    return self.fail_peer(what, lane);
                }
                if self.send.awaiting_producer {
                    self.pump_sends(now, lane);
                }
                if !self.onesided.awaiting_producer.is_empty() {
                    self.pump_transfers(now, lane);
                }
                if !self.onesided.gated.is_empty() {
                    self.release_gated(lane);
                }
                if let Some(offer) = self.receive_offer_overdue(now) {
                    let timeout = self.settings.request_timeout;
                    return self.fail_peer(format!("receive offer {offer} not given back within {timeout:?}"), lane);
                }
                if self.recv.awaiting_peer_gpu || self.recv.device_grace_over(now) {
                    self.deliver_parked(now, lane);
                } else if self.offers.receive_offer_pending {
                    self.offer_front_receive(lane);
                }
                self.make_offer(false, now, lane);
            }
            Phase::Dead => self.hangup_overdue(now, lane),
            _ => {}
        }
    }

    /// After the driver wrote what was queued and completed the requests it finished:
    /// work that was to wait for that (an offer made right after a send; a posted
    /// receive's offer, made once the receive before it was delivered).
    pub fn after_flush(&mut self, now: impl FnOnce() -> Instant, lane: &mut dyn CoreLane<P>) {
        if self.offers.take_eager_offer() && self.phase == Phase::Established {
            self.make_offer(true, now(), lane);
        }
        if std::mem::take(&mut self.offers.receive_offer_wanted) {
            self.offer_front_receive(lane);
        }
    }

    /// Adds what this connection holds to the context's statistics.
    pub fn add_stats(&self, s: &mut ContextStats) {
        if self.phase != Phase::Dead || !self.user_closed {
            s.endpoints += 1;
        }
        s.sends_in_flight += self.send.in_flight_count();
        s.remote_regions += self.onesided_imported_count();
        s.recvs_posted += self.recv.posted_count();
        s.unclaimed_bytes += self.recv.landed_bytes as u64;
    }

    /// The user dropped the endpoint: say goodbye and end.
    pub fn close_by_user(&mut self, lane: &mut dyn CoreLane<P>) {
        self.user_closed = true;
        if self.phase == Phase::Established {
            self.transmit(WireMessage::Goodbye);
            self.out.push_back(Output::Flush);
        }
        self.fail(TransportError::EndpointClosed, lane);
    }

    /// Nobody waits for the endpoint any more (its `connect` gave up, its listener is
    /// gone): it ends without a goodbye.
    pub fn abandon(&mut self, lane: &mut dyn CoreLane<P>) {
        self.user_closed = true;
        self.fail(TransportError::EndpointClosed, lane);
    }

    /// The peer closed its end of the control channel (after this side ended the
    /// connection: it hung up, and what it was lent is released).
    pub fn peer_closed(&mut self, lane: &mut dyn CoreLane<P>) {
        if self.phase == Phase::Dead {
            return self.release_held(lane);
        }
        let peer = self.peer.clone();
        self.fail(TransportError::PeerClosed { peer }, lane);
    }

    /// Fails the connection with a `PeerFailed` error naming the peer.
    pub fn fail_peer(&mut self, reason: String, lane: &mut dyn CoreLane<P>) {
        let peer = self.peer.clone();
        self.fail(TransportError::PeerFailed { peer, reason }, lane);
    }

    /// The peer broke the protocol (during the handshake: no lane yet).
    pub fn protocol_error(&mut self, what: &str) {
        self.protocol_error_with(what, &mut NoLane);
    }

    /// The peer broke the protocol: the connection fails through its lane.
    pub fn protocol_error_with(&mut self, what: &str, lane: &mut dyn CoreLane<P>) {
        let peer = self.peer.clone();
        tracing::warn!("peer {peer} broke the protocol: {what}");
        self.fail(TransportError::PeerFailed { peer, reason: format!("protocol violation: {what}") }, lane);
    }

    /// Ends the connection: every pending request ends with `error`, the lane lets go
    /// of the peer's memory, the driver closes the socket.
    pub fn fail(&mut self, error: TransportError, lane: &mut dyn CoreLane<P>) {
        if self.phase == Phase::Dead {
            return;
        }
        if self.phase == Phase::Established {
            self.settle_acknowledged_sends(lane);
        }
        self.phase = Phase::Dead;
        if self.reply_pending {
            self.reply_pending = false;
            self.out.push_back(Output::HandshakeFailed(ConnectError::Handshake(error.to_string())));
        }
        let lent = self.lent_buffers_at_end(&error, lane);
        let held = self.held_for_hangup.is_some();
        self.out.push_back(if held { Output::ClosedAwaitingHangup } else { Output::Closed });
        self.fail_sends(&error, lane);
        let held_offer = self.held_for_hangup.as_ref().and_then(HeldForHangup::offer);
        self.recv.fail_all(&error, &mut self.out, lent, held_offer);
        self.fail_onesided(&error, lane);
        self.offers.clear();
        lane.close();
        self.error = Some(error);
    }

    /// The error a request meets on a connection that is gone.
    pub(in crate::connection) fn dead_error(&self) -> TransportError {
        self.error.clone().unwrap_or(TransportError::EndpointClosed)
    }
}

/// The name of a message's kind, for errors and traces.
pub fn kind(m: &WireMessage) -> &'static str {
    match m {
        WireMessage::Hello(_) => "Hello",
        WireMessage::Welcome { .. } => "Welcome",
        WireMessage::Reject { .. } => "Reject",
        WireMessage::Regions(_) => "Regions",
        WireMessage::Data(_) => "Data",
        WireMessage::Ack { .. } => "Ack",
        WireMessage::ForgetRegion { .. } => "ForgetRegion",
        WireMessage::Goodbye => "Goodbye",
        WireMessage::Wake => "Wake",
        WireMessage::PushTargets { .. } => "PushTargets",
        WireMessage::PushDone { .. } => "PushDone",
        WireMessage::PushOffer { .. } => "PushOffer",
        WireMessage::DeclineOffer { .. } => "DeclineOffer",
        WireMessage::WithdrawOffer { .. } => "WithdrawOffer",
        WireMessage::ImportKey { .. } => "ImportKey",
        WireMessage::ImportAnswer { .. } => "ImportAnswer",
        WireMessage::Transfer(_) => "Transfer",
        WireMessage::Prepare(_) => "Prepare",
        WireMessage::RunPrepared { .. } => "RunPrepared",
        WireMessage::Unprepare { .. } => "Unprepare",
        WireMessage::TransferDone { .. } => "TransferDone",
        WireMessage::Notify { .. } => "Notify",
        WireMessage::NotifyCancelled { .. } => "NotifyCancelled",
        WireMessage::Revoke { .. } => "Revoke",
        WireMessage::RevokeDone { .. } => "RevokeDone",
        WireMessage::Unimport { .. } => "Unimport",
    }
}
