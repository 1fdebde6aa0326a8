//! Hostile and malformed input beyond tests/hostile_input.rs: truncated frames, seeded
//! random byte streams, absurd lengths claimed inside a valid-length body (measured with
//! a counting allocator: nothing large is allocated from them), a tebibyte frame in a
//! sparse region, and the rule that the native lane (fds, device handles) is never chosen
//! over TCP. Every case is rejected while another endpoint of the same context keeps
//! exchanging verified messages.

mod common;

use common::*;
use ferrylink::ipc::MemfdRegion;
use ferrylink::transport::wire::{
    decode_frame, encode_frame, AckResult, DataMessage, FrameDescriptor, Limits, RegionAnnouncement, WireMessage,
    FRAME_PREFIX_LEN, MAGIC, PROTOCOL_VERSION,
};
use ferrylink::transport::{
    Config, ConnectError, Context, Endpoint, LaneKind, LanePolicy, Listener, NoCommonLane, TransportError,
};
use ferrylink::Message;
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Records the largest single allocation the process asks for.
struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only records sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Tests of this file run one at a time: the allocation measurements are process-wide.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const PATH_VAR: &str = "FERRYLINK_TEST_SOCKET";
/// The step a peer reports ([`reached`]) before it waits to be killed.
const STEP: &str = "the step";

fn config() -> Config {
    Config::default().with_connect_timeout(Duration::from_secs(2)).with_request_timeout(Duration::from_secs(5))
}

/// A listener and, on another context, a long-lived client endpoint that must keep
/// working through everything the hostile peers do.
struct Server {
    _dir: tempfile::TempDir,
    ctx: Context,
    listener: Listener,
    _bystander_ctx: Context,
    bystander: Endpoint,
    bystander_server: Endpoint,
    exchanges: u64,
}

impl Server {
    fn new() -> Self {
        let dir = socket_dir();
        let ctx = Context::new(config()).unwrap();
        let listener = Listener::bind(&ctx, dir.path().join("p/s.sock")).unwrap();
        let bystander_ctx = Context::new(config()).unwrap();
        let bystander = bystander_ctx.connect(listener.path()).unwrap();
        let bystander_server = listener.accept_timeout(Duration::from_secs(5)).unwrap();
        Self { _dir: dir, ctx, listener, _bystander_ctx: bystander_ctx, bystander, bystander_server, exchanges: 0 }
    }

    /// The bystander endpoint still exchanges a verified message (staged frame).
    fn assert_still_serving(&mut self) {
        self.exchanges += 1;
        let data = pattern(20_000 + self.exchanges as usize, self.exchanges);
        self.bystander.send(Message::new(b"ok".to_vec(), vec![data.clone().into()])).wait().unwrap();
        let got = self.bystander_server.recv().wait().unwrap();
        assert_eq!(got.frames[0].as_host().unwrap().as_slice(), &data[..]);
    }

    /// A raw client that completed the handshake, and the server's endpoint for it.
    fn handshaken(&self) -> (RawPeer, Endpoint) {
        let raw = RawPeer::handshaken(self.listener.path(), self.ctx.local_hello());
        let ep = self.listener.accept_timeout(Duration::from_secs(5)).expect("the raw peer is accepted");
        (raw, ep)
    }

    /// Only the bystander's endpoint remains (hostile connections are all gone, and so is
    /// everything they made the server map: the bystander's staging region stays).
    fn assert_only_the_bystander_remains(&self) {
        let settled = eventually(Duration::from_secs(3), || {
            let s = self.ctx.stats().unwrap();
            s.endpoints == 1 && s.imported_regions <= 1 && s.recvs_posted == 0 && s.unclaimed_bytes == 0
        });
        assert!(settled, "hostile connections linger: {:?}", self.ctx.stats());
    }
}

/// The endpoint of a hostile peer ends with an error, never a message.
fn assert_endpoint_ends(ep: &Endpoint) -> TransportError {
    let mut req = ep.recv();
    match req.wait_timeout(Duration::from_secs(5)) {
        Some(Err(e)) => {
            assert!(
                matches!(e.error, TransportError::PeerFailed { .. } | TransportError::PeerClosed { .. }),
                "{}",
                e.error
            );
            e.error
        }
        Some(Ok(m)) => panic!("hostile input delivered a message (header {:?})", m.header),
        None => panic!("an endpoint fed hostile input neither failed nor delivered within 5 s"),
    }
}

fn prefix(body_len: u32) -> Vec<u8> {
    let mut f = MAGIC.to_vec();
    f.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&body_len.to_le_bytes());
    f
}

