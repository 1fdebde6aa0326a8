//! One connection: its control channel, its handshake, and its end.
//!
//! # Control rings
//! Over a Unix socket the connecting side offers a pair of shared-memory rings with its
//! `Hello` (`ferrylink_ipc::control_ring`, the memfd passed along); the acceptor maps them
//! and says so in its `Welcome`. From then on each side writes its control messages into
//! its ring and reads the peer's ring on every turn of its progress thread: no system call
//! on either side, where a socket hop cost 3–4 µs on the H200 machine (a 1 MB device round
//! trip makes two such hops on its critical path, plus the acks and offers beside it).
//! The socket stays for what memory cannot do:
//! - **descriptors**: a message that passes fds is preceded on the socket by a `Wake`
//!   carrying them; its ring bytes are written only once that `Wake` is out, so the
//!   receiver, which reads the socket when a ring message needs fds it lacks, finds them;
//! - **wake-ups**: a progress thread about to sleep says so in its ring, and a writer that
//!   sees this after publishing sends a `Wake` (see the ring module for the handshake
//!   between the two);
//! - **the end of the peer**: EOF on the socket, handled after the ring is drained, so a
//!   message written just before the peer exited is not lost.

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
use ferrylink_ipc::control_ring::{ControlRingMemory, Direction, RingReader, RingWriter};
use ferrylink_ipc::FdPassingError;
use mio::{Registry, Token};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

/// Bytes read from the socket per call.
const READ_CHUNK: usize = 64 << 10;

