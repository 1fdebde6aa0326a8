//! Peer failure at every step of the native lane's protocol: the peer process is killed
//! (SIGKILL) after connecting, in the middle of the handshake, after announcing a region,
//! in the middle of a descriptor or a multi-frame message, after its data landed, and
//! before it acknowledges. In every case the survivor's pending requests end with an
//! error within the timeout, nothing partial is delivered, its memory of the dead peer
//! is released, and it accepts and serves a new peer afterwards.
//!
//! Most peers are "raw": a re-executed child speaking the wire format by hand
//! ([`common::RawPeer`]), so it can stop at any byte of the protocol. A child reports the
//! step it reached with a marker file, then waits to be killed.

mod common;

use common::*;
use ferrylink::ipc::{shared_host_buffer, MemfdRegion};
use ferrylink::transport::wire::{encode_frame, DataMessage, FrameDescriptor, RegionAnnouncement, WireMessage};
use ferrylink::transport::{Config, Context, LaneKind, Listener, TransportError};
use ferrylink::{Frame, Message};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const PATH_VAR: &str = "FERRYLINK_TEST_SOCKET";
/// The step a peer reports ([`reached`]) before it waits to be killed.
const STEP: &str = "the step";
/// The survivors' request timeout: short, so that the "never acknowledged" case is quick.
const TIMEOUT: Duration = Duration::from_secs(2);
/// How long a peer's death may take to reach the survivor's pending requests (EOF is
/// immediate; this bound leaves room for a loaded 2-core CI machine).
const DEATH_NOTICE: Duration = Duration::from_millis(1500);
/// Bytes the raw peers put in their shared region.
const REGION_LEN: usize = 1 << 20;

fn config() -> Config {
    Config::default().with_request_timeout(TIMEOUT).with_connect_timeout(TIMEOUT)
}

// ---------------------------------------------------------------------------------------
// The peers (re-executed children).

fn env_path(var: &str) -> PathBuf {
    PathBuf::from(std::env::var(var).unwrap_or_else(|_| panic!("{var} is set for peers")))
}

/// Reports the step, then waits to be killed (bounded: a peer never outlives a test).
fn reached_step_wait_for_death() -> ! {
    reached(STEP);
    std::thread::sleep(Duration::from_secs(60));
    std::process::exit(3)
}

/// A sealed memfd region filled with a known pattern, as a sending peer shares it.
fn filled_region() -> std::sync::Arc<MemfdRegion> {
    let region = MemfdRegion::create("raw-peer", REGION_LEN).unwrap();
    let mut buf = region.alloc(REGION_LEN).unwrap();
    buf.as_mut_slice().copy_from_slice(&pattern(REGION_LEN, 42));
    std::mem::forget(buf); // keep the bytes allocated for the peer's lifetime
    region
}

/// A multi-frame message: inline frames and frames in region 1.
fn multi_frame_data(seq: u64) -> DataMessage {
    let mut frames = Vec::new();
    for i in 0..40u64 {
        if i % 2 == 0 {
            frames.push(FrameDescriptor::Inline(pattern(1000 + i as usize, i)));
        } else {
            frames.push(FrameDescriptor::HostRegion { region_id: 1, offset: (i * 16) << 10, len: 16 << 10 });
        }
    }
    DataMessage { seq, header: b"multi".to_vec(), frames }
}

