//! What the root tests share beyond the kit (`ferrylink-testkit`, re-exported here): the
//! ferrylink adaptor of the kit's echo check, raw protocol peers, frame and process
//! helpers, the leak tests' baseline (`leak_baseline.rs`) and peers paused while a load
//! posts its window (`paused.rs`).
#![allow(dead_code, unused_imports)]

pub use ferrylink_testkit::echo::{self, Load};
pub use ferrylink_testkit::peer::reached;
pub use ferrylink_testkit::{checksum, eventually, pattern, peer_test, require_gpu, ucx_or_skip, Peer, Peers};

mod leak_baseline;
mod listening;
pub mod onesided;
mod paused;
pub use leak_baseline::{levels, LeakBaseline, LEAK_TOLERANCE};
pub use listening::{connect_from_env, serve_echo_from_env, serve_echo_reporting_mappings, ListeningParent, PATH_VAR};
pub use paused::{PausedPeers, ResumedAtFirstWait};

use std::borrow::Cow;
use std::time::{Duration, Instant};

/// ferrylink's endpoints and messages, for the kit's echo peer and load check.
pub struct Ferry;

impl echo::Transport for Ferry {
    type Endpoint = ferrylink::transport::Endpoint;
    type Message = ferrylink::Message;
    type Sending = ferrylink::transport::SendRequest;
    type Receiving = ferrylink::transport::RecvRequest;

    fn send(&self, ep: &Self::Endpoint, message: Self::Message) -> Self::Sending {
        ep.send(message)
    }
    fn recv(&self, ep: &Self::Endpoint) -> Self::Receiving {
        ep.recv()
    }
    fn wait_sent(&self, req: &mut Self::Sending, bound: Duration) -> Option<Result<(), String>> {
        req.wait_timeout(bound).map(|r| r.map(drop).map_err(|e| e.to_string()))
    }
    fn wait_received(&self, req: &mut Self::Receiving, bound: Duration) -> Option<Result<Self::Message, String>> {
        req.wait_timeout(bound).map(|r| r.map_err(|e| e.to_string()))
    }
    fn message(&self, header: Vec<u8>, frames_of: Option<Self::Message>) -> Self::Message {
        ferrylink::Message::new(header, frames_of.map(|m| m.frames).unwrap_or_default())
    }
    fn header<'m>(&self, message: &'m Self::Message) -> &'m [u8] {
        &message.header
    }
    fn frames<'m>(&self, message: &'m Self::Message) -> Vec<Cow<'m, [u8]>> {
        message
            .frames
            .iter()
            .map(|f| match f {
                ferrylink::Frame::Host(h) => Cow::Borrowed(h.as_slice()),
                ferrylink::Frame::Device(d) => Cow::Owned(d.to_vec().expect("device to host copy")),
            })
            .collect()
    }
}

/// Checks an echo (the kit's protocol) of a message with `header` and frames `sent`.
pub fn verify_echo(header: &[u8], sent: &[Vec<u8>], back: &ferrylink::Message) {
    echo::verify(&Ferry, header, sent, back)
}

/// Sends the echo peer on `ep` its stop message.
pub fn stop_echo(ep: &ferrylink::transport::Endpoint) {
    echo::stop(&Ferry, ep, Duration::from_secs(30))
}

/// A private directory for a test's sockets.
pub fn socket_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("ferrylink-test-").tempdir().expect("tempdir")
}

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

/// A frame's bytes, copied to the host when it is device memory.
pub fn frame_bytes(frame: &ferrylink::Frame) -> Vec<u8> {
    match frame {
        ferrylink::Frame::Host(h) => h.to_vec(),
        ferrylink::Frame::Device(d) => d.to_vec().expect("device to host copy"),
    }
}

/// A device buffer on `ordinal` from the shared exportable pool, filled with `bytes`.
pub fn device_buffer_with(ordinal: usize, bytes: &[u8]) -> ferrylink::DeviceBuffer {
    let buf = ferrylink::memory::cuda::DevicePool::shared(ordinal).unwrap().alloc(bytes.len()).unwrap();
    buf.copy_from_host(bytes).unwrap();
    buf
}

/// A protocol peer that speaks the wire format by hand over a Unix socket, so a test can
/// stop at any step of the protocol (or say things a real endpoint never says).
pub struct RawPeer {
    pub stream: std::os::unix::net::UnixStream,
    buf: Vec<u8>,
}

