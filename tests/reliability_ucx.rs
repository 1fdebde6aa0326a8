//! Reliability of the UCX lane (issue 7): peer failure at every protocol step, no leaks
//! after 1000 connect/send/disconnect cycles and after crashes, and load (32 endpoints).
//!
//! On the UCX lane the `Data` descriptor travels on the control stream (Unix or TCP) with
//! `FrameDescriptor::Remote` frames; the payloads follow as UCX tagged messages (64 MiB
//! frames use the rendezvous protocol: the sender's request completes only once the
//! receiver matched and pulled it); the receiver acknowledges on the control stream once
//! every payload arrived. To stop a peer at an exact step, most peers are "raw"
//! ([`common::RawUcxPeer`]): a re-executed child that speaks the control protocol by hand
//! and moves payloads with its own UCX worker. Others are real ferrylink endpoints. A
//! child reports its step with a marker file, then waits to be killed (SIGKILL).
//!
//! The steps covered (the survivor is the listening side; both use a 2 s request timeout):
//! - after connect, before any message (a real endpoint);
//! - during the handshake (half a Hello);
//! - a sender dies after its descriptor, before any payload (Unix and TCP bootstraps);
//! - a sender dies between the payloads of a multi-frame message: the first 64 MiB
//!   payload was received, the others never come (Unix and TCP bootstraps);
//! - a real ferrylink sender killed right after `send()` returned: where the kill lands
//!   is a race (before the descriptor, mid-payload or after landing), so the test accepts
//!   a message delivered whole or an error, never a partial one (Unix and TCP);
//! - a receiver dies holding the descriptor, its payload receives never posted (the
//!   survivor's rendezvous sends cannot complete);
//! - a receiver dies after every payload arrived, before it acknowledged: deterministic
//!   with a raw receiver. (A real ferrylink receiver acknowledges inside its engine as the
//!   message lands, before its `recv()` returns, so killing it "before the ack" cannot be
//!   aimed at; the raw receiver covers that step);
//! - a receiver that stays alive and never acknowledges: given up after the timeout.
//!
//! Without UCX every test prints `skipped: UCX not available` and passes, unless
//! `FERRYLINK_REQUIRE_UCX=1`. CI: `UCX_TLS=tcp UCX_NET_DEVICES=lo`.

mod common;

use common::*;
use ferrylink::transport::wire::{DataMessage, FrameDescriptor, WireMessage};
use ferrylink::transport::{Config, Context, ContextStats, Endpoint, Lane, LanePolicy, Listener, TransportError};
use ferrylink::{Frame, Message};
use std::path::PathBuf;
use std::process::Child;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

const ADDR_VAR: &str = "FERRYLINK_TEST_ADDR";
const STEP_VAR: &str = "FERRYLINK_TEST_STEP";
/// The request timeout of both sides.
const TIMEOUT: Duration = Duration::from_secs(2);
/// A peer's death must reach the survivor's pending requests within the request timeout.
const DEATH_NOTICE: Duration = TIMEOUT;
/// A payload frame large enough for UCX's rendezvous protocol.
const BIG: usize = 64 << 20;
/// Frames of the raw peers' multi-frame message: one inline, then three payloads of `BIG`.
const BIG_FRAMES: usize = 3;

fn config() -> Config {
    Config { lane_policy: LanePolicy::Ucx, request_timeout: TIMEOUT, connect_timeout: TIMEOUT, ..Config::default() }
}

/// Open fds are process-wide: the leak tests run alone (write), the others together (read).
static FDS: RwLock<()> = RwLock::new(());

fn shared_fds() -> RwLockReadGuard<'static, ()> {
    FDS.read().unwrap_or_else(|e| e.into_inner())
}

fn exclusive_fds() -> RwLockWriteGuard<'static, ()> {
    FDS.write().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------------------
// The peers (re-executed children).

fn env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("{var} is set for peers"))
}

/// Reports the step, then waits to be killed (bounded: a peer never outlives a test).
fn reached_step_wait_for_death() -> ! {
    mark_step(&PathBuf::from(env(STEP_VAR)));
    std::thread::sleep(Duration::from_secs(60));
    std::process::exit(3)
}

/// Same, keeping a raw peer's worker progressing meanwhile.
fn raw_reached_step_wait_for_death(raw: &mut RawUcxPeer) -> ! {
    mark_step(&PathBuf::from(env(STEP_VAR)));
    raw.idle(Duration::from_secs(60));
    std::process::exit(3)
}

fn connect(ctx: &Context, addr: &str) -> Endpoint {
    match addr.split_once(':') {
        Some(("unix", path)) => ctx.connect(path).expect("connect"),
        Some(("tcp", hostport)) => ctx.connect_tcp(hostport).expect("connect over TCP"),
        _ => panic!("bad address {addr}"),
    }
}