fn frame_of(body: &[u8]) -> Vec<u8> {
    let mut f = prefix(body.len() as u32);
    f.extend_from_slice(body);
    f
}

/// bincode 2's variable-length integer encoding.
fn varint(v: u64) -> Vec<u8> {
    match v {
        0..=250 => vec![v as u8],
        251..=0xffff => [vec![251], (v as u16).to_le_bytes().to_vec()].concat(),
        0x1_0000..=0xffff_ffff => [vec![252], (v as u32).to_le_bytes().to_vec()].concat(),
        _ => [vec![253], v.to_le_bytes().to_vec()].concat(),
    }
}

const DATA: u64 = 4;
const REGIONS: u64 = 3;
const REJECT: u64 = 2;
const INLINE: u64 = 0;

#[test]
fn hand_built_bodies_match_the_encoder() {
    // Guards the hand-built hostile bodies below: the same construction with honest
    // lengths is what the encoder produces.
    let honest = DataMessage { seq: 300, header: vec![9; 300], frames: vec![FrameDescriptor::Inline(vec![7; 3])] };
    let mut body =
        [varint(DATA), varint(300), varint(300), vec![9; 300], varint(1), varint(INLINE), varint(3)].concat();
    body.extend_from_slice(&[7; 3]);
    assert_eq!(frame_of(&body), encode_frame(&WireMessage::Data(honest)));
}

#[test]
fn truncated_frames_end_the_connection_and_deliver_nothing() {
    let _serial = serial();
    let mut s = Server::new();
    let hello = encode_frame(&WireMessage::Hello(s.ctx.local_hello().clone()));
    let mut cases = 0;
    // Before the handshake: a prefix of a Hello, then the peer closes.
    for cut in [1, 4, 6, 11, FRAME_PREFIX_LEN, FRAME_PREFIX_LEN + 1, hello.len() / 2, hello.len() - 1] {
        let mut raw = RawPeer::connect(s.listener.path());
        raw.write_bytes(&hello[..cut]);
        drop(raw);
        cases += 1;
    }
    // The half-shaken connections go at the peer's close, not at the handshake timeout.
    let started = Instant::now();
    assert!(eventually(Duration::from_secs(1), || s.ctx.stats().unwrap().endpoints == 1), "{:?}", s.ctx.stats());
    assert!(started.elapsed() < config().connect_timeout);
    assert!(s.listener.accept_timeout(Duration::from_millis(50)).is_err(), "no endpoint from a truncated Hello");
    s.assert_still_serving();
    // After the handshake: a prefix of a data message, then the peer closes.
    let data = encode_frame(&WireMessage::Data(DataMessage {
        seq: 0,
        header: b"h".to_vec(),
        frames: vec![FrameDescriptor::Inline(vec![1; 4000]); 3],
    }));
    for cut in [1, 4, 11, FRAME_PREFIX_LEN, FRAME_PREFIX_LEN + 3, data.len() / 2, data.len() - 1] {
        let (mut raw, ep) = s.handshaken();
        raw.write_bytes(&data[..cut]);
        drop(raw);
        let err = assert_endpoint_ends(&ep);
        assert!(matches!(err, TransportError::PeerClosed { .. }), "cut {cut}: {err}");
        cases += 1;
        s.assert_still_serving();
    }
    s.assert_only_the_bystander_remains();
    println!("{cases} truncated frames rejected; the bystander exchanged {} messages meanwhile", s.exchanges);
}

#[test]
fn random_byte_streams_are_rejected_while_another_endpoint_keeps_working() {
    let _serial = serial();
    let mut s = Server::new();
    let limits = Limits::default();
    let mut tally = [0usize; 3];
    for i in 0..60u64 {
        let bytes = pattern(1 + (i as usize * 97) % 3000, 1000 + i);
        match i % 3 {
            // Random bytes where a Hello is due.
            0 => {
                let mut raw = RawPeer::connect(s.listener.path());
                raw.write_bytes(&bytes);
                // The listener closes the connection, within 5 s.
                if let Err((_, e)) = read_until_closed(raw.stream, Duration::from_secs(5)) {
                    panic!("seed {i}: the listener kept a connection that sent random bytes: {e}");
                }
            }
            // Random bytes on an established connection.
            1 => {
                let (mut raw, ep) = s.handshaken();
                raw.write_bytes(&bytes);
                drop(raw);
                assert_endpoint_ends(&ep);
            }
            // A random body behind a valid prefix: whatever it decodes to, it is not a
            // deliverable message (checked with the decoder first).
            _ => {
                let frame = frame_of(&bytes);
                if let Ok(Some((WireMessage::Data(d), _))) = decode_frame(&frame, &limits) {
                    panic!("seed {i} happens to be a valid data message {d:?}: pick another seed");
                }
                let (mut raw, ep) = s.handshaken();
                raw.write_bytes(&frame);
                drop(raw);
                assert_endpoint_ends(&ep);
            }
        }
        tally[i as usize % 3] += 1;
        s.assert_still_serving();
    }
    assert!(s.listener.accept_timeout(Duration::from_millis(50)).is_err(), "no endpoint from random bytes");
    s.assert_only_the_bystander_remains();
    println!(
        "random inputs rejected: {} before the handshake, {} raw after it, {} random bodies behind a valid prefix; \
         the bystander exchanged {} verified messages meanwhile",
        tally[0], tally[1], tally[2], s.exchanges
    );
}