impl RawPeer {
    /// Connects without a handshake.
    pub fn connect(path: &std::path::Path) -> Self {
        Self::from_stream(std::os::unix::net::UnixStream::connect(path).expect("raw connect"))
    }

    /// Speaks over an accepted or connected stream (reads bounded to 10 s).
    pub fn from_stream(stream: std::os::unix::net::UnixStream) -> Self {
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Self { stream, buf: Vec::new() }
    }

    /// Connects and completes the handshake as `hello` (usually a context's `local_hello`).
    pub fn handshaken(path: &std::path::Path, hello: &ferrylink::transport::wire::Hello) -> Self {
        use ferrylink::transport::wire::WireMessage;
        let mut raw = Self::connect(path);
        raw.write(&WireMessage::Hello(hello.clone()));
        match raw.read_message() {
            Some(WireMessage::Welcome { .. }) => raw,
            other => panic!("expected a Welcome, got {other:?}"),
        }
    }

    /// Writes raw bytes (errors ignored: the other side may have closed already).
    pub fn write_bytes(&mut self, bytes: &[u8]) {
        use std::io::Write;
        let _ = self.stream.write_all(bytes);
    }

    /// Writes one message.
    pub fn write(&mut self, message: &ferrylink::transport::wire::WireMessage) {
        self.write_bytes(&ferrylink::transport::wire::encode_frame(message));
    }

    /// Writes one message with descriptors attached (`SCM_RIGHTS`).
    pub fn write_with_fds(&mut self, message: &ferrylink::transport::wire::WireMessage, fds: &[std::os::fd::RawFd]) {
        let bytes = ferrylink::transport::wire::encode_frame(message);
        let n = ferrylink::ipc::send_with_fds(&self.stream, &bytes, fds).expect("send_with_fds");
        self.write_bytes(&bytes[n..]);
    }

    /// Reads the next whole message (bounded by the socket's read timeout); `None` at the
    /// end of the stream, on a timeout or on bytes that do not decode.
    pub fn read_message(&mut self) -> Option<ferrylink::transport::wire::WireMessage> {
        use ferrylink::transport::wire::{decode_frame, Limits};
        use std::io::Read;
        let limits = Limits::default();
        loop {
            match decode_frame(&self.buf, &limits) {
                Ok(Some((message, used))) => {
                    self.buf.drain(..used);
                    return Some(message);
                }
                Ok(None) => {}
                Err(_) => return None,
            }
            let mut chunk = [0u8; 64 << 10];
            match self.stream.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }
}

// ---- UCX lane helpers (tests/reliability_ucx.rs, tests/ucx_lane.rs) ----

/// A context with `config` (its lane policy forcing UCX), or `None` after printing
/// `skipped: UCX not available` when UCX cannot load; with `FERRYLINK_REQUIRE_UCX=1` it
/// fails instead.
pub fn ucx_context_or_skip_with(config: ferrylink::transport::Config) -> Option<ferrylink::transport::Context> {
    ucx_or_skip(ferrylink::transport::Context::new(config))
}

/// The tag of a UCX-lane payload message (as `transport/src/engine/ucx_lane.rs` builds
/// it): `prefix (16 bits) | seq (24) | frame index (12) | chunk (12)`.
pub fn ucx_payload_tag(prefix: u16, seq: u64, frame: usize, chunk: usize) -> u64 {
    ((prefix as u64) << 48) | ((seq & 0xFF_FFFF) << 24) | (((frame as u64) & 0xFFF) << 12) | ((chunk as u64) & 0xFFF)
}

/// A UCX-lane peer that speaks the control protocol by hand (over a Unix or TCP stream)
/// and moves payloads with its own UCX worker, so a test can stop it at any step: after
/// the descriptor, between two frames' payloads, after the payloads and before the ack.
/// Single-threaded: every wait progresses the worker.
pub struct RawUcxPeer {
    /// The UCX endpoint to the other side's worker (dropped before the worker).
    pub ep: ferrylink_ucx::UcxEndpoint,
    pub worker: ferrylink_ucx::UcxWorker,
    _context: ferrylink_ucx::UcxContext,
    control: RawControl,
    /// The prefix the other side asked for: tags of what this peer sends.
    pub send_prefix: u16,
    /// This peer's prefix: tags of what it receives.
    pub recv_prefix: u16,
}

/// A control stream of a raw peer.
pub trait RawStream: std::io::Read + std::io::Write {
    fn set_read_timeout_(&self, t: Option<Duration>);
}

impl RawStream for std::os::unix::net::UnixStream {
    fn set_read_timeout_(&self, t: Option<Duration>) {
        self.set_read_timeout(t).unwrap();
    }
}

impl RawStream for std::net::TcpStream {
    fn set_read_timeout_(&self, t: Option<Duration>) {
        self.set_read_timeout(t).unwrap();
    }
}

/// Reads `stream` until the other side closes it, within `bound`: the bytes it wrote
/// before the end of the stream. A reset counts as a close (a side that closes with input
/// unread resets the connection). `Err`, with the bytes read so far, when the stream is
/// still open at `bound` or a read fails otherwise.
pub fn read_until_closed(mut stream: impl RawStream, bound: Duration) -> Result<Vec<u8>, (Vec<u8>, std::io::Error)> {
    use std::io::{ErrorKind, Read as _};
    let deadline = Instant::now() + bound;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 64 << 10];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        stream.set_read_timeout_(Some(left.max(Duration::from_millis(1))));
        match stream.read(&mut chunk) {
            Ok(0) => return Ok(bytes),
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(bytes),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) && left.is_zero() => {
                return Err((bytes, std::io::Error::new(ErrorKind::TimedOut, format!("still open after {bound:?}"))))
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Err((bytes, e)),
        }
    }
}