/// The raw peers' multi-frame message: an inline frame, then `BIG_FRAMES` payloads.
fn big_descriptor(seq: u64) -> DataMessage {
    let mut frames = vec![FrameDescriptor::Inline(pattern(100, seq))];
    frames.extend((0..BIG_FRAMES).map(|_| FrameDescriptor::Remote { len: BIG as u64, device: false, chunk: 0 }));
    DataMessage { seq, header: b"big".to_vec(), frames }
}

/// Payload `i` (frame `i + 1`) of the multi-frame message: cheap to make and to compare.
fn big_payload(i: usize) -> Vec<u8> {
    vec![0xA0 + i as u8; BIG]
}

/// A message of `BIG_FRAMES` large frames (what a real sending peer sends).
fn big_message() -> Message {
    Message::new(b"big".to_vec(), (0..BIG_FRAMES).map(|i| big_payload(i).into()).collect())
}

/// A delivered big message is whole.
fn verify_big(msg: &Message) {
    assert_eq!(msg.header, b"big");
    assert_eq!(msg.frames.len(), BIG_FRAMES);
    for (i, f) in msg.frames.iter().enumerate() {
        assert!(f.as_host().unwrap().as_slice() == &big_payload(i)[..], "big frame {i} intact");
    }
}

fn run_peer(role: &str) {
    let addr = env(ADDR_VAR);
    match role {
        // A real endpoint, connected over UCX, that never says anything.
        "connected-idle" => {
            let ctx = Context::new(config()).unwrap();
            let ep = connect(&ctx, &addr);
            assert_eq!(ep.lane(), Lane::Ucx);
            reached_step_wait_for_death();
        }
        // Half of a Hello (offering UCX), then nothing.
        "half-hello" => {
            let mut stream = raw_stream(&addr);
            let info = ferrylink::transport::wire::UcxInfo {
                cuda_aware: false,
                worker_address: vec![7; 64],
                tag_prefix: 1,
                tcp_segment: None,
            };
            let hello = ferrylink::transport::wire::encode_frame(&WireMessage::Hello(raw_ucx_hello(Some(info))));
            std::io::Write::write_all(&mut stream, &hello[..hello.len() / 2]).unwrap();
            reached_step_wait_for_death();
        }
        // The descriptor of a multi-frame message, no payload.
        "descriptor-then-nothing" => {
            let mut raw = RawUcxPeer::handshaken(&addr);
            raw.write(&WireMessage::Data(big_descriptor(0)));
            raw_reached_step_wait_for_death(&mut raw);
        }
        // The descriptor and the first payload (received whole by the survivor), then
        // nothing: the message is cut in the middle.
        "first-payload-then-death" => {
            let mut raw = RawUcxPeer::handshaken(&addr);
            raw.write(&WireMessage::Data(big_descriptor(0)));
            raw.send_payload(0, 1, big_payload(0), Duration::from_secs(20));
            raw_reached_step_wait_for_death(&mut raw);
        }
        // A real sender of a multi-frame message, killed as soon as `send` returned.
        "real-sender" => {
            let ctx = Context::new(config()).unwrap();
            let ep = connect(&ctx, &addr);
            let _pending = ep.send(big_message());
            reached_step_wait_for_death();
        }
        // Reads the survivor's descriptor and never posts the payload receives (the
        // survivor's rendezvous sends cannot complete).
        "receiver-holds-descriptor" => {
            let mut raw = RawUcxPeer::handshaken(&addr);
            wait_for_data(&mut raw);
            raw_reached_step_wait_for_death(&mut raw);
        }
        // Receives the descriptor and every payload, and never acknowledges: killed
        // ("receiver-dies-before-ack"), or alive until the survivor gives up.
        "receiver-dies-before-ack" | "receiver-never-acks" => {
            let mut raw = RawUcxPeer::handshaken(&addr);
            let data = wait_for_data(&mut raw);
            for (i, f) in data.frames.iter().enumerate() {
                if let FrameDescriptor::Remote { len, .. } = f {
                    let got = raw.recv_payload(data.seq, i, *len as usize, Duration::from_secs(20));
                    assert!(got == big_payload(i), "payload {i} arrived intact at the raw receiver");
                }
            }
            if role == "receiver-dies-before-ack" {
                raw_reached_step_wait_for_death(&mut raw);
            }
            mark_step(&PathBuf::from(env(STEP_VAR)));
            // The survivor must close the connection once its timeout passes.
            let started = Instant::now();
            while raw.read_message(TIMEOUT * 4).is_some() {}
            assert!(started.elapsed() < TIMEOUT * 3, "the survivor kept the connection for {:?}", started.elapsed());
        }
        // A real endpoint that takes one message, then waits to be killed holding it,
        // with the survivor's next sends and receives pending.
        "crasher" => {
            let ctx = Context::new(config()).unwrap();
            let ep = connect(&ctx, &addr);
            for i in 0..3u64 {
                ep.send(Message::new(vec![], vec![pattern(100, i).into(), pattern(2 << 20, i).into()]))
                    .wait()
                    .expect("send");
            }
            let _held = ep.recv().wait().expect("the survivor's message");
            reached_step_wait_for_death();
        }
        "echo-32" => echo_peer(&addr, LOAD_ENDPOINTS),
        other => panic!("unknown role {other}"),
    }
}