fn run_peer(role: &str) {
    let path = env_path(PATH_VAR);
    // A context only for its introduction (pid, uid, host): the raw peers speak by hand.
    let ctx = Context::new(config()).unwrap();
    let hello = ctx.local_hello().clone();
    match role {
        // A real endpoint, connected, that never says anything.
        "connected-idle" => {
            let _ep = ctx.connect(&path).expect("connect");
            reached_step_wait_for_death();
        }
        // Half of a Hello, then nothing.
        "half-hello" => {
            let mut raw = RawPeer::connect(&path);
            let hello = encode_frame(&WireMessage::Hello(hello));
            raw.write_bytes(&hello[..hello.len() / 2]);
            reached_step_wait_for_death();
        }
        // Announces a region (its fd passed), never sends the data message.
        "region-then-nothing" => {
            let mut raw = RawPeer::handshaken(&path, &hello);
            let region = filled_region();
            let announce = WireMessage::Regions(vec![RegionAnnouncement::host(1, REGION_LEN as u64)]);
            raw.write_with_fds(&announce, &[region.fd().as_raw_fd()]);
            reached_step_wait_for_death();
        }
        // The first half of a region announcement, with its fd attached, then nothing.
        "half-region-announcement" => {
            let raw = RawPeer::handshaken(&path, &hello);
            let region = filled_region();
            let announce = encode_frame(&WireMessage::Regions(vec![RegionAnnouncement::host(1, REGION_LEN as u64)]));
            let half = &announce[..announce.len() / 2];
            let n = ferrylink::ipc::send_with_fds(&raw.stream, half, &[region.fd().as_raw_fd()]).unwrap();
            assert_eq!(n, half.len());
            reached_step_wait_for_death();
        }
        // A whole region, then the first half of a 40-frame data message.
        "half-multi-frame-message" => {
            let mut raw = RawPeer::handshaken(&path, &hello);
            let region = filled_region();
            let announce = WireMessage::Regions(vec![RegionAnnouncement::host(1, REGION_LEN as u64)]);
            raw.write_with_fds(&announce, &[region.fd().as_raw_fd()]);
            let data = encode_frame(&WireMessage::Data(multi_frame_data(0)));
            raw.write_bytes(&data[..data.len() / 2]);
            reached_step_wait_for_death();
        }
        // A whole multi-frame message; the peer dies before it reads the acknowledgement.
        "whole-message-then-death" => {
            let mut raw = RawPeer::handshaken(&path, &hello);
            let region = filled_region();
            let announce = WireMessage::Regions(vec![RegionAnnouncement::host(1, REGION_LEN as u64)]);
            raw.write_with_fds(&announce, &[region.fd().as_raw_fd()]);
            raw.write(&WireMessage::Data(multi_frame_data(0)));
            reached_step_wait_for_death();
        }
        // A receiver that reads the data message and never acknowledges it: killed
        // ("receiver-dies-before-ack"), or alive until the survivor gives up on it.
        "receiver-dies-before-ack" | "receiver-never-acks" => {
            let mut raw = RawPeer::handshaken(&path, &hello);
            loop {
                match raw.read_message() {
                    Some(WireMessage::Data(_)) => break,
                    Some(_) => continue,
                    None => panic!("the survivor's data message never came"),
                }
            }
            if role == "receiver-dies-before-ack" {
                reached_step_wait_for_death();
            }
            reached(STEP);
            // The survivor must close the connection once the timeout passes.
            raw.stream.set_read_timeout(Some(TIMEOUT * 4)).unwrap();
            let started = Instant::now();
            while raw.read_message().is_some() {}
            assert!(started.elapsed() < TIMEOUT * 3, "the survivor kept the connection for {:?}", started.elapsed());
        }
        // The survivor connects to these: they listen.
        "listener-half-welcome" | "listener-hangs" | "listener-echo" => run_listener_peer(role, &path, &ctx),
        other => panic!("unknown role {other}"),
    }
}

/// The listening peers: `path` is where they listen.
fn run_listener_peer(role: &str, path: &Path, ctx: &Context) {
    let hello = ctx.local_hello().clone();
    match role {
        // A raw listener that reads the Hello and answers half a Welcome.
        "listener-half-welcome" => {
            let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
            reached("listening");
            let (stream, _) = listener.accept().unwrap();
            let mut raw = RawPeer::from_stream(stream);
            let Some(WireMessage::Hello(_)) = raw.read_message() else { panic!("no Hello") };
            let welcome =
                encode_frame(&WireMessage::Welcome { hello, lane: LaneKind::Native.into(), control_ring: false });
            raw.write_bytes(&welcome[..welcome.len() / 2]);
            reached_step_wait_for_death();
        }
        // A real listener that takes one message, then hangs until killed (or echoes
        // every message with its checksums, when it is the survivor's next peer).
        "listener-hangs" | "listener-echo" => {
            let listener = Listener::bind(ctx, path).unwrap();
            reached("listening");
            let ep = listener.accept_timeout(Duration::from_secs(20)).expect("the survivor connects");
            if role == "listener-hangs" {
                ep.recv().wait().expect("the first message");
                reached_step_wait_for_death();
            }
            echo::serve(&Ferry, &ep);
        }
        other => panic!("unknown role {other}"),
    }
}

