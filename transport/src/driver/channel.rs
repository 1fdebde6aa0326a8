//! A connection's control channel: its Unix (or TCP) socket, and its control rings.
//!
//! Messages are queued as encoded frames ([`ControlChannel::queue`]) and written when the
//! socket or the ring takes them ([`ControlChannel::flush`]); what is read is decoded in
//! order ([`ControlChannel::next_message`]), from the socket on readiness and from the
//! ring on every turn of the progress thread.
//!
//! # Control rings
//! Over a Unix socket the connecting side offers a pair of shared-memory rings with its
//! `Hello` (`ferrylink_ipc::control_ring`, the memfd passed along); the acceptor maps them
//! and says so in its `Welcome`. From then on each side writes its control messages into
//! its ring and reads the peer's ring on every turn: no system call on either side. The
//! socket stays for what memory cannot do:
//! - **descriptors**: a message that passes fds is preceded on the socket by a `Wake`
//!   carrying them; its ring bytes are written only once that `Wake` is out, so the
//!   receiver, which reads the socket when a ring message needs fds it lacks, finds them;
//! - **wake-ups**: a progress thread about to sleep says so in its ring, and a writer that
//!   sees this after publishing sends a `Wake`;
//! - **the end of the peer**: EOF on the socket, handled after the ring is drained, so a
//!   message written just before the peer exited is not lost.

use super::stream::ControlStream;
use crate::command::RawStream;
use ferrylink_ipc::control_ring::{ControlRingMemory, Direction, RingReader, RingWriter};
use ferrylink_ipc::FdPassingError;
use ferrylink_proto::stats::Counters;
use ferrylink_proto::wire::{decode_frame, encode_frame, Limits, WireError, WireMessage};
use mio::{Registry, Token};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

// The core announces at most as many regions per message as one socket call passes fds.
const _: () = assert!(ferrylink_proto::wire::MAX_NEW_REGIONS == ferrylink_ipc::fd_passing::MAX_FDS_PER_CALL);

/// Bytes read from the socket per call.
const READ_CHUNK: usize = 64 << 10;