/// Reads control messages until the survivor's `Data` descriptor.
fn wait_for_data(raw: &mut RawUcxPeer) -> DataMessage {
    loop {
        match raw.read_message(Duration::from_secs(20)) {
            Some(WireMessage::Data(d)) => return d,
            Some(_) => continue,
            None => panic!("the survivor's data message never came"),
        }
    }
}

/// `endpoints` endpoints, each echoing every message with the checksums of its frames
/// appended to the header, until "stop".
fn echo_peer(addr: &str, endpoints: usize) {
    let ctx = Context::new(Config { request_timeout: LOAD_BOUND, connect_timeout: LOAD_BOUND, ..config() }).unwrap();
    let eps: Vec<Endpoint> = (0..endpoints).map(|_| connect(&ctx, addr)).collect();
    let threads: Vec<_> = eps
        .into_iter()
        .map(|ep| {
            std::thread::spawn(move || loop {
                let msg = ep.recv().wait().expect("echo recv");
                if msg.header == b"stop" {
                    return;
                }
                let mut header = msg.header.clone();
                for f in &msg.frames {
                    header.extend_from_slice(&checksum(f.as_host().unwrap().as_slice()).to_le_bytes());
                }
                ep.send(Message::new(header, msg.frames)).wait().expect("echo send");
            })
        })
        .collect();
    for t in threads {
        t.join().expect("echo thread");
    }
}

// ---------------------------------------------------------------------------------------
// The survivor.

struct Survivor {
    dir: tempfile::TempDir,
    ctx: Context,
    listener: Listener,
    addr: String,
}

impl Survivor {
    /// A UCX context listening on a Unix socket or on TCP loopback; `None`: skipped.
    fn new(over_tcp: bool) -> Option<Self> {
        let ctx = ucx_context_or_skip_with(config())?;
        let dir = socket_dir();
        let (listener, addr) = if over_tcp {
            let l = Listener::bind_tcp(&ctx, "127.0.0.1:0").unwrap();
            let addr = format!("tcp:{}", l.tcp_addr().unwrap());
            (l, addr)
        } else {
            let l = Listener::bind(&ctx, dir.path().join("p/s.sock")).unwrap();
            let addr = format!("unix:{}", l.path().display());
            (l, addr)
        };
        Some(Self { dir, ctx, listener, addr })
    }

    /// Starts the peer `role` of test `test`; returns it and its step marker.
    fn spawn(&self, test: &str, role: &str) -> (Child, PathBuf) {
        let step = self.dir.path().join(format!("{role}.step"));
        let _ = std::fs::remove_file(&step); // a marker of an earlier peer of the same role
        let env = [(ADDR_VAR, self.addr.clone()), (STEP_VAR, step.display().to_string())];
        (spawn_peer(test, role, &env), step)
    }

    fn accept(&self) -> Endpoint {
        let ep = self.listener.accept_timeout(Duration::from_secs(30)).expect("the peer connects");
        assert_eq!(ep.lane(), Lane::Ucx);
        ep
    }

    /// After the dead peer's endpoint is dropped, nothing of it remains.
    fn assert_forgot_the_dead(&self) {
        let settled = eventually(Duration::from_secs(5), || {
            let s = self.ctx.stats();
            s.endpoints == 0 && s.sends_in_flight == 0 && s.recvs_posted == 0 && s.unclaimed_bytes == 0
        });
        assert!(settled, "the survivor still holds state of the dead peer: {:?}", self.ctx.stats());
    }