/// Bodies of a valid length (a few bytes) that claim absurd lengths inside.
fn absurd_claims() -> Vec<(&'static str, Vec<u8>)> {
    let data_head = [varint(DATA), varint(0)].concat();
    vec![
        ("header of 2^60 bytes", [data_head.clone(), varint(1 << 60), vec![1; 8]].concat()),
        ("header of 1 TiB", [data_head.clone(), varint(1 << 40), vec![1; 8]].concat()),
        ("header of 60 MiB", [data_head.clone(), varint(60 << 20), vec![1; 8]].concat()),
        ("2^40 frames", [data_head.clone(), varint(0), varint(1 << 40), vec![0; 8]].concat()),
        ("300 000 frames", [data_head.clone(), varint(0), varint(300_000), vec![0; 8]].concat()),
        (
            "an inline frame of 1 TiB",
            [data_head.clone(), varint(0), varint(1), varint(INLINE), varint(1 << 40)].concat(),
        ),
        ("an inline frame of 60 MiB", [data_head, varint(0), varint(1), varint(INLINE), varint(60 << 20)].concat()),
        ("2^50 region announcements", [varint(REGIONS), varint(1 << 50), vec![0; 8]].concat()),
        ("a rejection reason of 1 GiB", [varint(REJECT), varint(1 << 30), b"why".to_vec()].concat()),
    ]
}

/// What the counting allocator saw while `f` ran.
fn largest_allocation_during(f: impl FnOnce()) -> usize {
    LARGEST.store(0, Ordering::SeqCst);
    f();
    LARGEST.load(Ordering::SeqCst)
}

#[test]
fn absurd_lengths_claimed_inside_a_valid_body_are_refused_without_allocating_them() {
    let _serial = serial();
    let mut s = Server::new();
    let mut report = Vec::new();
    for (what, body) in absurd_claims() {
        let (mut raw, ep) = s.handshaken();
        let largest = largest_allocation_during(|| {
            raw.write_bytes(&frame_of(&body));
            let err = assert_endpoint_ends(&ep);
            assert!(err.to_string().contains("malformed"), "{what}: {err}");
        });
        drop(raw);
        report.push((what, body.len(), largest));
        s.assert_still_serving();
    }
    for (what, len, largest) in &report {
        println!("{what:>30} in a {len:>2}-byte body: largest allocation meanwhile {largest} bytes");
    }
    // bincode checks every claimed length against its own 64 MiB ceiling before it
    // allocates: a claim beyond the ceiling allocates nothing of it.
    let ceiling = 64 << 20;
    for (what, _, largest) in &report {
        assert!(*largest <= ceiling, "{what}: {largest} bytes allocated");
    }
    s.assert_only_the_bystander_remains();
}

#[test]

fn claimed_lengths_are_checked_against_the_body_before_allocating() {
    let _serial = serial();
    let s = Server::new();
    for (what, body) in absurd_claims() {
        let (mut raw, ep) = s.handshaken();
        let largest = largest_allocation_during(|| {
            raw.write_bytes(&frame_of(&body));
            assert_endpoint_ends(&ep);
        });
        // The read buffer (64 KiB chunks) and ordinary bookkeeping stay below 1 MiB.
        assert!(largest < 1 << 20, "{what} in a {}-byte body: {largest} bytes allocated", body.len());
    }
}