// ---------------------------------------------------------------------------------------
// The survivor.

struct Survivor {
    _dir: tempfile::TempDir,
    ctx: Context,
    listener: Listener,
}

impl Survivor {
    fn new() -> Self {
        let dir = socket_dir();
        let ctx = Context::new(config()).unwrap();
        let listener = Listener::bind(&ctx, dir.path().join("p/s.sock")).unwrap();
        Self { _dir: dir, ctx, listener }
    }

    /// Starts the peer `role`.
    fn spawn(&self, peers: &Peers, role: &str) -> Peer {
        peers.spawn(role, &[(PATH_VAR, self.listener.path().display().to_string())])
    }

    /// After the dead peer's endpoint is dropped, nothing of it remains.
    fn assert_forgot_the_dead(&self) {
        let settled = eventually(Duration::from_secs(3), || {
            let s = self.ctx.stats().unwrap();
            s.endpoints == 0
                && s.imported_regions == 0
                && s.sends_in_flight == 0
                && s.recvs_posted == 0
                && s.staging_used_bytes == 0
        });
        assert!(settled, "the survivor still holds state of the dead peer: {:?}", self.ctx.stats());
    }

    /// A new peer connects, and a verified message goes each way (inline, staged and
    /// shared-memory frames).
    fn assert_serves_a_new_peer(&self) {
        let client_ctx = Context::new(config()).unwrap();
        let client = client_ctx.connect(self.listener.path()).expect("a new peer connects");
        let server = self.listener.accept_timeout(Duration::from_secs(5)).expect("the survivor accepts");
        for (from, to) in [(&client, &server), (&server, &client)] {
            let (message, sums) = verified_message(7);
            from.send(message).wait().expect("send to the new peer");
            let got = to.recv().wait().expect("recv from the new peer");
            assert_eq!(got.header, b"verified");
            let got_sums: Vec<u64> = got.frames.iter().map(|f| checksum(f.as_host().unwrap().as_slice())).collect();
            assert_eq!(got_sums, sums, "contents arrive intact");
        }
    }
}

/// A message with an inline, a staged and a shared-memory frame, and their checksums.
fn verified_message(seed: u64) -> (Message, Vec<u64>) {
    let small = pattern(100, seed);
    let staged = pattern(300_000, seed + 1);
    let shared_bytes = pattern(500_000, seed + 2);
    let mut shared = shared_host_buffer(shared_bytes.len()).unwrap();
    shared.as_mut_slice().copy_from_slice(&shared_bytes);
    let sums = vec![checksum(&small), checksum(&staged), checksum(&shared_bytes)];
    (Message::new(b"verified".to_vec(), vec![small.into(), staged.into(), shared.into()]), sums)
}

/// Waits for a request to end, at most `bound`, and returns its error.
fn recv_fails_within(mut req: ferrylink::transport::RecvRequest, bound: Duration) -> TransportError {
    match req.wait_timeout(bound) {
        Some(Err(e)) => e.error,
        Some(Ok(m)) => panic!("a receive from a dead peer delivered a message (header {:?})", m.header),
        None => panic!("a receive from a dead peer still pending after {bound:?}"),
    }
}

fn assert_peer_gone(error: &TransportError) {
    assert!(
        matches!(error, TransportError::PeerClosed { .. } | TransportError::PeerFailed { .. }),
        "expected the peer's death, got {error}"
    );
}

