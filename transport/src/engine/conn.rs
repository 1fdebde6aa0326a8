//! One connection: its state, its handshake, and its end. Its control channel (socket
//! and control rings) is in `engine/channel.rs`.

use super::channel::{ControlRing, OutFrame, ReadBuffer};
use super::device::DeviceLane;
use super::native::NativeLane;
use super::stream::{ControlStream, RawStream};
use super::ucx_lane::{direct_device, UcxConn, UcxEngine};
use crate::config::Config;
use crate::context::ContextStats;
use crate::endpoint::{Counters, EndpointShared, PeerInfo};
use crate::error::{ConnectError, TransportError};
use crate::negotiate::{negotiate, Lane};
use crate::wire::{encode_frame, DeviceCopies, Hello, WireMessage};
use crossbeam_channel::Sender;
use ferrylink_ipc::control_ring::ControlRingMemory;
use mio::{Registry, Token};
use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

/// What the context's lanes share with each connection.
pub(crate) struct LaneResources {
    /// CUDA state (IPC exporter, mapping cache, pools).
    pub device: Arc<DeviceLane>,
    /// The UCX worker, when UCX is loaded.
    pub ucx: Option<Rc<UcxEngine>>,
}

/// This side's part in the native lane's connector-copies mode (see `engine/device.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PushRole {
    /// Each receiver copies (pull).
    Off,
    /// This side connected: it copies device frames into the listener's buffers when it
    /// sends (and pulls, as always, when it receives).
    Pusher,
    /// This side listened: it provides buffers for the connector's device frames.
    Target,
}

/// Which side of the handshake this connection is.
pub(crate) enum Role {
    /// We connected; the user thread waits on `reply`.
    Connector { reply: Option<Sender<Result<Arc<EndpointShared>, ConnectError>>> },
    /// A listener accepted it; established endpoints go to `accepted`.
    Acceptor { accepted: Sender<Arc<EndpointShared>> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Handshaking,
    Established,
    /// The socket is gone; the entry stays until the user closes the endpoint, so its
    /// requests get the error and landed messages can still be received.
    Dead,
}

pub(crate) struct Conn {
    pub id: usize,
    pub(super) stream: ControlStream,
    registry: Registry,
    pub phase: Phase,
    pub(super) role: Role,
    /// Who the peer is, for error messages.
    pub peer: String,
    /// Bytes read from the socket, not yet decoded.
    pub(super) socket_in: ReadBuffer,
    pub fds_in: VecDeque<OwnedFd>,
    /// Control messages to write: to the socket, or in control-ring mode to the ring.
    pub(super) out: VecDeque<OutFrame>,
    /// Control-ring mode: what still goes to the socket (`Wake`s, descriptors, and what
    /// was queued before the rings were taken into use).
    pub(super) socket_out: VecDeque<OutFrame>,
    /// Connector: the rings offered with the `Hello`, until the `Welcome` answers.
    pub(super) ring_offer: Option<Arc<ControlRingMemory>>,
    /// The rings, once both sides use them.
    pub(super) ring: Option<ControlRing>,
    pub shared: Option<Arc<EndpointShared>>,
    pub native: NativeLane,
    pub device: Arc<DeviceLane>,
    /// The context's UCX worker, when UCX is loaded.
    pub ucx_engine: Option<Rc<UcxEngine>>,
    /// This connection's UCX endpoint, on the UCX lane.
    pub ucx: Option<UcxConn>,
    created: Instant,
    /// A queued device send waits for its producer's GPU work to finish.
    pub awaiting_producer: bool,
    /// A parked message waits for the peer's GPU work (its ready events).
    pub awaiting_peer_gpu: bool,
    /// Connector-copies mode of the native lane: this side's part in it.
    pub push: PushRole,
    user_closed: bool,
    pub error: Option<TransportError>,
}

impl Conn {
    pub fn new(
        id: usize,
        stream: RawStream,
        role: Role,
        peer: String,
        config: &Config,
        registry: &Registry,
        lanes: LaneResources,
    ) -> std::io::Result<Self> {
        let LaneResources { device, ucx: ucx_engine } = lanes;
        let mut stream = ControlStream::from_raw(stream)?;
        let registry = registry.try_clone()?;
        stream.register(&registry, Token(id))?;
        Ok(Self {
            id,
            stream,
            registry,
            phase: Phase::Handshaking,
            role,
            peer,
            socket_in: ReadBuffer::default(),
            fds_in: VecDeque::new(),
            out: VecDeque::new(),
            socket_out: VecDeque::new(),
            ring_offer: None,
            ring: None,
            shared: None,
            native: NativeLane::new(config),
            device,
            ucx_engine,
            ucx: None,
            created: Instant::now(),
            awaiting_producer: false,
            awaiting_peer_gpu: false,
            push: PushRole::Off,
            user_closed: false,
            error: None,
        })
    }