/// The victim of `a_tebibyte_frame_in_a_sparse_region_is_refused`: serves the hostile
/// connection, then one good client, in its own process (so the parent survives if it
/// does not).
fn run_victim() {
    let path = std::env::var(PATH_VAR).unwrap();
    let ctx = Context::new(config()).unwrap();
    let listener = Listener::bind(&ctx, &path).unwrap();
    reached(STEP);
    let hostile = listener.accept_timeout(Duration::from_secs(20)).expect("the hostile peer connects");
    // The refused message is never delivered, and the hostile endpoint stays open.
    let mut req = hostile.recv();
    match req.wait_timeout(Duration::from_secs(3)) {
        None => {}
        Some(Ok(m)) => panic!("a 1 TiB frame was delivered ({} frames)", m.frames.len()),
        Some(Err(e)) => panic!("the hostile endpoint failed instead of refusing the message: {e}"),
    }
    let good = listener.accept_timeout(Duration::from_secs(20)).expect("the good peer connects");
    let msg = good.recv().wait().expect("the good message");
    good.send(msg).wait().expect("echo");
    drop(req);
}

peer_test! {
    fn a_tebibyte_frame_in_a_sparse_region_is_refused(peers) {
        let dir = socket_dir();
        let path = dir.path().join("p/victim.sock");
        let mut child = peers.spawn("victim", &[(PATH_VAR, path.display().to_string())]);
        child.wait_reached(STEP, Duration::from_secs(20));
        // A sealed memfd of 1 TiB costs the sender nothing (sparse); the frame's bounds are
        // all inside it, and 1 TiB is within the default max_frame_len and max_region_bytes.
        let tib = 1usize << 40;
        let region = MemfdRegion::create("sparse", tib).expect("a sparse 1 TiB memfd");
        let ctx = Context::new(config()).unwrap();
        let mut raw = RawPeer::handshaken(&path, ctx.local_hello());
        let announce = WireMessage::Regions(vec![RegionAnnouncement::host(1, tib as u64)]);
        raw.write_with_fds(&announce, &[region.fd().as_raw_fd()]);
        let frames = vec![FrameDescriptor::HostRegion { region_id: 1, offset: 0, len: tib as u64 }];
        raw.write(&WireMessage::Data(DataMessage { seq: 0, header: vec![], frames }));
        // 1 TiB is beyond the default max_message_bytes (32 GiB): refused, by an Ack.
        match raw.read_message() {
            Some(WireMessage::Ack { seq: 0, result: AckResult::Refused(reason) }) => {
                assert!(reason.contains("exceeds this receiver's limit"), "{reason}");
                println!("the victim refused the 1 TiB frame: {reason}");
            }
            other => panic!("the victim answered the 1 TiB frame with {other:?}, not a refusal"),
        }
        // The victim still serves a good peer.
        let ep = ctx.connect(&path).expect("the victim still accepts");
        let data = pattern(100_000, 9);
        ep.send(Message::new(b"good".to_vec(), vec![data.clone().into()])).wait().expect("send to the victim");
        let echoed = ep.recv().wait().expect("the victim's echo");
        assert_eq!(echoed.frames[0].as_host().unwrap().as_slice(), &data[..]);
        child.wait_success(Duration::from_secs(20));
    }
    "victim" => run_victim(),
}

// ---------------------------------------------------------------------------------------
// Access control: descriptors (memfds, CUDA IPC handles) never travel over TCP.

/// Why the native lane is impossible over TCP, in negotiation's words: a side on a TCP
/// connection says it has no native lane (descriptors cannot travel there).
const NATIVE_OVER_TCP: &str = "a side has the native lane disabled";

/// Both sides' endpoints over a TCP connection, with what keeps them alive.
struct TcpPair {
    client: Endpoint,
    server: Endpoint,
    _contexts: (Context, Context),
    _listener: Listener,
}

/// Connects two contexts with lane policy `policy` over TCP loopback. On a failed
/// connect, the listener has no endpoint either.
fn tcp_connect(policy: LanePolicy) -> Result<TcpPair, ConnectError> {
    let server_ctx = Context::new(config().with_lane_policy(policy)).unwrap();
    let listener = Listener::bind_tcp(&server_ctx, "127.0.0.1:0").unwrap();
    let addr = listener.tcp_addr().unwrap();
    let client_ctx = Context::new(config().with_lane_policy(policy)).unwrap();
    match client_ctx.connect_tcp(addr) {
        Ok(client) => {
            let server = listener.accept_timeout(Duration::from_secs(5)).expect("the listener's endpoint");
            assert_eq!(client.lane(), server.lane(), "both sides use one lane");
            Ok(TcpPair { client, server, _contexts: (client_ctx, server_ctx), _listener: listener })
        }
        Err(e) => {
            assert!(listener.accept_timeout(Duration::from_millis(200)).is_err(), "no endpoint on a failed connect");
            Err(e)
        }
    }
}