/// Writes queued frames until the socket would block (`Ok`) or fails.
fn write_to_socket(
    stream: &ControlStream,
    queue: &mut VecDeque<OutFrame>,
    counters: Option<&Counters>,
) -> Result<(), FdPassingError> {
    while let Some(front) = queue.front_mut() {
        let fds: Vec<RawFd> =
            if front.written == 0 { front.fds.iter().map(AsRawFd::as_raw_fd).collect() } else { Vec::new() };
        match stream.write_with_fds(&front.bytes[front.written..], &fds) {
            Ok(n) => {
                if let Some(c) = counters {
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
pub(super) enum Source {
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

/// A connection's socket, its control rings once both sides use them, and what is
/// queued and read on them.
pub(super) struct ControlChannel {
    stream: ControlStream,
    registry: Registry,
    /// Counts bytes once the connection is established.
    counters: Arc<Counters>,
    counting: bool,
    /// Bytes read from the socket, not yet decoded.
    socket_in: ReadBuffer,
    /// Descriptors received that no message has claimed yet.
    pub fds_in: VecDeque<OwnedFd>,
    /// Control messages to write: to the socket, or in control-ring mode to the ring.
    out: VecDeque<OutFrame>,
    /// Control-ring mode: what still goes to the socket (`Wake`s, descriptors, and what
    /// was queued before the rings were taken into use).
    socket_out: VecDeque<OutFrame>,
    ring: Option<ControlRing>,
    closed: bool,
    /// The socket left the poll registry (and shut down both ways).
    deregistered: bool,
}

impl ControlChannel {
    /// The channel of a connected stream, registered with the progress thread's poll.
    pub fn new(raw: RawStream, registry: &Registry, token: Token, counters: Arc<Counters>) -> std::io::Result<Self> {
        let mut stream = ControlStream::from_raw(raw)?;
        let registry = registry.try_clone()?;
        stream.register(&registry, token)?;
        Ok(Self {
            stream,
            registry,
            counters,
            counting: false,
            socket_in: ReadBuffer::default(),
            fds_in: VecDeque::new(),
            out: VecDeque::new(),
            socket_out: VecDeque::new(),
            ring: None,
            closed: false,
            deregistered: false,
        })
    }

    /// From now on, bytes are counted in the endpoint's counters.
    pub fn start_counting(&mut self) {
        self.counting = true;
    }

    fn counters(&self) -> Option<&Counters> {
        self.counting.then_some(&*self.counters)
    }

    /// Queues a message (with descriptors to pass) for writing.
    pub fn queue(&mut self, message: &WireMessage, fds: Vec<OwnedFd>) {
        let bytes = encode_frame(message);
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

    /// Writes what the socket (or the ring) takes now. `handshaking`: a failed write is
    /// no error yet (a listener that refuses us writes its reason and closes: that
    /// reason, or the end of the stream, is read next).
    pub fn flush(&mut self, handshaking: bool) -> Result<(), String> {
        // Every progress turn flushes each connection: the usual case, nothing queued,
        // returns at once.
        if self.closed || (self.out.is_empty() && self.socket_out.is_empty()) {
            return Ok(());
        }
        let counters = self.counting.then(|| self.counters.clone());
        let socket_queue = if self.ring.is_none() { &mut self.out } else { &mut self.socket_out };
        let written = write_to_socket(&self.stream, socket_queue, counters.as_deref());
        self.after_socket_write(written, handshaking)?;
        let Some(ring) = self.ring.as_mut() else { return Ok(()) };
        let mut published = 0usize;
        while let Some(front) = self.out.front_mut() {
            if front.after_socket && !self.socket_out.is_empty() {
                break; // its descriptors are not all out yet
            }
            let n = ring.writer.write(&front.bytes[front.written..]).map_err(|e| e.to_string())?;
            published += n;
            front.written += n;
            if front.written < front.bytes.len() {
                break; // the ring is full
            }
            self.out.pop_front();
            tracing::trace!("control message published in the ring");
        }
        if published == 0 {
            return Ok(());
        }
        if let Some(c) = &counters {
            Counters::add(&c.socket_bytes_written, published as u64);
        }
        if ring.writer.reader_sleeping() {
            if let Some(c) = &counters {
                Counters::add(&c.wakes_sent, 1);
            }
            self.socket_out.push_back(OutFrame::new(encode_frame(&WireMessage::Wake), Vec::new()));
            let written = write_to_socket(&self.stream, &mut self.socket_out, counters.as_deref());
            self.after_socket_write(written, handshaking)?;
        }
        Ok(())
    }

    fn after_socket_write(&mut self, written: Result<(), FdPassingError>, handshaking: bool) -> Result<(), String> {
        match written {
            Ok(()) => Ok(()),
            Err(e) if handshaking => {
                tracing::debug!("write during the handshake failed ({e}); reading the peer's answer");
                self.out.clear();
                Ok(())
            }
            Err(e) => Err(format!("writing to the socket failed: {e}")),
        }
    }

    /// Whether control messages travel through the rings.
    pub fn uses_ring(&self) -> bool {
        self.ring.is_some() && !self.closed
    }

    /// Whether control messages wait for room in a full ring.
    pub fn ring_output_blocked(&self) -> bool {
        self.uses_ring() && !self.out.is_empty()
    }

    /// Before the progress thread blocks: tells the peer's writer to wake it; `true`
    /// when ring bytes arrived meanwhile (it must not block then).
    pub fn arm_ring_sleep(&mut self) -> bool {
        match &mut self.ring {
            Some(ring) if !self.closed => ring.reader.arm_sleep(),
            _ => false,
        }
    }

    /// The progress thread is awake again.
    pub fn disarm_ring_sleep(&mut self) {
        if let Some(ring) = &mut self.ring {
            ring.reader.disarm_sleep();
        }
    }

    /// Both sides use the rings from now on; what was queued so far goes by socket.
    pub fn start_ring(&mut self, memory: &Arc<ControlRingMemory>, connector: bool) {
        let (mine, theirs) = if connector {
            (Direction::ConnectorToAcceptor, Direction::AcceptorToConnector)
        } else {
            (Direction::AcceptorToConnector, Direction::ConnectorToAcceptor)
        };
        self.socket_out.append(&mut self.out);
        self.ring = Some(ControlRing {
            writer: memory.writer(mine),
            reader: memory.reader(theirs),
            input: ReadBuffer::default(),
        });
        tracing::debug!(ring_bytes = memory.ring_bytes(), "control messages go through shared-memory rings");
    }

    /// Reads the socket until it would block; `Ok(true)` when the peer closed.
    pub fn read_socket(&mut self) -> Result<bool, String> {
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

    /// Reads what the peer wrote into its ring; how many bytes.
    pub fn read_ring(&mut self) -> Result<usize, String> {
        let Some(ring) = &mut self.ring else { return Ok(0) };
        if self.closed {
            return Ok(0);
        }
        let mut read = 0usize;
        loop {
            let ControlRing { reader, input, .. } = &mut *ring;
            let space = input.space();
            let room = space.len();
            let n = reader.read(space).map_err(|e| e.to_string())?;
            input.filled(n);
            read += n;
            if n < room {
                break;
            }
        }
        if read > 0 {
            if let Some(c) = self.counters() {
                Counters::add(&c.socket_bytes_read, read as u64);
            }
        }
        Ok(read)
    }

    /// The next complete message read from `source`.
    pub fn next_message(&mut self, source: Source, limits: &Limits) -> Result<Option<WireMessage>, WireError> {
        let input = match (source, &mut self.ring) {
            (Source::Socket, _) => &mut self.socket_in,
            (Source::Ring, Some(ring)) => &mut ring.input,
            (Source::Ring, None) => return Ok(None),
        };
        match decode_frame(input.pending(), limits)? {
            Some((message, used)) => {
                input.consume(used);
                Ok(Some(message))
            }
            None => Ok(None),
        }
    }

    /// Acceptor: maps the control rings a `Hello` offers (their memfd came with it),
    /// when `ring_bytes` allows rings on this side; `None` (the socket carries
    /// everything) otherwise.
    pub fn map_offered_ring(
        &mut self,
        offered: Option<u64>,
        ring_bytes: usize,
        peer: &str,
    ) -> Option<Arc<ControlRingMemory>> {
        let fd = self.fds_in.pop_front();
        // Nothing else may come with a Hello.
        self.fds_in.clear();
        let bytes = offered?;
        if ring_bytes == 0 || !self.stream.is_unix() {
            return None;
        }
        let Some(fd) = fd else {
            tracing::warn!("{peer} offered control rings without their memory; using the socket");
            return None;
        };
        match ControlRingMemory::import(fd, bytes) {
            Ok(memory) => Some(memory),
            Err(e) => {
                tracing::warn!("control rings offered by {peer} not taken ({e}); using the socket");
                None
            }
        }
    }

    /// The connection is over: the socket closes, queues and rings go.
    pub fn close(&mut self) {
        if !self.closed {
            self.close_for_writing();
        }
        if self.deregistered {
            return;
        }
        self.deregistered = true;
        self.stream.deregister(&self.registry);
        self.stream.shutdown();
    }

    /// The connection is over for this side, which waits for the peer to hang up: the
    /// socket's writing half closes (the peer reads EOF), queues and rings go, and the
    /// socket is still read ([`ControlChannel::peer_hung_up`]) until [`ControlChannel::close`].
    pub fn close_for_writing(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.stream.shutdown_write();
        self.out.clear();
        self.socket_out.clear();
        self.ring = None;
        self.fds_in.clear();
    }

    /// After [`ControlChannel::close_for_writing`]: reads and drops what the peer still
    /// sends; whether it hung up (EOF, or the socket failed).
    pub fn peer_hung_up(&mut self) -> bool {
        let mut sink = [0u8; 4096];
        loop {
            let mut fds = Vec::new();
            match self.stream.read_with_fds(&mut sink, &mut fds) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(FdPassingError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
                Err(_) => return true,
            }
        }
    }

    /// [`ControlChannel::peer_hung_up`], waiting for it at most `within` (outside the
    /// poll loop: the progress thread is shutting down).
    pub fn wait_for_hangup(&mut self, within: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        loop {
            if self.peer_hung_up() {
                return true;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
            let ms = i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX);
            let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
            if poll(&mut [PollFd::new(self.stream.as_fd(), PollFlags::POLLIN)], timeout).is_err() {
                return false;
            }
        }
    }
}