    pub fn counters(&self) -> Option<&Counters> {
        self.shared.as_ref().map(|s| &s.counters)
    }

    pub(super) fn handle(&mut self, message: WireMessage, config: &Config, local: &Hello) {
        match (self.phase, message) {
            // A wake-up, or the carrier of descriptors a ring message takes (`fds_in`).
            (_, WireMessage::Wake) => {}
            (Phase::Handshaking, message) => self.handshake(message, config, local),
            (Phase::Established, WireMessage::Hello(_) | WireMessage::Welcome { .. }) => {
                self.protocol_error("a second handshake on an established connection")
            }
            (Phase::Established, WireMessage::Reject { reason }) => {
                self.fail_peer(format!("the peer gave up: {reason}"))
            }
            (Phase::Established, WireMessage::Goodbye) => {
                let peer = self.peer.clone();
                self.fail(TransportError::PeerClosed { peer })
            }
            (Phase::Established, message) => self.handle_lane_message(message, config),
            (Phase::Dead, _) => {}
        }
    }

    fn handshake(&mut self, message: WireMessage, config: &Config, local: &Hello) {
        let local = &super::hello_for_conn(local, self.stream.is_unix(), self.id);
        match (&mut self.role, message) {
            (Role::Acceptor { .. }, WireMessage::Hello(remote)) => match negotiate(local, &remote) {
                Ok(lane) => {
                    let ring = self.map_offered_ring(remote.control_ring, config);
                    let welcome = WireMessage::Welcome { hello: local.clone(), lane, control_ring: ring.is_some() };
                    self.queue(encode_frame(&welcome), Vec::new());
                    if let Some(memory) = ring {
                        self.start_ring(memory);
                    }
                    let copies = remote.device_copies;
                    self.establish(remote, lane, copies);
                }
                Err(e) => self.refuse(e.to_string()),
            },
            (Role::Connector { .. }, WireMessage::Welcome { hello, lane, control_ring }) => {
                match negotiate(local, &hello) {
                    Ok(ours) if ours == lane => {
                        match (control_ring, self.ring_offer.take()) {
                            (true, Some(memory)) => self.start_ring(memory),
                            (true, None) => {
                                return self.protocol_error("the listener took control rings never offered")
                            }
                            (false, _) => {}
                        }
                        self.establish(hello, lane, local.device_copies)
                    }
                    Ok(ours) => self.refuse(format!("the listener chose the {lane} lane, this side computed {ours}")),
                    Err(e) => self.refuse(e.to_string()),
                }
            }
            (Role::Connector { reply }, WireMessage::Reject { reason }) => {
                if let Some(reply) = reply.take() {
                    let _ = reply.send(Err(ConnectError::Rejected { reason: reason.clone() }));
                }
                self.fail_peer(reason);
            }
            (_, other) => self.protocol_error(&format!("unexpected {} during the handshake", kind(&other))),
        }
    }

    /// Says why we give up, then fails the connection (both sides report the reason).
    fn refuse(&mut self, reason: String) {
        tracing::warn!("handshake with {} refused: {reason}", self.peer);
        self.queue(encode_frame(&WireMessage::Reject { reason: reason.clone() }), Vec::new());
        self.flush();
        if let Role::Connector { reply } = &mut self.role {
            if let Some(reply) = reply.take() {
                let _ = reply.send(Err(ConnectError::Handshake(reason.clone())));
            }
        }
        self.fail_peer(reason);
    }

    fn establish(&mut self, remote: Hello, lane: Lane, copies: DeviceCopies) {
        self.peer = format!("pid {} on {}", remote.pid, remote.host.hostname);
        self.push = match (lane, copies, &self.role) {
            (Lane::Native, DeviceCopies::Connector, Role::Connector { .. }) => PushRole::Pusher,
            (Lane::Native, DeviceCopies::Connector, Role::Acceptor { .. }) => PushRole::Target,
            _ => PushRole::Off,
        };
        if lane == Lane::Ucx {
            if let Err(reason) = self.connect_ucx(&remote) {
                return self.refuse(reason);
            }
        }
        let shared = Arc::new(EndpointShared {
            id: self.id,
            lane,
            control_ring: self.ring.is_some(),
            copies_locally: self.push == PushRole::Pusher && self.ucx.is_none(),
            peer: PeerInfo { pid: remote.pid, uid: remote.uid, hostname: remote.host.hostname.clone(), hello: remote },
            counters: Counters::default(),
        });
        self.shared = Some(shared.clone());
        self.phase = Phase::Established;
        let delivered = match &mut self.role {
            Role::Connector { reply } => reply.take().is_some_and(|r| r.send(Ok(shared)).is_ok()),
            Role::Acceptor { accepted } => accepted.send(shared).is_ok(),
        };
        if !delivered {
            // Nobody waits for this endpoint any more (connect timed out, listener dropped).
            self.user_closed = true;
            self.fail(TransportError::EndpointClosed);
        }
    }