/// The common shape of the "a sending peer dies" cases: the peer reaches `role`'s step,
/// the survivor has receives pending, the peer is killed; the receives end with an error
/// quickly (after `whole` messages that landed before the death are received intact).
fn sending_peer_dies(peers: &Peers, role: &str, whole: usize) {
    let s = Survivor::new();
    let mut child = s.spawn(peers, role);
    let ep = s.listener.accept_timeout(Duration::from_secs(20)).expect("the peer connects");
    assert_eq!(ep.lane(), LaneKind::Native);
    child.wait_reached(STEP, Duration::from_secs(20));
    // The survivor waits for messages the peer will never finish.
    let recvs: Vec<_> = (0..3).map(|_| ep.recv()).collect();
    std::thread::sleep(Duration::from_millis(50));
    let killed = Instant::now();
    child.kill();
    let mut recvs = recvs.into_iter();
    for _ in 0..whole {
        // Landed whole before the death: delivered whole, copied out of the dead peer's
        // shared memory before it died.
        let mut req = recvs.next().unwrap();
        let msg = req.wait_timeout(DEATH_NOTICE).expect("landed message").expect("landed message");
        verify_multi_frame(&msg);
    }
    for req in recvs {
        assert_peer_gone(&recv_fails_within(req, DEATH_NOTICE));
    }
    assert!(killed.elapsed() < DEATH_NOTICE, "the survivor noticed the death after {:?}", killed.elapsed());
    // A request submitted after the death fails at once, too.
    let err = ep.send(Message::new(vec![], vec![])).wait().unwrap_err();
    assert_peer_gone(&err.error);
    assert!(err.message.is_some(), "the failed send hands the message back");
    drop(ep);
    s.assert_forgot_the_dead();
    s.assert_serves_a_new_peer();
}

