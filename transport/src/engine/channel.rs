//! A connection's control channel: its Unix (or TCP) socket, and its control rings.
//!
//! Messages are queued as encoded frames (`Conn::queue`) and written when the socket or
//! the ring takes them (`Conn::flush`); what is read is decoded and handled in order
//! (`Conn::on_ready` for the socket, `Conn::poll_ring` for the ring, on every turn of
//! the progress thread).
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

use super::conn::{kind, Conn, Phase, Role};
use super::stream::ControlStream;
use crate::config::Config;
use crate::endpoint::{Counters, EndpointShared};
use crate::error::TransportError;
use crate::wire::{decode_frame, encode_frame, Hello, Limits, WireMessage};
use ferrylink_ipc::control_ring::{ControlRingMemory, Direction, RingReader, RingWriter};
use ferrylink_ipc::FdPassingError;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

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
                    tracing::trace!("control bytes written to the socket");
                }
            }
            Err(FdPassingError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub(super) struct OutFrame {
    bytes: Vec<u8>,
    /// Descriptors sent with the first byte, closed once written.
    fds: Vec<OwnedFd>,
    written: usize,
    /// Control-ring mode: the frame's descriptors went ahead on the socket; it may enter
    /// the ring only once the socket queue is empty.
    after_socket: bool,
}

impl OutFrame {
    pub(super) fn new(bytes: Vec<u8>, fds: Vec<OwnedFd>) -> Self {
        Self { bytes, fds, written: 0, after_socket: false }
    }
}

/// Bytes read and not yet decoded: `buf[start..end]`. The vector only grows (zeroing
/// 64 KiB per read cost microseconds per message).
#[derive(Default)]
pub(super) struct ReadBuffer {
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
pub(super) struct ControlRing {
    writer: RingWriter,
    reader: RingReader,
    /// Bytes read from the ring, not yet decoded.
    input: ReadBuffer,
}

impl Conn {
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
        let counters = self.shared.as_ref().map(|s| &s.counters);
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
                    tracing::trace!("control message published in the ring");
                }
                Err(e) => return self.fail_peer(e.to_string()),
            }
        }
        if published > 0 {
            if let Some(c) = counters {
                Counters::add(&c.socket_bytes_written, published as u64);
            }
            if ring.writer.reader_sleeping() {
                if let Some(c) = counters {
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
    pub(super) fn start_ring(&mut self, memory: Arc<ControlRingMemory>) {
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
            let input = match (source, &mut self.ring) {
                (Source::Socket, _) => &mut self.socket_in,
                (Source::Ring, Some(ring)) => &mut ring.input,
                (Source::Ring, None) => return,
            };
            let message = match decode_frame(input.pending(), limits) {
                Ok(Some((message, used))) => {
                    input.consume(used);
                    message
                }
                Ok(None) => break,
                Err(e) => {
                    let peer = self.peer.clone();
                    tracing::warn!("peer {peer} sent a bad message: {e}");
                    self.fail(TransportError::PeerFailed { peer, reason: e.to_string() });
                    return;
                }
            };
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

    /// Acceptor: maps the control rings a `Hello` offers (their memfd came with it), when
    /// this side uses rings too; `None` (the socket carries everything) otherwise.
    pub(super) fn map_offered_ring(&mut self, offered: Option<u64>, config: &Config) -> Option<Arc<ControlRingMemory>> {
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
}