/// Opens a control stream to `addr` (`unix:PATH` or `tcp:HOST:PORT`).
pub fn raw_stream(addr: &str) -> Box<dyn RawStream> {
    match addr.split_once(':') {
        Some(("unix", path)) => Box::new(std::os::unix::net::UnixStream::connect(path).expect("raw unix connect")),
        Some(("tcp", hostport)) => Box::new(std::net::TcpStream::connect(hostport).expect("raw tcp connect")),
        _ => panic!("bad address {addr}"),
    }
}

/// This machine's identity, as a context reads it (hostname and boot id).
fn this_machine() -> ferrylink::transport::wire::HostIdentity {
    let hostname = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default();
    let boot_id =
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_owned()).unwrap_or_default();
    ferrylink::transport::wire::HostIdentity { hostname, boot_id }
}

/// A `Hello` as a UCX-only peer of this process says it (`ucx`: its worker, if any).
pub fn raw_ucx_hello(ucx: Option<ferrylink::transport::wire::UcxInfo>) -> ferrylink::transport::wire::Hello {
    use ferrylink::transport::wire::{Hello, PROTOCOL_VERSION};
    Hello {
        protocol_version: PROTOCOL_VERSION,
        host: this_machine(),
        uid: nix::unistd::getuid().as_raw(),
        pid: std::process::id(),
        policy: ferrylink::transport::LanePolicy::Ucx.into(),
        native_available: false,
        ucx,
        gpus: Vec::new(),
        peer_access: Vec::new(),
        device_copies: ferrylink::transport::wire::WireCopies::Receiver,
        control_ring: None,
    }
}

impl RawUcxPeer {
    /// Connects to `addr`, completes the handshake by hand (the UCX lane), and connects
    /// its worker to the other side's. UCX reads its `UCX_*` environment.
    pub fn handshaken(addr: &str) -> Self {
        use ferrylink::transport::wire::{UcxInfo, WireMessage};
        use ferrylink_ucx::{UcxConfig, UcxContext, UcxWorker, WorkerAddress};
        let context = UcxContext::new(&UcxConfig::new()).expect("UCX context of the raw peer");
        let worker = UcxWorker::new(&context).expect("UCX worker of the raw peer");
        let recv_prefix = 0x5A5A;
        let info = UcxInfo {
            cuda_aware: false,
            worker_address: worker.address().expect("worker address").into_bytes(),
            tag_prefix: recv_prefix,
            tcp_segment: context.tcp_segment().map(str::to_owned),
        };
        let mut control = RawControl { stream: raw_stream(addr), buf: Vec::new() };
        control.write(&WireMessage::Hello(raw_ucx_hello(Some(info))));
        let (hello, lane) = match control.read_message(&worker, Duration::from_secs(20)) {
            Some(WireMessage::Welcome { hello, lane, .. }) => (hello, lane),
            other => panic!("expected a Welcome, got {other:?}"),
        };
        assert_eq!(ferrylink::transport::LaneKind::from(lane), ferrylink::transport::LaneKind::Ucx);
        let theirs = hello.ucx.expect("the other side has a UCX worker");
        // SAFETY: the address comes from the other side's Welcome, produced by its worker.
        let address = unsafe { WorkerAddress::from_bytes_unchecked(theirs.worker_address) };
        let ep = worker.connect(&address).expect("connecting the raw peer's worker");
        Self { ep, worker, _context: context, control, send_prefix: theirs.tag_prefix, recv_prefix }
    }