fn verify_multi_frame(msg: &Message) {
    let expected = multi_frame_data(0);
    let region = pattern(REGION_LEN, 42);
    assert_eq!(msg.header, b"multi");
    assert_eq!(msg.frames.len(), expected.frames.len());
    for (i, (desc, frame)) in expected.frames.iter().zip(&msg.frames).enumerate() {
        let got = frame.as_host().unwrap().as_slice();
        match desc {
            FrameDescriptor::Inline(bytes) => assert_eq!(got, &bytes[..], "inline frame {i}"),
            FrameDescriptor::HostRegion { offset, len, .. } => {
                assert_eq!(got, &region[*offset as usize..(*offset + *len) as usize], "region frame {i}")
            }
            other => unreachable!("the peer sent no {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The cases.

peer_test! {
    fn killed_after_connect_before_any_message(peers) {
        sending_peer_dies(&peers, "connected-idle", 0);
    }
    peer(role) => {
        run_peer(role)
    },
}

peer_test! {
    fn killed_during_the_handshake(peers) {
        let s = Survivor::new();
        let mut child = s.spawn(&peers, "half-hello");
        child.wait_reached(STEP, Duration::from_secs(20));
        assert!(s.ctx.stats().unwrap().endpoints >= 1, "the half-shaken connection is tracked");
        let killed = Instant::now();
        child.kill();
        // The half-shaken connection is dropped at the peer's death, not at the handshake
        // timeout, and never becomes an endpoint.
        assert!(eventually(DEATH_NOTICE, || s.ctx.stats().unwrap().endpoints == 0), "{:?}", s.ctx.stats());
        assert!(killed.elapsed() < TIMEOUT, "dropped after {:?}", killed.elapsed());
        assert!(s.listener.accept_timeout(Duration::from_millis(100)).is_err(), "no endpoint from half a Hello");
        s.assert_forgot_the_dead();
        s.assert_serves_a_new_peer();
    }
    peer(role) => {
        run_peer(role)
    },
}

peer_test! {
    fn killed_after_announcing_a_region_before_the_data(peers) {
        sending_peer_dies(&peers, "region-then-nothing", 0);
    }
    peer(role) => {
        run_peer(role)
    },
}

peer_test! {
    fn killed_in_the_middle_of_a_region_announcement_with_its_fd_in_flight(peers) {
        sending_peer_dies(&peers, "half-region-announcement", 0);
    }
    peer(role) => {
        run_peer(role)
    },
}

peer_test! {
    fn killed_in_the_middle_of_a_multi_frame_message(peers) {
        sending_peer_dies(&peers, "half-multi-frame-message", 0);
    }
    peer(role) => {
        run_peer(role)
    },
}

peer_test! {
    fn killed_after_its_message_landed_before_reading_the_ack(peers) {
        sending_peer_dies(&peers, "whole-message-then-death", 1);
    }
    peer(role) => {
        run_peer(role)
    },
}

/// The survivor sends; the peer reads the data message and never acknowledges it.
fn receiving_peer_never_acks(peers: &Peers, role: &str) {
    let s = Survivor::new();
    let mut child = s.spawn(peers, role);
    let ep = s.listener.accept_timeout(Duration::from_secs(20)).expect("the peer connects");
    let (message, _) = verified_message(3);
    let started = Instant::now();
    let mut send = ep.send(message);
    let mut more: Vec<_> = (0..3).map(|i| ep.send(verified_message(10 + i).0)).collect();
    let recv = ep.recv();
    child.wait_reached(STEP, Duration::from_secs(20));
    let bound = if role == "receiver-dies-before-ack" {
        child.kill();
        DEATH_NOTICE
    } else {
        // Alive but silent: the survivor gives up after its request timeout.
        TIMEOUT + DEATH_NOTICE
    };
    let err = match send.wait_timeout(bound) {
        Some(Err(e)) => e,
        Some(Ok(_)) => panic!("a send completed without an acknowledgement"),
        None => panic!("a send to a silent peer still pending after {bound:?}"),
    };
    assert_peer_gone(&err.error);
    if role == "receiver-never-acks" {
        assert!(err.error.to_string().contains("not acknowledged"), "{}", err.error);
        assert!(started.elapsed() >= TIMEOUT, "gave up after {:?}", started.elapsed());
    }
    let back = err.message.expect("the unacknowledged send hands the message back");
    assert_eq!(back.frames.len(), 3);
    for req in more.iter_mut() {
        let e = req.wait_timeout(DEATH_NOTICE).expect("a queued send ends").unwrap_err();
        assert_peer_gone(&e.error);
        assert!(e.message.is_some(), "queued sends hand their message back");
    }
    assert_peer_gone(&recv_fails_within(recv, DEATH_NOTICE));
    drop(ep);
    if role == "receiver-never-acks" {
        child.wait_success(Duration::from_secs(10));
    }
    s.assert_forgot_the_dead();
    s.assert_serves_a_new_peer();
}

peer_test! {
    fn receiver_killed_after_reading_the_data_before_acking(peers) {
        receiving_peer_never_acks(&peers, "receiver-dies-before-ack");
    }
    peer(role) => {
        run_peer(role)
    },
}

peer_test! {
    fn receiver_that_never_acks_is_given_up_after_the_request_timeout(peers) {
        receiving_peer_never_acks(&peers, "receiver-never-acks");
    }
    peer(role) => {
        run_peer(role)
    },
}

/// The survivor is the connecting side; its listener peer dies.
fn spawn_listener(dir: &Path, peers: &Peers, role: &str) -> (Peer, PathBuf) {
    let private = dir.join("p");
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700).create(&private).unwrap();
    let path = private.join(format!("{role}.sock"));
    let env = [(PATH_VAR, path.display().to_string())];
    let child = peers.spawn(role, &env);
    (child, path)
}

peer_test! {
    fn listener_killed_during_the_handshake_fails_the_connect(peers) {
        let dir = socket_dir();
        let ctx = Context::new(config()).unwrap();
        let (mut child, path) = spawn_listener(dir.path(), &peers, "listener-half-welcome");
        child.wait_reached("listening", Duration::from_secs(20));
        let connecting = {
            let ctx = ctx.clone();
            let path = path.clone();
            std::thread::spawn(move || ctx.connect(&path).map(|_| ()))
        };
        child.wait_reached(STEP, Duration::from_secs(20));
        let killed = Instant::now();
        child.kill();
        let result = connecting.join().unwrap();
        let err = result.expect_err("a connect whose listener died half-way fails");
        assert!(killed.elapsed() < DEATH_NOTICE, "the connect failed {:?} after the death", killed.elapsed());
        println!("connect error: {err}");
        assert!(eventually(Duration::from_secs(3), || ctx.stats().unwrap().endpoints == 0), "{:?}", ctx.stats());
        // The same context connects to a new listener and exchanges verified messages.
        connect_to_an_echo_listener(&ctx, dir.path(), &peers);
    }
    peer(role) => {
        run_peer(role)
    },
}

peer_test! {
    fn listener_killed_mid_stream_fails_the_connectors_requests(peers) {
        let dir = socket_dir();
        let ctx = Context::new(config()).unwrap();
        let (mut child, path) = spawn_listener(dir.path(), &peers, "listener-hangs");
        child.wait_reached("listening", Duration::from_secs(20));
        let ep = ctx.connect(&path).expect("connect");
        ep.send(verified_message(1).0).wait().expect("the first message is taken");
        child.wait_reached(STEP, Duration::from_secs(20));
        // Many frames in flight, staged and shared, and receives pending.
        let sends: Vec<_> = (0..8)
            .map(|i| {
                let frames: Vec<Frame> = (0..10).map(|f| pattern(200_000 + f * 1000, i * 10 + f as u64).into()).collect();
                ep.send(Message::new(vec![], frames))
            })
            .collect();
        let recvs: Vec<_> = (0..3).map(|_| ep.recv()).collect();
        let killed = Instant::now();
        child.kill();
        for mut s in sends {
            match s.wait_timeout(DEATH_NOTICE) {
                // The dead peer may have acknowledged some before it died: those succeeded.
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    assert_peer_gone(&e.error);
                    assert!(e.message.is_some(), "a failed send hands the message back");
                }
                None => panic!("a send to a dead listener still pending after {DEATH_NOTICE:?}"),
            }
        }
        for r in recvs {
            assert_peer_gone(&recv_fails_within(r, DEATH_NOTICE));
        }
        assert!(killed.elapsed() < DEATH_NOTICE, "noticed after {:?}", killed.elapsed());
        drop(ep);
        assert!(
            eventually(Duration::from_secs(3), || {
                let s = ctx.stats().unwrap();
                s.endpoints == 0 && s.sends_in_flight == 0 && s.staging_used_bytes == 0
            }),
            "{:?}",
            ctx.stats()
        );
        connect_to_an_echo_listener(&ctx, dir.path(), &peers);
    }
    peer(role) => {
        run_peer(role)
    },
}

/// Starts a fresh echo listener process, connects `ctx` to it and checks two round trips.
fn connect_to_an_echo_listener(ctx: &Context, dir: &Path, peers: &Peers) {
    let (mut child, path) = spawn_listener(dir, peers, "listener-echo");
    child.wait_reached("listening", Duration::from_secs(20));
    let ep = ctx.connect(&path).expect("connect to the new listener");
    for seed in 0..2 {
        let (message, sums) = verified_message(seed * 10);
        ep.send(message).wait().expect("send to the new listener");
        let echoed = ep.recv().wait().expect("the echo");
        // The kit's echo: the header, then the checksums the peer computed.
        assert_eq!(&echoed.header[..8], b"verified");
        let echoed_sums: Vec<u64> =
            echoed.header[8..].chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(echoed_sums, sums, "the new peer received intact contents");
        let back: Vec<u64> = echoed.frames.iter().map(|f| checksum(f.as_host().unwrap().as_slice())).collect();
        assert_eq!(back, sums, "the echo arrived intact");
    }
    stop_echo(&ep);
    child.wait_success(Duration::from_secs(20));
}
