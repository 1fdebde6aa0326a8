//! Helpers for multi-process tests: the test binary re-executes itself as the peer.
//!
//! A test named `t` calls [`peer_role`]`("t")` first: in the parent it returns `None`; in
//! the re-executed child (started by [`spawn_peer`]) it returns the role string, and the
//! test runs the peer's side instead. Never fork after CUDA is initialised: spawning a
//! fresh process image is always safe.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROLE_VAR: &str = "FERRYLINK_TEST_PEER_ROLE";
const TEST_VAR: &str = "FERRYLINK_TEST_PEER_TEST";

/// The role this process plays in test `test`, when it is the re-executed peer.
pub fn peer_role(test: &str) -> Option<String> {
    match (std::env::var(TEST_VAR), std::env::var(ROLE_VAR)) {
        (Ok(t), Ok(role)) if t == test => Some(role),
        _ => None,
    }
}

/// Whether this process is some test's peer (other tests return at once in it).
pub fn is_peer_process() -> bool {
    std::env::var_os(TEST_VAR).is_some()
}

/// Starts this test binary again, running only `test`, as the peer with `role` and
/// extra environment variables.
pub fn spawn_peer(test: &str, role: &str, env: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(TEST_VAR, test)
        .env(ROLE_VAR, role)
        .stdin(Stdio::null())
        // The peer's own "test result" lines go to stderr: only the parent's close the run.
        .stdout(Stdio::from(std::io::stderr()));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawning the peer process")
}

/// Waits for a child with a bound, killing it when the bound passes.
pub fn wait_child(child: &mut Child, bound: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("peer process did not finish within {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Deterministic pseudo-random bytes (xorshift64*, written 8 bytes at a time).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut chunks = out.chunks_exact_mut(8);
    for chunk in &mut chunks {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        chunk.copy_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    for b in chunks.into_remainder() {
        x ^= x << 7;
        *b = x as u8;
    }
    out
}

/// A 64-bit checksum of bytes (FNV-1a over 8-byte words, then the tail).
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        h = (h ^ u64::from_le_bytes(c.try_into().unwrap())).wrapping_mul(0x100_0000_01b3);
    }
    for &b in chunks.remainder() {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// A private directory for a test's sockets.
pub fn socket_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("ferrylink-test-").tempdir().expect("tempdir")
}

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

/// Whether a CUDA device is here. Without one, GPU tests print `skipped: no CUDA device`
/// and pass, unless `FERRYLINK_REQUIRE_GPU=1`, when they fail.
pub fn gpu_or_skip() -> bool {
    match ferrylink::memory::cuda::probe() {
        Ok(_) => true,
        Err(e) if std::env::var("FERRYLINK_REQUIRE_GPU").as_deref() == Ok("1") => {
            panic!("FERRYLINK_REQUIRE_GPU=1 but no CUDA device: {e}")
        }
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            false
        }
    }
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

// ---- Reliability helpers (tests/reliability_*.rs) ----

/// Polls `cond` every 10 ms until it holds or `bound` passes; whether it held.
pub fn eventually(bound: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A peer says "I reached this step" by creating `path`; the parent waits for it.
pub fn mark_step(path: &std::path::Path) {
    std::fs::write(path, b"").expect("writing a step marker");
}

/// Waits (bounded) for a peer's step marker; panics with `what` when it never comes.
pub fn wait_for_step(path: &std::path::Path, child: &mut Child, bound: Duration, what: &str) {
    eventually(bound, || path.exists() || child.try_wait().ok().flatten().is_some());
    if !path.exists() {
        let _ = child.kill();
        let status = child.wait();
        panic!("the peer did not reach {what} within {bound:?} (it ended: {status:?})");
    }
}

/// SIGKILLs a peer and reaps it (bounded).
pub fn kill_peer(child: &mut Child) {
    let _ = child.kill();
    wait_child(child, Duration::from_secs(10));
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
        let limits = Limits::from_config(&ferrylink::transport::Config::default());
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
    match ferrylink::transport::Context::new(config) {
        Ok(ctx) => Some(ctx),
        Err(e) if std::env::var("FERRYLINK_REQUIRE_UCX").as_deref() == Ok("1") => {
            panic!("FERRYLINK_REQUIRE_UCX=1 but UCX is not usable: {e}")
        }
        Err(e) => {
            println!("skipped: UCX not available ({e})");
            None
        }
    }
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

/// Opens a control stream to `addr` (`unix:PATH` or `tcp:HOST:PORT`).
pub fn raw_stream(addr: &str) -> Box<dyn RawStream> {
    match addr.split_once(':') {
        Some(("unix", path)) => Box::new(std::os::unix::net::UnixStream::connect(path).expect("raw unix connect")),
        Some(("tcp", hostport)) => Box::new(std::net::TcpStream::connect(hostport).expect("raw tcp connect")),
        _ => panic!("bad address {addr}"),
    }
}

/// A `Hello` as a UCX-only peer of this process says it (`ucx`: its worker, if any).
pub fn raw_ucx_hello(ucx: Option<ferrylink::transport::wire::UcxInfo>) -> ferrylink::transport::wire::Hello {
    use ferrylink::transport::wire::{Hello, HostIdentity, PROTOCOL_VERSION};
    Hello {
        protocol_version: PROTOCOL_VERSION,
        host: HostIdentity::of_this_machine(),
        uid: nix::unistd::getuid().as_raw(),
        pid: std::process::id(),
        policy: ferrylink::transport::LanePolicy::Ucx,
        native_available: false,
        ucx,
        gpus: Vec::new(),
        peer_access: Vec::new(),
        device_copies: ferrylink::transport::wire::DeviceCopies::Receiver,
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
        assert_eq!(lane, ferrylink::transport::Lane::Ucx);
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
        let limits = Limits::from_config(&ferrylink::transport::Config::default());
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

/// Checks an echo: the peer put the checksum of each frame it received in the header (8
/// bytes each, little-endian) and sent the frames back; both must match what was sent.
pub fn verify_echo(sent: &[Vec<u8>], back: &ferrylink::Message) {
    assert_eq!(back.frames.len(), sent.len());
    for (i, (orig, frame)) in sent.iter().zip(&back.frames).enumerate() {
        let sum = u64::from_le_bytes(back.header[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(sum, checksum(orig), "checksum of frame {i} at the peer");
        assert!(frame_bytes(frame) == *orig, "frame {i} echoed intact");
    }
}
