//! One connection: its socket I/O, its handshake, and its end.

use super::device::DeviceLane;
use super::native::NativeLane;
use super::stream::{ControlStream, RawStream};
use super::ucx_lane::{direct_device, UcxConn, UcxEngine};
use crate::config::Config;
use crate::context::ContextStats;
use crate::endpoint::{Counters, EndpointShared, PeerInfo};
use crate::error::{ConnectError, TransportError};
use crate::negotiate::{negotiate, Lane};
use crate::wire::{decode_frame, encode_frame, DeviceCopies, Hello, Limits, WireMessage};
use crossbeam_channel::Sender;
use ferrylink_ipc::FdPassingError;
use mio::{Registry, Token};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

/// Bytes read from the socket per call.
const READ_CHUNK: usize = 64 << 10;

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

struct OutFrame {
    bytes: Vec<u8>,
    /// Descriptors sent with the first byte, closed once written.
    fds: Vec<OwnedFd>,
    written: usize,
}

pub(crate) struct Conn {
    pub id: usize,
    stream: ControlStream,
    registry: Registry,
    pub phase: Phase,
    role: Role,
    /// Who the peer is, for error messages.
    pub peer: String,
    /// Read buffer: bytes `rstart..rend` are read and not yet decoded. Its length only
    /// grows (zeroing 64 KiB per read call cost microseconds per message).
    rbuf: Vec<u8>,
    rstart: usize,
    rend: usize,
    pub fds_in: VecDeque<OwnedFd>,
    out: VecDeque<OutFrame>,
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
            rbuf: Vec::new(),
            rstart: 0,
            rend: 0,
            fds_in: VecDeque::new(),
            out: VecDeque::new(),
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

    /// Queues a frame (with descriptors to pass) for writing.
    pub fn queue(&mut self, bytes: Vec<u8>, fds: Vec<OwnedFd>) {
        self.out.push_back(OutFrame { bytes, fds, written: 0 });
    }

    /// Writes what the socket takes now.
    pub fn flush(&mut self) {
        if self.phase == Phase::Dead {
            return;
        }
        while let Some(front) = self.out.front_mut() {
            let fds: Vec<RawFd> =
                if front.written == 0 { front.fds.iter().map(AsRawFd::as_raw_fd).collect() } else { Vec::new() };
            match self.stream.write_with_fds(&front.bytes[front.written..], &fds) {
                Ok(n) => {
                    if let Some(c) = self.shared.as_ref().map(|s| &s.counters) {
                        Counters::add(&c.socket_bytes_written, n as u64);
                        Counters::add(&c.fds_sent, fds.len() as u64);
                    }
                    front.written += n;
                    if !fds.is_empty() {
                        front.fds.clear();
                    }
                    if front.written == front.bytes.len() {
                        self.out.pop_front();
                    }
                }
                Err(FdPassingError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if self.phase == Phase::Handshaking => {
                    // A listener that refuses us writes its reason and closes: read that
                    // reason (or the end of the stream) before giving up.
                    tracing::debug!("write during the handshake failed ({e}); reading the peer's answer");
                    self.out.clear();
                    return;
                }
                Err(e) => {
                    self.fail_peer(format!("writing to the socket failed: {e}"));
                    return;
                }
            }
        }
    }

    /// Socket readiness: read everything, act on every complete message, write replies.
    pub fn on_ready(&mut self, config: &Config, limits: &Limits, local: &Hello) {
        if self.phase == Phase::Dead {
            return;
        }
        self.flush();
        let eof = match self.read_available() {
            Ok(eof) => eof,
            Err(reason) => {
                self.fail_peer(reason);
                return;
            }
        };
        while self.phase != Phase::Dead {
            match decode_frame(&self.rbuf[self.rstart..self.rend], limits) {
                Ok(Some((message, used))) => {
                    self.rstart += used;
                    tracing::trace!(kind = kind(&message), "control message read");
                    self.handle(message, config, local);
                }
                Ok(None) => break,
                Err(e) => {
                    let peer = self.peer.clone();
                    tracing::warn!("peer {peer} sent a bad message: {e}");
                    self.fail(TransportError::PeerFailed { peer, reason: e.to_string() });
                    return;
                }
            }
        }
        if self.rstart == self.rend {
            self.rstart = 0;
            self.rend = 0;
            if self.rbuf.len() > 16 * READ_CHUNK {
                // A burst of large messages grew it: give the memory back.
                self.rbuf = Vec::new();
            }
        }
        if eof && self.phase != Phase::Dead {
            let peer = self.peer.clone();
            self.fail(TransportError::PeerClosed { peer });
            return;
        }
        self.flush();
    }

    /// Reads until the socket would block; `Ok(true)` when the peer closed.
    fn read_available(&mut self) -> Result<bool, String> {
        loop {
            if self.rstart > 0 && self.rstart * 2 >= self.rend {
                self.rbuf.copy_within(self.rstart..self.rend, 0);
                self.rend -= self.rstart;
                self.rstart = 0;
            }
            if self.rbuf.len() - self.rend < READ_CHUNK / 4 {
                self.rbuf.resize(self.rend + READ_CHUNK, 0);
            }
            let mut fds = Vec::new();
            let result = self.stream.read_with_fds(&mut self.rbuf[self.rend..], &mut fds);
            self.fds_in.extend(fds);
            match result {
                Ok(0) => return Ok(true),
                Ok(n) => {
                    self.rend += n;
                    if let Some(c) = self.counters() {
                        Counters::add(&c.socket_bytes_read, n as u64);
                    }
                }
                Err(FdPassingError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
                Err(FdPassingError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(true),
                Err(e) => return Err(format!("reading from the socket failed: {e}")),
            }
            if self.fds_in.len() > 4 * ferrylink_ipc::fd_passing::MAX_FDS_PER_CALL {
                return Err(format!("{} descriptors received that no message claimed", self.fds_in.len()));
            }
        }
    }

    fn handle(&mut self, message: WireMessage, config: &Config, local: &Hello) {
        match (self.phase, message) {
            (Phase::Handshaking, message) => self.handshake(message, local),
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

    fn handshake(&mut self, message: WireMessage, local: &Hello) {
        let local = &super::hello_for_conn(local, self.stream.is_unix(), self.id);
        match (&mut self.role, message) {
            (Role::Acceptor { .. }, WireMessage::Hello(remote)) => match negotiate(local, &remote) {
                Ok(lane) => {
                    let welcome = WireMessage::Welcome { hello: local.clone(), lane };
                    self.queue(encode_frame(&welcome), Vec::new());
                    let copies = remote.device_copies;
                    self.establish(remote, lane, copies);
                }
                Err(e) => self.refuse(e.to_string()),
            },
            (Role::Connector { .. }, WireMessage::Welcome { hello, lane }) => match negotiate(local, &hello) {
                Ok(ours) if ours == lane => self.establish(hello, lane, local.device_copies),
                Ok(ours) => self.refuse(format!("the listener chose the {lane} lane, this side computed {ours}")),
                Err(e) => self.refuse(e.to_string()),
            },
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
        WireMessage::PushTargets { .. } => "PushTargets",
        WireMessage::PushDone { .. } => "PushDone",
        WireMessage::PushOffer { .. } => "PushOffer",
        WireMessage::DeclineOffer { .. } => "DeclineOffer",
    }
}