    /// A new UCX peer connects, and verified messages go each way (inline, eager and
    /// rendezvous-sized frames).
    fn assert_serves_a_new_peer(&self) {
        let client_ctx = Context::new(config()).unwrap();
        let client = connect(&client_ctx, &self.addr);
        let server = self.accept();
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

/// A message with an inline, an eager and a rendezvous frame, and their checksums.
fn verified_message(seed: u64) -> (Message, Vec<u64>) {
    let frames: Vec<Vec<u8>> =
        [100, 20_000, 4 << 20].iter().enumerate().map(|(i, &n)| pattern(n, seed + i as u64)).collect();
    let sums = frames.iter().map(|f| checksum(f)).collect();
    (Message::new(b"verified".to_vec(), frames.into_iter().map(Frame::from).collect()), sums)
}

fn assert_peer_gone(error: &TransportError) {
    assert!(
        matches!(error, TransportError::PeerClosed { .. } | TransportError::PeerFailed { .. }),
        "expected the peer's death, got {error}"
    );
}

/// Waits for a receive to end, at most `bound`, and returns its error.
fn recv_fails_within(mut req: ferrylink::transport::RecvRequest, bound: Duration) -> TransportError {
    match req.wait_timeout(bound) {
        Some(Err(e)) => e.error,
        Some(Ok(m)) => panic!("a receive from a dead peer delivered a message (header {:?})", m.header),
        None => panic!("a receive from a dead peer still pending after {bound:?}"),
    }
}

/// The shape of the "a sending peer dies" cases: the peer reaches `role`'s step, the
/// survivor has receives pending (posted before the step, so they take the message as it
/// lands, and after it), the peer is killed; every receive ends with an error quickly and
/// nothing partial is delivered; the survivor serves a new peer.
fn sending_peer_dies(test: &str, role: &str, over_tcp: bool) {
    let _fds = shared_fds();
    let Some(s) = Survivor::new(over_tcp) else { return };
    let (mut child, step) = s.spawn(test, role);
    let ep = s.accept();
    let early = ep.recv();
    wait_for_step(&step, &mut child, Duration::from_secs(30), role);
    let late: Vec<_> = (0..2).map(|_| ep.recv()).collect();
    std::thread::sleep(Duration::from_millis(50));
    let killed = Instant::now();
    kill_peer(&mut child);
    for req in std::iter::once(early).chain(late) {
        assert_peer_gone(&recv_fails_within(req, DEATH_NOTICE));
    }
    assert!(killed.elapsed() < DEATH_NOTICE, "the survivor noticed the death after {:?}", killed.elapsed());
    // A request submitted after the death fails at once, and hands its message back.
    let err = ep.send(Message::new(vec![], vec![pattern(1000, 1).into()])).wait().unwrap_err();
    assert_peer_gone(&err.error);
    assert!(err.message.is_some(), "the failed send hands the message back");
    println!("{role}: every receive failed {:?} after the kill ({})", killed.elapsed(), err.error);
    drop(ep);
    s.assert_forgot_the_dead();
    s.assert_serves_a_new_peer();
}

/// The survivor sends a multi-frame message (plus queued ones); the peer (`role`) reads
/// its descriptor and stops at some step: the survivor's requests end with an error (after
/// the request timeout when the peer stays alive but silent), it serves a new peer.
fn receiving_peer_stops(test: &str, role: &str) {
    let _fds = shared_fds();
    let Some(s) = Survivor::new(false) else { return };
    let (mut child, step) = s.spawn(test, role);
    let ep = s.accept();
    let started = Instant::now();
    let mut send = ep.send(big_message());
    // Queued behind it: small messages (inline and eager frames, whose UCX sends complete
    // locally), which must come back on failure.
    let mut more: Vec<_> = (0..2)
        .map(|i| ep.send(Message::new(vec![], vec![pattern(100, i).into(), pattern(20_000, i).into()])))
        .collect();
    let recv = ep.recv();
    wait_for_step(&step, &mut child, Duration::from_secs(30), role);
    let killed = Instant::now();
    let bound = if role == "receiver-never-acks" {
        // Alive but silent: the survivor gives up after its request timeout.
        TIMEOUT + DEATH_NOTICE
    } else {
        kill_peer(&mut child);
        DEATH_NOTICE
    };
    let err = match send.wait_timeout(bound) {
        Some(Err(e)) => e,
        Some(Ok(_)) => panic!("a send completed without an acknowledgement"),
        None => panic!("a send to a stopped peer still pending after {bound:?}"),
    };
    assert_peer_gone(&err.error);
    if role == "receiver-never-acks" {
        assert!(err.error.to_string().contains("not acknowledged"), "{}", err.error);
        assert!(started.elapsed() >= TIMEOUT, "gave up after {:?}", started.elapsed());
    } else {
        assert!(killed.elapsed() < DEATH_NOTICE, "noticed after {:?}", killed.elapsed());
    }
    // A message whose UCX sends completed comes back; one UCX still held (a rendezvous
    // send the peer never matched) stays with the worker until UCX lets go of it
    // (documented on `NativeLane::fail_all`).
    let handed_back = err.message.is_some();
    if role == "receiver-never-acks" {
        assert!(handed_back, "the peer received every payload: the message comes back");
    }
    for req in more.iter_mut() {
        let e = req.wait_timeout(DEATH_NOTICE).expect("a queued send ends").unwrap_err();
        assert_peer_gone(&e.error);
        assert!(e.message.is_some(), "queued sends hand their message back");
    }
    assert_peer_gone(&recv_fails_within(recv, DEATH_NOTICE));
    println!(
        "{role}: the send failed after {:?} ({}); message handed back: {handed_back}",
        started.elapsed(),
        err.error
    );
    drop(ep);
    if role == "receiver-never-acks" {
        let status = wait_child(&mut child, Duration::from_secs(10));
        assert!(status.success(), "the silent peer saw the connection close: {status}");
    }
    s.assert_forgot_the_dead();
    s.assert_serves_a_new_peer();
}

// ---------------------------------------------------------------------------------------
// Peer failure at every step.

macro_rules! peer_test {
    ($name:ident, $body:expr) => {
        #[test]
        fn $name() {
            const T: &str = stringify!($name);
            if let Some(role) = peer_role(T) {
                return run_peer(&role);
            }
            if is_peer_process() {
                return;
            }
            ($body)(T)
        }
    };
}

peer_test!(ucx_killed_after_connect_before_any_message, |t| sending_peer_dies(t, "connected-idle", false));

peer_test!(ucx_killed_during_the_handshake, |t: &str| {
    let _fds = shared_fds();
    let Some(s) = Survivor::new(false) else { return };
    let (mut child, step) = s.spawn(t, "half-hello");
    wait_for_step(&step, &mut child, Duration::from_secs(30), "half a Hello");
    assert!(s.ctx.stats().endpoints >= 1, "the half-shaken connection is tracked");
    let killed = Instant::now();
    kill_peer(&mut child);
    assert!(eventually(DEATH_NOTICE, || s.ctx.stats().endpoints == 0), "{:?}", s.ctx.stats());
    assert!(killed.elapsed() < TIMEOUT, "dropped after {:?}", killed.elapsed());
    assert!(s.listener.accept_timeout(Duration::from_millis(100)).is_err(), "no endpoint from half a Hello");
    s.assert_forgot_the_dead();
    s.assert_serves_a_new_peer();
});

peer_test!(ucx_sender_killed_after_the_descriptor_before_any_payload, |t| {
    sending_peer_dies(t, "descriptor-then-nothing", false)
});

peer_test!(ucx_sender_killed_between_the_payloads_of_a_multi_frame_message, |t| {
    sending_peer_dies(t, "first-payload-then-death", false)
});

peer_test!(ucx_sender_killed_between_the_payloads_over_a_tcp_bootstrap, |t| {
    sending_peer_dies(t, "first-payload-then-death", true)
});

peer_test!(ucx_sender_killed_after_the_descriptor_over_a_tcp_bootstrap, |t| {
    sending_peer_dies(t, "descriptor-then-nothing", true)
});

/// A real ferrylink sender of three 64 MiB frames, killed as soon as its `send()` returned
/// (before `wait()`). Where the kill lands is a race (before the descriptor, mid-payload,
/// or after the message landed): every outcome must be whole-or-error, never partial.
fn real_sender_killed_mid_payload(t: &str, over_tcp: bool) {
    let _fds = shared_fds();
    let Some(s) = Survivor::new(over_tcp) else { return };
    let (mut child, step) = s.spawn(t, "real-sender");
    let ep = s.accept();
    let mut recv = ep.recv();
    wait_for_step(&step, &mut child, Duration::from_secs(30), "send() returned");
    let killed = Instant::now();
    kill_peer(&mut child);
    let outcome = match recv.wait_timeout(DEATH_NOTICE) {
        Some(Ok(msg)) => {
            verify_big(&msg);
            "landed whole before the kill"
        }
        Some(Err(e)) => {
            assert_peer_gone(&e.error);
            "failed"
        }
        None => panic!("a receive from a dead sender still pending after {DEATH_NOTICE:?}"),
    };
    assert_peer_gone(&recv_fails_within(ep.recv(), DEATH_NOTICE));
    assert!(killed.elapsed() < DEATH_NOTICE, "noticed after {:?}", killed.elapsed());
    println!("real sender killed mid-payload (tcp bootstrap: {over_tcp}): the receive {outcome}");
    drop(ep);
    s.assert_forgot_the_dead();
    s.assert_serves_a_new_peer();
}

peer_test!(ucx_real_sender_killed_mid_payload, |t| real_sender_killed_mid_payload(t, false));

peer_test!(ucx_real_sender_killed_mid_payload_over_a_tcp_bootstrap, |t| real_sender_killed_mid_payload(t, true));

peer_test!(ucx_receiver_killed_holding_the_descriptor_before_the_payloads, |t| {
    receiving_peer_stops(t, "receiver-holds-descriptor")
});

peer_test!(ucx_receiver_killed_after_the_payloads_before_acking, |t| receiving_peer_stops(
    t,
    "receiver-dies-before-ack"
));

peer_test!(ucx_receiver_that_never_acks_is_given_up_after_the_request_timeout, |t| {
    receiving_peer_stops(t, "receiver-never-acks")
});

/// A message that started landing before anyone received it counts as unclaimed bytes;
/// when its sender dies mid-payload it can never be received, so while the user still
/// holds the dead endpoint the count must drop back to 0.
#[test]
fn ucx_unclaimed_bytes_of_a_message_cut_short_are_released() {
    const T: &str = "ucx_unclaimed_bytes_of_a_message_cut_short_are_released";
    if let Some(role) = peer_role(T) {
        return run_peer(&role);
    }
    if is_peer_process() {
        return;
    }
    let _fds = shared_fds();
    let Some(s) = Survivor::new(false) else { return };
    let (mut child, step) = s.spawn(T, "first-payload-then-death");
    let ep = s.accept();
    // No receive posted: the message lands ahead of the user, as unclaimed bytes.
    wait_for_step(&step, &mut child, Duration::from_secs(30), "the first payload sent");
    assert!(s.ctx.stats().unclaimed_bytes >= (BIG_FRAMES * BIG) as u64, "{:?}", s.ctx.stats());
    kill_peer(&mut child);
    assert_peer_gone(&recv_fails_within(ep.recv(), DEATH_NOTICE));
    let released = eventually(Duration::from_secs(2), || s.ctx.stats().unclaimed_bytes == 0);
    assert!(released, "nothing can be received from the dead peer, yet {:?}", s.ctx.stats());
    drop(ep);
    s.assert_forgot_the_dead();
}

// ---------------------------------------------------------------------------------------
// No leaks.

/// What must return to the baseline (the cumulative CUDA IPC counters are not levels).
fn levels(s: ContextStats) -> ContextStats {
    ContextStats { ipc_mapping_opens: 0, ipc_handles_exported: 0, ..s }
}

/// The open fds once their count held still for 300 ms (bounded: 5 s), so that sockets
/// earlier tests' contexts were still closing are not counted in a baseline.
fn settled_fds() -> usize {
    let (mut last, mut since) = (open_fds(), Instant::now());
    eventually(Duration::from_secs(5), || {
        let now = open_fds();
        if now != last {
            (last, since) = (now, Instant::now());
        }
        since.elapsed() >= Duration::from_millis(300)
    });
    last
}

/// Waits (bounded) for the contexts' levels to equal the baseline and the open fds to be
/// no more than it.
fn assert_back_to_baseline(what: &str, contexts: &[&Context], baseline: &[ContextStats], fds: usize) {
    let settled = eventually(Duration::from_secs(10), || {
        contexts.iter().zip(baseline).all(|(c, b)| levels(c.stats()) == *b) && open_fds() <= fds
    });
    if !settled {
        let now: Vec<_> = contexts.iter().map(|c| levels(c.stats())).collect();
        panic!(
            "{what}: not back to the baseline\n  now:      {now:?} fds {}\n  baseline: {baseline:?} fds {fds}",
            open_fds()
        );
    }
}

/// One connect / send / echo / disconnect cycle between two contexts over UCX.
fn ucx_cycle(client: &Context, listener: &Listener, cycle: u64, rendezvous: &[u8], sum: u64) -> u64 {
    let ep = client.connect(listener.path()).expect("connect");
    let server_ep = listener.accept_timeout(Duration::from_secs(10)).expect("accept");
    assert_eq!(ep.lane(), Lane::Ucx);
    let mut frames: Vec<Frame> = vec![pattern(64, cycle).into(), pattern(20_000, cycle).into()];
    if cycle.is_multiple_of(4) {
        frames.push(rendezvous.to_vec().into());
    }
    let n = frames.len();
    ep.send(Message::new(cycle.to_le_bytes().to_vec(), frames)).wait().expect("send");
    let got = server_ep.recv().wait().expect("recv");
    assert_eq!(got.header, cycle.to_le_bytes());
    if n == 3 {
        assert_eq!(checksum(got.frames[2].as_host().unwrap().as_slice()), sum, "cycle {cycle}");
    }
    server_ep.send(got).wait().expect("echo");
    let back = ep.recv().wait().expect("echo recv");
    assert_eq!(back.frames.len(), n);
    if cycle.is_multiple_of(2) {
        drop(ep);
        drop(server_ep);
    } else {
        drop(server_ep);
        drop(ep);
    }
    2 * back.payload_len() as u64
}

#[test]
fn ucx_a_thousand_connect_send_disconnect_cycles_leave_nothing_behind() {
    if is_peer_process() {
        return;
    }
    let _fds = exclusive_fds();
    let Some(server) = ucx_context_or_skip_with(config()) else { return };
    let client = Context::new(config()).unwrap();
    let dir = socket_dir();
    let listener = Listener::bind(&server, dir.path().join("p/s.sock")).unwrap();
    let rendezvous = pattern(1 << 20, 99);
    let sum = checksum(&rendezvous);
    // UCX opens its transports' sockets lazily, on the first connection of a worker: the
    // baseline is taken after one warm-up cycle.
    ucx_cycle(&client, &listener, 0, &rendezvous, sum);
    let settled = eventually(Duration::from_secs(5), || server.stats().endpoints == 0 && client.stats().endpoints == 0);
    assert!(settled, "{:?} {:?}", server.stats(), client.stats());
    let fds = settled_fds();
    let baseline = [levels(server.stats()), levels(client.stats())];
    let started = Instant::now();
    let (mut bytes, mut peak_fds) = (0u64, fds);
    const CYCLES: u64 = 1000;
    for cycle in 1..=CYCLES {
        bytes += ucx_cycle(&client, &listener, cycle, &rendezvous, sum);
        peak_fds = peak_fds.max(open_fds());
    }
    let elapsed = started.elapsed();
    assert_back_to_baseline("after 1000 UCX cycles", &[&server, &client], &baseline, fds);
    println!(
        "{CYCLES} UCX connect/send/echo/disconnect cycles in {elapsed:.2?}: {} messages, {bytes} payload bytes; \
         fds {fds} before, peak {peak_fds}, {} after; stats back to {:?}",
        2 * CYCLES,
        open_fds(),
        baseline[0]
    );
}

#[test]
fn ucx_killed_peers_leave_nothing_behind() {
    const T: &str = "ucx_killed_peers_leave_nothing_behind";
    if let Some(role) = peer_role(T) {
        return run_peer(&role);
    }
    if is_peer_process() {
        return;
    }
    let _fds = exclusive_fds();
    let Some(s) = Survivor::new(false) else { return };
    // Warm-up: one served peer opens UCX's lazily created sockets.
    s.assert_serves_a_new_peer();
    assert!(eventually(Duration::from_secs(5), || s.ctx.stats().endpoints == 0));
    let baseline = [levels(s.ctx.stats())];
    let fds = settled_fds();
    const CRASHES: usize = 3;
    for round in 0..CRASHES {
        let (mut child, step) = s.spawn(T, "crasher");
        let ep = s.accept();
        let mut kept = Vec::new();
        for _ in 0..3 {
            kept.push(ep.recv().wait().expect("the peer's message"));
        }
        ep.send(Message::new(vec![], vec![pattern(500_000, 9).into()])).wait().expect("send");
        wait_for_step(&step, &mut child, Duration::from_secs(30), "holding everything");
        // A rendezvous send the dead peer never receives, and a receive, pending.
        let pending_send = ep.send(Message::new(vec![], vec![vec![1u8; BIG].into()]));
        let pending_recv = ep.recv();
        kill_peer(&mut child);
        if round % 2 == 0 {
            drop(ep);
            let _ = pending_send.wait();
            let _ = pending_recv.wait();
        } else {
            // The send may have been taken (and acknowledged) before the death; the
            // receive cannot have been answered.
            let _ = pending_send.wait();
            assert!(pending_recv.wait().is_err());
            drop(ep);
        }
        for (i, m) in kept.iter().enumerate() {
            assert_eq!(m.frames[1].as_host().unwrap().as_slice(), &pattern(2 << 20, i as u64)[..]);
        }
        drop(kept);
        assert_back_to_baseline(&format!("after UCX crash {}", round + 1), &[&s.ctx], &baseline, fds);
    }
    // Killed holding the descriptors of three 64 MiB rendezvous sends it never matched:
    // the frames stay with the UCX worker until UCX lets go of them, which must happen.
    let rss = resident_bytes();
    for round in 0..2 {
        let (mut child, step) = s.spawn(T, "receiver-holds-descriptor");
        let ep = s.accept();
        let send = ep.send(big_message());
        wait_for_step(&step, &mut child, Duration::from_secs(30), "holding the descriptor");
        kill_peer(&mut child);
        assert!(send.wait().is_err(), "round {round}: a send the dead peer never matched");
        drop(ep);
        assert_back_to_baseline(&format!("after UCX crash {}", CRASHES + round + 1), &[&s.ctx], &baseline, fds);
    }
    let released = eventually(Duration::from_secs(10), || resident_bytes() < rss + BIG as u64);
    assert!(
        released,
        "192 MiB of frames a dead peer never matched stay resident: {} MiB before, {} MiB now",
        rss >> 20,
        resident_bytes() >> 20
    );
    // And it still serves.
    s.assert_serves_a_new_peer();
    println!(
        "{} killed UCX peers: stats and fds back to the baseline after each ({fds} fds); resident {} MiB before \
         the unmatched rendezvous sends, {} MiB after",
        CRASHES + 2,
        rss >> 20,
        resident_bytes() >> 20
    );
}

// ---------------------------------------------------------------------------------------
// Load.

const LOAD_ENDPOINTS: usize = 32;
const LOAD_IN_FLIGHT: usize = 16;
const LOAD_SIZES: [usize; 6] = [0, 100, 8 << 10, 64 << 10, 256 << 10, 1 << 20];
const LOAD_BOUND: Duration = Duration::from_secs(60);

/// Message `m` of endpoint `e`: 1 to 3 frames stamped with their identity.
fn load_message(e: usize, m: usize, bases: &[Vec<u8>]) -> (Message, Vec<u64>) {
    let mut frames: Vec<Frame> = Vec::new();
    let mut sums = Vec::new();
    for f in 0..1 + (e + m) % 3 {
        let mut bytes = bases[(e * 7 + m * 3 + f) % LOAD_SIZES.len()].clone();
        let stamp = [(e as u32).to_le_bytes(), (m as u32).to_le_bytes(), (f as u32).to_le_bytes()].concat();
        let n = stamp.len().min(bytes.len());
        bytes[..n].copy_from_slice(&stamp[..n]);
        sums.push(checksum(&bytes));
        frames.push(bytes.into());
    }
    let header = [(e as u64).to_le_bytes(), (m as u64).to_le_bytes()].concat();
    (Message::new(header, frames), sums)
}

#[test]
fn ucx_thirty_two_endpoints_with_many_messages_in_flight_lose_and_corrupt_nothing() {
    const T: &str = "ucx_thirty_two_endpoints_with_many_messages_in_flight_lose_and_corrupt_nothing";
    if let Some(role) = peer_role(T) {
        return run_peer(&role);
    }
    if is_peer_process() {
        return;
    }
    let _fds = shared_fds();
    let Some(ctx) =
        ucx_context_or_skip_with(Config { request_timeout: LOAD_BOUND, connect_timeout: LOAD_BOUND, ..config() })
    else {
        return;
    };
    let dir = socket_dir();
    let listener = Listener::bind(&ctx, dir.path().join("p/s.sock")).unwrap();
    let mut child = spawn_peer(T, "echo-32", &[(ADDR_VAR, format!("unix:{}", listener.path().display()))]);
    let eps: Vec<Endpoint> =
        (0..LOAD_ENDPOINTS).map(|_| listener.accept_timeout(Duration::from_secs(30)).expect("connects")).collect();
    assert!(eps.iter().all(|ep| ep.lane() == Lane::Ucx));
    let bases: Vec<Vec<u8>> = LOAD_SIZES.iter().enumerate().map(|(i, &s)| pattern(s, 200 + i as u64)).collect();

    let started = Instant::now();
    let deadline = started + LOAD_BOUND;
    let remaining = || deadline.saturating_duration_since(Instant::now());
    let mut recvs: Vec<Vec<_>> = eps.iter().map(|ep| (0..LOAD_IN_FLIGHT).map(|_| ep.recv()).collect()).collect();
    let mut expected = std::collections::HashMap::new();
    let mut sends = Vec::new();
    let mut payload = 0u64;
    for m in 0..LOAD_IN_FLIGHT {
        for (e, ep) in eps.iter().enumerate() {
            let (message, sums) = load_message(e, m, &bases);
            payload += message.payload_len() as u64;
            sends.push(ep.send(message));
            expected.insert((e, m), sums);
        }
    }
    let peak = ctx.stats();
    let mut send_failures = 0;
    for mut s in sends {
        match s.wait_timeout(remaining()) {
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                eprintln!("send failed: {e}");
                send_failures += 1;
            }
            None => panic!("a send still pending after {LOAD_BOUND:?}"),
        }
    }
    let (mut received, mut lost, mut corrupted) = (0usize, 0usize, 0usize);
    for (e, per_ep) in recvs.iter_mut().enumerate() {
        for (m, r) in per_ep.iter_mut().enumerate() {
            let msg = match r.wait_timeout(remaining()) {
                Some(Ok(msg)) => msg,
                Some(Err(err)) => {
                    eprintln!("endpoint {e} message {m}: {err}");
                    lost += 1;
                    continue;
                }
                None => panic!("endpoint {e}: echo {m} still pending after {LOAD_BOUND:?}"),
            };
            received += 1;
            let id = (
                u64::from_le_bytes(msg.header[0..8].try_into().unwrap()) as usize,
                u64::from_le_bytes(msg.header[8..16].try_into().unwrap()) as usize,
            );
            let sums = &expected[&(e, m)];
            let peer_sums: Vec<u64> =
                msg.header[16..].chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
            let back_sums: Vec<u64> = msg.frames.iter().map(|f| checksum(f.as_host().unwrap().as_slice())).collect();
            if id != (e, m) || &peer_sums != sums || &back_sums != sums {
                eprintln!(
                    "endpoint {e} message {m}: got {id:?}, peer sums ok {}, echo ok {}",
                    &peer_sums == sums,
                    &back_sums == sums
                );
                corrupted += 1;
            }
        }
    }
    let elapsed = started.elapsed();
    for ep in &eps {
        ep.send(Message::new(b"stop".to_vec(), vec![])).wait().expect("stop");
    }
    let status = wait_child(&mut child, Duration::from_secs(30));
    assert!(status.success(), "echo peer: {status}");
    let total = LOAD_ENDPOINTS * LOAD_IN_FLIGHT;
    println!(
        "UCX load: {LOAD_ENDPOINTS} endpoints x {LOAD_IN_FLIGHT} messages in flight = {total} messages sent and echoed \
         ({:.1} MB payload each way) in {elapsed:.2?}: {:.0} messages/s, {:.3} GB/s both ways together; \
         peak {} sends in flight, {} receives posted",
        payload as f64 / 1e6,
        2.0 * total as f64 / elapsed.as_secs_f64(),
        2.0 * payload as f64 / elapsed.as_secs_f64() / 1e9,
        peak.sends_in_flight,
        peak.recvs_posted,
    );
    println!("UCX load: {received} of {total} echoes received: {lost} lost, {corrupted} corrupted, {send_failures} failed sends");
    assert_eq!((received, lost, corrupted, send_failures), (total, 0, 0, 0));
    drop(eps);
    assert!(eventually(Duration::from_secs(5), || ctx.stats().endpoints == 0), "{:?}", ctx.stats());
}