    /// Writes one control message.
    pub fn write(&mut self, message: &ferrylink::transport::wire::WireMessage) {
        self.control.write(message);
    }

    /// The next control message, progressing the worker meanwhile; `None` at the end of
    /// the stream or after `bound`.
    pub fn read_message(&mut self, bound: Duration) -> Option<ferrylink::transport::wire::WireMessage> {
        self.control.read_message(&self.worker, bound)
    }

    /// Sends `bytes` as frame `frame` of message `seq` and progresses until it is done.
    pub fn send_payload(&self, seq: u64, frame: usize, bytes: Vec<u8>, bound: Duration) {
        let mut req = self.ep.tag_send(ucx_payload_tag(self.send_prefix, seq, frame, 0), bytes).expect("tag send");
        let deadline = Instant::now() + bound;
        while req.poll().is_none() {
            assert!(Instant::now() < deadline, "payload {seq}/{frame} not sent within {bound:?}");
            self.worker.progress();
        }
        req.poll().unwrap().expect("payload send");
    }

    /// Receives frame `frame` of message `seq` (`len` bytes), progressing until it landed.
    pub fn recv_payload(&self, seq: u64, frame: usize, len: usize, bound: Duration) -> Vec<u8> {
        let tag = ucx_payload_tag(self.recv_prefix, seq, frame, 0);
        let mut req = self.worker.tag_recv(tag, u64::MAX, vec![0u8; len]).expect("tag recv");
        let deadline = Instant::now() + bound;
        while req.poll().is_none() {
            assert!(Instant::now() < deadline, "payload {seq}/{frame} not received within {bound:?}");
            self.worker.progress();
        }
        assert_eq!(req.poll().unwrap().expect("payload receive"), len);
        req.into_buf().expect("completed")
    }

    /// Keeps the worker (and the control stream) alive until `bound` passes: a peer that
    /// waits to be killed.
    pub fn idle(&mut self, bound: Duration) {
        let deadline = Instant::now() + bound;
        while Instant::now() < deadline {
            self.worker.progress();
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

struct RawControl {
    stream: Box<dyn RawStream>,
    buf: Vec<u8>,
}

impl RawControl {
    fn write(&mut self, message: &ferrylink::transport::wire::WireMessage) {
        use std::io::Write as _;
        let _ = self.stream.write_all(&ferrylink::transport::wire::encode_frame(message));
    }

    fn read_message(
        &mut self,
        worker: &ferrylink_ucx::UcxWorker,
        bound: Duration,
    ) -> Option<ferrylink::transport::wire::WireMessage> {
        use ferrylink::transport::wire::{decode_frame, Limits};
        use std::io::Read as _;
        let limits = Limits::default();
        let deadline = Instant::now() + bound;
        // Short reads, so that the worker progresses in between.
        self.stream.set_read_timeout_(Some(Duration::from_millis(2)));
        loop {
            match decode_frame(&self.buf, &limits) {
                Ok(Some((message, used))) => {
                    self.buf.drain(..used);
                    return Some(message);
                }
                Ok(None) => {}
                Err(_) => return None,
            }
            if Instant::now() > deadline {
                return None;
            }
            worker.progress();
            let mut chunk = [0u8; 64 << 10];
            match self.stream.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => return None,
            }
        }
    }
}

/// Resident memory of this process in bytes (`VmRSS`), 0 where unknown.
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("VmRSS:").map(|v| v.trim().trim_end_matches("kB").trim().to_owned()))
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Enqueues 40 memsets of all of `buf` on `stream` (null: the legacy default stream)
/// without waiting, the last one to `value`: a transfer that does not wait for the
/// stream's work sees another value.
pub fn produce_slowly(buf: &ferrylink::DeviceBuffer, stream: cudarc::driver::sys::CUstream, value: u8) {
    for pass in 0..40u8 {
        let v = if pass == 39 { value } else { pass };
        // SAFETY: the caller keeps the buffer live until its send completed, which is
        // after the copy, which the transport orders after these memsets; `stream` is a
        // live stream of the buffer's device (or null).
        unsafe { cudarc::driver::result::memset_d8_async(buf.device_ptr(), v, buf.len(), stream).unwrap() };
    }
}