/// The refusal a connector gets for `why`.
fn refused_for(why: NoCommonLane) -> String {
    ConnectError::Rejected { reason: why.to_string() }.to_string()
}

#[test]
fn the_native_lane_is_never_chosen_over_tcp() {
    let _serial = serial();
    // Forced native over TCP: refused by the listener, for that reason.
    match tcp_connect(LanePolicy::Native) {
        Ok(pair) => panic!("a forced native lane over TCP connected, on the {} lane", pair.client.lane()),
        Err(e) => {
            let expected = refused_for(NoCommonLane::NativeImpossible { why: NATIVE_OVER_TCP.into() });
            assert_eq!(e.to_string(), expected, "{e:?}");
            println!("policy native over TCP: {e}");
        }
    }
    // Auto over TCP: the UCX lane where UCX loads; where it does not, no lane at all.
    let ucx_here = Context::new(config()).unwrap().local_hello().ucx.is_some();
    let pair = match (tcp_connect(LanePolicy::Auto), ucx_here) {
        (Ok(pair), true) => pair,
        (Err(e), false) => {
            let why = NoCommonLane::Neither {
                native: NATIVE_OVER_TCP.into(),
                ucx: "neither side could load UCX (libucp.so.0)".into(),
            };
            assert_eq!(e.to_string(), refused_for(why), "{e:?}");
            // Skipped (or failed, where UCX is required): the UCX lane was not exercised.
            let _: Option<()> = ucx_or_skip(Err(format!("policy auto over TCP refused as expected: {e}")));
            return;
        }
        (Ok(pair), false) => panic!("policy auto connected over TCP without UCX, on the {} lane", pair.client.lane()),
        (Err(e), true) => panic!("policy auto over TCP with UCX here failed: {e:?}"),
    };
    assert_eq!(pair.client.lane(), LaneKind::Ucx, "policy auto over TCP");
    // Shared-memory and staged frames go without descriptors.
    let shared_bytes = pattern(300_000, 1);
    let mut shared = ferrylink::ipc::shared_host_buffer(shared_bytes.len()).unwrap();
    shared.as_mut_slice().copy_from_slice(&shared_bytes);
    let staged = pattern(200_000, 2);
    pair.client.send(Message::new(vec![], vec![shared.into(), staged.clone().into()])).wait().unwrap();
    let got = pair.server.recv().wait().unwrap();
    assert_eq!(got.frames[0].as_host().unwrap().as_slice(), &shared_bytes[..]);
    assert_eq!(got.frames[1].as_host().unwrap().as_slice(), &staged[..]);
    assert_eq!(pair.client.stats().fds_sent, 0, "no descriptor travelled over TCP");
    println!("policy auto over TCP: lane ucx, no descriptors sent");
}

#[test]
fn a_tcp_peer_that_claims_the_native_lane_does_not_get_it() {
    let _serial = serial();
    let ctx = Context::new(config()).unwrap();
    let listener = Listener::bind_tcp(&ctx, "127.0.0.1:0").unwrap();
    // The same machine, the same uid, native "available": everything but the socket
    // says native.
    let mut hello = ctx.local_hello().clone();
    hello.native_available = true;
    hello.policy = LanePolicy::Native.into();
    let mut stream = std::net::TcpStream::connect(listener.tcp_addr().unwrap()).unwrap();
    stream.write_all(&encode_frame(&WireMessage::Hello(hello))).unwrap();
    let reply = read_until_closed(stream, Duration::from_secs(5))
        .unwrap_or_else(|(_, e)| panic!("the listener kept the native-claiming TCP peer's connection: {e}"));
    let limits = Limits::default();
    // The peer forces native, which the TCP connection rules out: a refusal, then the
    // close (a welcome would leave the connection open).
    match decode_frame(&reply, &limits) {
        Ok(Some((WireMessage::Reject { reason }, _))) => {
            let expected = NoCommonLane::NativeImpossible { why: NATIVE_OVER_TCP.into() }.to_string();
            assert_eq!(reason, expected, "the refusal says why");
            println!("a TCP peer claiming native is refused: {reason}");
        }
        other => panic!("unexpected answer to a native-claiming TCP peer: {other:?}"),
    }
    assert!(listener.accept_timeout(Duration::from_millis(200)).is_err(), "no native endpoint over TCP");
}