/// Writes queued frames until the socket would block (`Ok`) or fails.
fn write_to_socket(
    stream: &ControlStream,
    queue: &mut VecDeque<OutFrame>,
    shared: Option<&EndpointShared>,
) -> Result<(), FdPassingError> {
    while let Some(front) = queue.front_mut() {
        let fds: Vec<RawFd> =
            if front.written == 0 { front.fds.iter().map(AsRawFd::as_raw_fd).collect() } else { Vec::new() };
        match stream.write_with_fds(&front.bytes[front.written..], &fds) {
            Ok(n) => {
                if let Some(c) = shared.map(|s| &s.counters) {
                    Counters::add(&c.socket_bytes_written, n as u64);
                    Counters::add(&c.fds_sent, fds.len() as u64);
                }
                front.written += n;
                if !fds.is_empty() {
                    front.fds.clear();
                }
                if front.written == front.bytes.len() {
                    queue.pop_front();
                }
            }
            Err(FdPassingError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

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
    /// Control-ring mode: the frame's descriptors went ahead on the socket; it may enter
    /// the ring only once the socket queue is empty.
    after_socket: bool,
}

impl OutFrame {
    fn new(bytes: Vec<u8>, fds: Vec<OwnedFd>) -> Self {
        Self { bytes, fds, written: 0, after_socket: false }
    }
}

/// Bytes read and not yet decoded: `buf[start..end]`. The vector only grows (zeroing
/// 64 KiB per read cost microseconds per message).
#[derive(Default)]
struct ReadBuffer {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl ReadBuffer {
    /// Room for more bytes (at least a quarter chunk), pending bytes moved to the front
    /// when they are few.
    fn space(&mut self) -> &mut [u8] {
        if self.start > 0 && self.start * 2 >= self.end {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() - self.end < READ_CHUNK / 4 {
            self.buf.resize(self.end + READ_CHUNK, 0);
        }
        &mut self.buf[self.end..]
    }

    fn filled(&mut self, n: usize) {
        self.end += n;
    }

    fn pending(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.buf.len() > 16 * READ_CHUNK {
                // A burst of large messages grew it: give the memory back.
                self.buf = Vec::new();
            }
        }
    }
}

/// Where a decoded message came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Socket,
    Ring,
}

/// A connection's control rings, once both sides use them.
struct ControlRing {
    writer: RingWriter,
    reader: RingReader,
    /// Bytes read from the ring, not yet decoded.
    input: ReadBuffer,
}

pub(crate) struct Conn {
    pub id: usize,
    stream: ControlStream,
    registry: Registry,
    pub phase: Phase,
    role: Role,
    /// Who the peer is, for error messages.
    pub peer: String,
    /// Bytes read from the socket, not yet decoded.
    socket_in: ReadBuffer,
    pub fds_in: VecDeque<OwnedFd>,
    /// Control messages to write: to the socket, or in control-ring mode to the ring.
    out: VecDeque<OutFrame>,
    /// Control-ring mode: what still goes to the socket (`Wake`s, descriptors, and what
    /// was queued before the rings were taken into use).
    socket_out: VecDeque<OutFrame>,
    /// Connector: the rings offered with the `Hello`, until the `Welcome` answers.
    ring_offer: Option<Arc<ControlRingMemory>>,
    /// The rings, once both sides use them.
    ring: Option<ControlRing>,
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

    /// Queues a frame (with descriptors to pass) for writing.
    pub fn queue(&mut self, bytes: Vec<u8>, fds: Vec<OwnedFd>) {
        if self.ring.is_none() {
            self.out.push_back(OutFrame::new(bytes, fds));
            return;
        }
        let after_socket = !fds.is_empty();
        if after_socket {
            self.socket_out.push_back(OutFrame::new(encode_frame(&WireMessage::Wake), fds));
        }
        self.out.push_back(OutFrame { after_socket, ..OutFrame::new(bytes, Vec::new()) });
    }

    /// Writes what the socket (or the ring) takes now.
    pub fn flush(&mut self) {
        if self.phase == Phase::Dead {
            return;
        }
        if self.ring.is_none() {
            let written = write_to_socket(&self.stream, &mut self.out, self.shared.as_deref());
            return self.after_socket_write(written);
        }
        let written = write_to_socket(&self.stream, &mut self.socket_out, self.shared.as_deref());
        self.after_socket_write(written);
        if self.phase == Phase::Dead {
            return;
        }
        let ring = self.ring.as_mut().expect("checked");
        let mut published = 0usize;
        while let Some(front) = self.out.front_mut() {
            if front.after_socket && !self.socket_out.is_empty() {
                break; // its descriptors are not all out yet
            }
            match ring.writer.write(&front.bytes[front.written..]) {
                Ok(n) => {
                    published += n;
                    front.written += n;
                    if front.written < front.bytes.len() {
                        break; // the ring is full
                    }
                    self.out.pop_front();
                }
                Err(e) => return self.fail_peer(e.to_string()),
            }
        }
        if published > 0 {
            if let Some(c) = self.shared.as_ref().map(|s| &s.counters) {
                Counters::add(&c.socket_bytes_written, published as u64);
            }
            if ring.writer.reader_sleeping() {
                if let Some(c) = self.shared.as_ref().map(|s| &s.counters) {
                    Counters::add(&c.wakes_sent, 1);
                }
                self.socket_out.push_back(OutFrame::new(encode_frame(&WireMessage::Wake), Vec::new()));
                let written = write_to_socket(&self.stream, &mut self.socket_out, self.shared.as_deref());
                self.after_socket_write(written);
            }
        }
    }

    /// Acts on the outcome of a socket write.
    fn after_socket_write(&mut self, written: Result<(), FdPassingError>) {
        match written {
            Ok(()) => {}
            Err(e) if self.phase == Phase::Handshaking => {
                // A listener that refuses us writes its reason and closes: read that
                // reason (or the end of the stream) before giving up.
                tracing::debug!("write during the handshake failed ({e}); reading the peer's answer");
                self.out.clear();
            }
            Err(e) => self.fail_peer(format!("writing to the socket failed: {e}")),
        }
    }

    /// Whether this connection's messages travel through control rings (established, not
    /// dead): its socket then has little to say.
    pub fn ring_carries_messages(&self) -> bool {
        self.ring.is_some() && self.phase == Phase::Established
    }

    /// Whether control messages wait for room in a full ring (the engine then comes back
    /// soon instead of sleeping a whole tick).
    pub fn ring_output_blocked(&self) -> bool {
        self.ring.is_some() && !self.out.is_empty() && self.phase != Phase::Dead
    }

    /// Control-ring mode, before the progress thread blocks: tells the peer's writer to
    /// wake it; `true` when ring bytes arrived meanwhile (it must not block then).
    pub fn arm_ring_sleep(&mut self) -> bool {
        match &mut self.ring {
            Some(ring) if self.phase != Phase::Dead => ring.reader.arm_sleep(),
            _ => false,
        }
    }

    /// The progress thread is awake again.
    pub fn disarm_ring_sleep(&mut self) {
        if let Some(ring) = &mut self.ring {
            ring.reader.disarm_sleep();
        }
    }

    /// Connector: the rings offered with the `Hello` (taken into use if the `Welcome`
    /// says the acceptor mapped them).
    pub fn offer_ring(&mut self, memory: Arc<ControlRingMemory>) {
        self.ring_offer = Some(memory);
    }

    /// Both sides use the rings from now on; what was queued so far goes by socket.
    fn start_ring(&mut self, memory: Arc<ControlRingMemory>) {
        let (mine, theirs) = match self.role {
            Role::Connector { .. } => (Direction::ConnectorToAcceptor, Direction::AcceptorToConnector),
            Role::Acceptor { .. } => (Direction::AcceptorToConnector, Direction::ConnectorToAcceptor),
        };
        self.socket_out.append(&mut self.out);
        self.ring = Some(ControlRing {
            writer: memory.writer(mine),
            reader: memory.reader(theirs),
            input: ReadBuffer::default(),
        });
        tracing::debug!(peer = %self.peer, ring_bytes = memory.ring_bytes(), "control messages go through shared-memory rings");
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
        self.handle_buffered(Source::Socket, config, limits, local);
        if eof && self.phase != Phase::Dead {
            // What the peer wrote into the ring before it went is still to be read.
            self.poll_ring(config, limits, local);
            if self.phase != Phase::Dead {
                let peer = self.peer.clone();
                self.fail(TransportError::PeerClosed { peer });
                return;
            }
        }
        self.flush();
    }

    /// Control-ring mode: reads and acts on what the peer wrote into its ring; whether
    /// anything was there.
    pub fn poll_ring(&mut self, config: &Config, limits: &Limits, local: &Hello) -> bool {
        let Some(ring) = &mut self.ring else { return false };
        if self.phase == Phase::Dead {
            return false;
        }
        let mut read = 0usize;
        loop {
            let ControlRing { reader, input, .. } = &mut *ring;
            let space = input.space();
            let room = space.len();
            match reader.read(space) {
                Ok(n) => {
                    input.filled(n);
                    read += n;
                    if n < room {
                        break;
                    }
                }
                Err(e) => {
                    self.protocol_error(&e.to_string());
                    return true;
                }
            }
        }
        if read == 0 {
            return false;
        }
        if let Some(c) = self.counters() {
            Counters::add(&c.socket_bytes_read, read as u64);
        }
        self.handle_buffered(Source::Ring, config, limits, local);
        self.flush();
        true
    }

    /// Decodes and acts on every complete message read from `source`.
    fn handle_buffered(&mut self, source: Source, config: &Config, limits: &Limits, local: &Hello) {
        while self.phase != Phase::Dead {
            let input = match (source, &self.ring) {
                (Source::Socket, _) => &self.socket_in,
                (Source::Ring, Some(ring)) => &ring.input,
                (Source::Ring, None) => return,
            };
            let (message, used) = match decode_frame(input.pending(), limits) {
                Ok(Some(decoded)) => decoded,
                Ok(None) => break,
                Err(e) => {
                    let peer = self.peer.clone();
                    tracing::warn!("peer {peer} sent a bad message: {e}");
                    self.fail(TransportError::PeerFailed { peer, reason: e.to_string() });
                    return;
                }
            };
            match (source, &mut self.ring) {
                (Source::Socket, _) => self.socket_in.consume(used),
                (Source::Ring, Some(ring)) => ring.input.consume(used),
                (Source::Ring, None) => unreachable!("checked above"),
            }
            tracing::trace!(kind = kind(&message), ?source, "control message read");
            if source == Source::Ring {
                self.pull_descriptors_for(&message, config, limits, local);
            }
            self.handle(message, config, local);
        }
    }

    /// Control-ring mode: a ring message that passes descriptors had them sent ahead on
    /// the socket; read the socket now if they are not here yet.
    fn pull_descriptors_for(&mut self, message: &WireMessage, config: &Config, limits: &Limits, local: &Hello) {
        let WireMessage::Regions(list) = message else { return };
        if self.fds_in.len() >= list.len() {
            return;
        }
        match self.read_available() {
            Ok(_) => self.handle_buffered(Source::Socket, config, limits, local),
            Err(reason) => self.fail_peer(reason),
        }
    }

    /// Reads until the socket would block; `Ok(true)` when the peer closed.
    fn read_available(&mut self) -> Result<bool, String> {
        loop {
            let mut fds = Vec::new();
            let result = self.stream.read_with_fds(self.socket_in.space(), &mut fds);
            self.fds_in.extend(fds);
            match result {
                Ok(0) => return Ok(true),
                Ok(n) => {
                    self.socket_in.filled(n);
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

    /// Acceptor: maps the control rings a `Hello` offers (their memfd came with it), when
    /// this side uses rings too; `None` (the socket carries everything) otherwise.
    fn map_offered_ring(&mut self, offered: Option<u64>, config: &Config) -> Option<Arc<ControlRingMemory>> {
        let fd = self.fds_in.pop_front();
        // Nothing else may come with a Hello.
        self.fds_in.clear();
        let bytes = offered?;
        if config.control_ring_bytes == 0 || !self.stream.is_unix() {
            return None;
        }
        let Some(fd) = fd else {
            tracing::warn!("{} offered control rings without their memory; using the socket", self.peer);
            return None;
        };
        match ControlRingMemory::import(fd, bytes) {
            Ok(memory) => Some(memory),
            Err(e) => {
                tracing::warn!("control rings offered by {} not taken ({e}); using the socket", self.peer);
                None
            }
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
