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