    /// Opens the UCX endpoint to the peer's worker.
    fn connect_ucx(&mut self, remote: &Hello) -> Result<(), String> {
        let engine = self.ucx_engine.as_ref().ok_or("UCX is not loaded on this side")?;
        let info = remote.ucx.as_ref().ok_or("the peer offered no UCX worker")?;
        let direct = direct_device(engine.cuda_aware, info.cuda_aware);
        let recv_prefix = super::conn_tag_prefix(self.id);
        let conn = UcxConn::connect(&engine.worker, &info.worker_address, info.tag_prefix, recv_prefix, direct)
            .map_err(|e| format!("connecting to the peer's UCX worker failed: {e}"))?;
        self.ucx = Some(conn);
        Ok(())
    }

    /// Fails the connection with a `PeerFailed` error naming the peer.
    pub fn fail_peer(&mut self, reason: String) {
        let peer = self.peer.clone();
        self.fail(TransportError::PeerFailed { peer, reason });
    }

    pub fn protocol_error(&mut self, what: &str) {
        let peer = self.peer.clone();
        tracing::warn!("peer {peer} broke the protocol: {what}");
        self.fail(TransportError::PeerFailed { peer, reason: format!("protocol violation: {what}") });
    }

    /// Ends the connection: every pending request ends with `error`, shared memory of
    /// the peer is unmapped, the socket is closed.
    pub fn fail(&mut self, error: TransportError) {
        if self.phase == Phase::Dead {
            return;
        }
        if self.phase == Phase::Established {
            self.settle_acknowledged_sends();
        }
        self.phase = Phase::Dead;
        if let Role::Connector { reply } = &mut self.role {
            if let Some(reply) = reply.take() {
                let _ = reply.send(Err(ConnectError::Handshake(error.to_string())));
            }
        }
        self.stream.deregister(&self.registry);
        self.stream.shutdown();
        self.out.clear();
        self.socket_out.clear();
        self.ring = None;
        self.ring_offer = None;
        self.fds_in.clear();
        self.native.fail_all(&error);
        // Dropping the endpoint closes it (forced); requests it still had are the worker's.
        self.ucx = None;
        if let Some(shared) = &self.shared {
            self.device.close_peer(shared.peer.pid);
        }
        self.error = Some(error);
    }

    /// The user dropped the endpoint: say goodbye and end.
    pub fn close_by_user(&mut self) {
        self.user_closed = true;
        if self.phase == Phase::Established {
            self.queue(encode_frame(&WireMessage::Goodbye), Vec::new());
            self.flush();
        }
        self.fail(TransportError::EndpointClosed);
    }

    /// Whether the engine can forget this connection.
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Dead && (self.user_closed || self.shared.is_none())
    }

    pub fn check_deadlines(&mut self, config: &Config) {
        // A dead endpoint nobody holds any more (its handle was never taken, or is gone
        // without a Close yet) can be forgotten.
        if self.phase == Phase::Dead && self.shared.as_ref().is_some_and(|s| Arc::strong_count(s) == 1) {
            self.user_closed = true;
        }
        match self.phase {
            Phase::Handshaking if self.created.elapsed() > config.connect_timeout => {
                self.fail_peer(format!("handshake not finished within {:?}", config.connect_timeout));
            }
            Phase::Established => {
                // Nobody can use this endpoint any more (never accepted before the
                // listener went, or its handle is gone): close it.
                if self.shared.as_ref().is_some_and(|s| Arc::strong_count(s) == 1) {
                    return self.close_by_user();
                }
                // An idle sender still tells the peer to unmap regions it dropped.
                self.forget_dropped_regions();
                self.flush();
                if let Some(seq) = self.native.overdue_send(config.request_timeout) {
                    self.fail_peer(format!("message {seq} not acknowledged within {:?}", config.request_timeout));
                }
            }
            _ => {}
        }
    }

    pub fn add_stats(&self, s: &mut ContextStats) {
        if self.phase != Phase::Dead || !self.user_closed {
            s.endpoints += 1;
        }
        self.native.add_stats(s);
    }
}

pub(super) fn kind(m: &WireMessage) -> &'static str {
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
    }
}
