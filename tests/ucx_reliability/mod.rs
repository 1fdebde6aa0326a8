//! What the UCX reliability tests (`reliability_ucx.rs`: peer failure at every step;
//! `reliability_ucx_load.rs`: no leaks, load) share: their peers (re-executed children,
//! by role: [`run_peer`]) and the survivor's side.
#![allow(dead_code)]

use crate::common::*;
use ferrylink::transport::wire::{DataMessage, FrameDescriptor, WireMessage};
use ferrylink::transport::{Config, Context, Endpoint, LaneKind, LanePolicy, Listener, TransportError};
use ferrylink::{Frame, Message};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

pub const ADDR_VAR: &str = "FERRYLINK_TEST_ADDR";
/// The step a peer reports ([`reached`]) before it waits to be killed.
pub const STEP: &str = "the step";
/// The request timeout of both sides.
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// A peer's death must reach the survivor's pending requests within the request timeout.
pub const DEATH_NOTICE: Duration = TIMEOUT;
/// A payload frame large enough for UCX's rendezvous protocol.
pub const BIG: usize = 64 << 20;
/// Frames of the raw peers' multi-frame message: one inline, then three payloads of `BIG`.
pub const BIG_FRAMES: usize = 3;
/// The load: endpoints, messages in flight on each, frame sizes, bound.
pub const LOAD_ENDPOINTS: usize = 32;
pub const LOAD_IN_FLIGHT: usize = 16;
pub const LOAD_SIZES: [usize; 6] = [0, 100, 8 << 10, 64 << 10, 256 << 10, 1 << 20];
pub const LOAD_BOUND: Duration = Duration::from_secs(60);

pub fn config() -> Config {
    Config::default().with_lane_policy(LanePolicy::Ucx).with_request_timeout(TIMEOUT).with_connect_timeout(TIMEOUT)
}

/// Open fds are process-wide: the leak tests run alone (write), the others together (read).
pub static FDS: RwLock<()> = RwLock::new(());

pub fn shared_fds() -> RwLockReadGuard<'static, ()> {
    FDS.read().unwrap_or_else(|e| e.into_inner())
}

pub fn exclusive_fds() -> RwLockWriteGuard<'static, ()> {
    FDS.write().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------------------
// The peers (re-executed children).

pub fn env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("{var} is set for peers"))
}

/// Reports the step, then waits to be killed (bounded: a peer never outlives a test).
pub fn reached_step_wait_for_death() -> ! {
    reached(STEP);
    std::thread::sleep(Duration::from_secs(60));
    std::process::exit(3)
}

/// Same, keeping a raw peer's worker progressing meanwhile.
pub fn raw_reached_step_wait_for_death(raw: &mut RawUcxPeer) -> ! {
    reached(STEP);
    raw.idle(Duration::from_secs(60));
    std::process::exit(3)
}

/// A raw peer that stays alive and silent: the survivor must close the connection once
/// its request timeout passes.
fn survivor_closes_after_its_timeout(raw: &mut RawUcxPeer) {
    let started = Instant::now();
    while raw.read_message(TIMEOUT * 4).is_some() {}
    assert!(started.elapsed() < TIMEOUT * 3, "the survivor kept the connection for {:?}", started.elapsed());
}

pub fn connect(ctx: &Context, addr: &str) -> Endpoint {
    match addr.split_once(':') {
        Some(("unix", path)) => ctx.connect(path).expect("connect"),
        Some(("tcp", hostport)) => ctx.connect_tcp(hostport).expect("connect over TCP"),
        _ => panic!("bad address {addr}"),
    }
}

/// The raw peers' multi-frame message: an inline frame, then `BIG_FRAMES` payloads.
pub fn big_descriptor(seq: u64) -> DataMessage {
    let mut frames = vec![FrameDescriptor::Inline(pattern(100, seq))];
    frames.extend((0..BIG_FRAMES).map(|_| FrameDescriptor::Remote { len: BIG as u64, device: false, chunk: 0 }));
    DataMessage { seq, header: b"big".to_vec(), frames }
}

/// Payload `i` (frame `i + 1`) of the multi-frame message: cheap to make and to compare.
pub fn big_payload(i: usize) -> Vec<u8> {
    vec![0xA0 + i as u8; BIG]
}

/// A message of `BIG_FRAMES` large frames (what a real sending peer sends).
pub fn big_message() -> Message {
    Message::new(b"big".to_vec(), (0..BIG_FRAMES).map(|i| big_payload(i).into()).collect())
}

/// A delivered big message is whole.
pub fn verify_big(msg: &Message) {
    assert_eq!(msg.header, b"big");
    assert_eq!(msg.frames.len(), BIG_FRAMES);
    for (i, f) in msg.frames.iter().enumerate() {
        assert!(f.as_host().unwrap().as_slice() == &big_payload(i)[..], "big frame {i} intact");
    }
}

/// Connections the "takes-one-and-leaves" peer makes.
pub const LEAVING_ROUNDS: usize = 50;

/// The peers of the UCX reliability tests, by role.
pub fn run_peer(role: &str) {
    let addr = env(ADDR_VAR);
    match role {
        // A real endpoint, connected over UCX, that never says anything.
        "connected-idle" => {
            let ctx = Context::new(config()).unwrap();
            let ep = connect(&ctx, &addr);
            assert_eq!(ep.lane(), LaneKind::Ucx);
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
        // nothing: the message is cut in the middle. Killed ("first-payload-then-death"),
        // or alive and silent until the survivor gives the message up.
        "first-payload-then-death" | "first-payload-then-stall" => {
            let mut raw = RawUcxPeer::handshaken(&addr);
            raw.write(&WireMessage::Data(big_descriptor(0)));
            raw.send_payload(0, 1, big_payload(0), Duration::from_secs(20));
            if role == "first-payload-then-death" {
                raw_reached_step_wait_for_death(&mut raw);
            }
            reached(STEP);
            survivor_closes_after_its_timeout(&mut raw);
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
            reached(STEP);
            survivor_closes_after_its_timeout(&mut raw);
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
        // Connects [`LEAVING_ROUNDS`] times, each with a new context: takes one message,
        // then closes at once (the survivor's UCX endpoint fails as the `Ack` arrives).
        "takes-one-and-leaves" => {
            for _ in 0..LEAVING_ROUNDS {
                let ctx = Context::new(config()).unwrap();
                let ep = connect(&ctx, &addr);
                assert_eq!(ep.recv().wait().expect("the survivor's message").header, b"bye");
                drop(ep);
                drop(ctx);
            }
        }
        "echo-32" => echo_peer(&addr, LOAD_ENDPOINTS),
        other => panic!("unknown role {other}"),
    }
}

/// Reads control messages until the survivor's `Data` descriptor.
pub fn wait_for_data(raw: &mut RawUcxPeer) -> DataMessage {
    loop {
        match raw.read_message(Duration::from_secs(20)) {
            Some(WireMessage::Data(d)) => return d,
            Some(_) => continue,
            None => panic!("the survivor's data message never came"),
        }
    }
}

/// `endpoints` endpoints, each echoing every message (the kit's echo: the header, then
/// the checksums of its frames), until "stop".
pub fn echo_peer(addr: &str, endpoints: usize) {
    let ctx = Context::new(config().with_request_timeout(LOAD_BOUND).with_connect_timeout(LOAD_BOUND)).unwrap();
    let eps: Vec<Endpoint> = (0..endpoints).map(|_| connect(&ctx, addr)).collect();
    echo::serve_all(&Ferry, &eps);
}

// ---------------------------------------------------------------------------------------
// The survivor.

pub struct Survivor {
    _dir: tempfile::TempDir,
    pub ctx: Context,
    pub listener: Listener,
    pub addr: String,
}

impl Survivor {
    /// A UCX context listening on a Unix socket or on TCP loopback; `None`: skipped.
    pub fn new(over_tcp: bool) -> Option<Self> {
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
        Some(Self { _dir: dir, ctx, listener, addr })
    }

    /// Starts the peer `role`.
    pub fn spawn(&self, peers: &Peers, role: &str) -> Peer {
        peers.spawn(role, &[(ADDR_VAR, self.addr.clone())])
    }

    pub fn accept(&self) -> Endpoint {
        let ep = self.listener.accept_timeout(Duration::from_secs(30)).expect("the peer connects");
        assert_eq!(ep.lane(), LaneKind::Ucx);
        ep
    }

    /// After the dead peer's endpoint is dropped, nothing of it remains.
    pub fn assert_forgot_the_dead(&self) {
        let settled = eventually(Duration::from_secs(5), || {
            let s = self.ctx.stats().unwrap();
            s.endpoints == 0 && s.sends_in_flight == 0 && s.recvs_posted == 0 && s.unclaimed_bytes == 0
        });
        assert!(settled, "the survivor still holds state of the dead peer: {:?}", self.ctx.stats());
    }

    /// A new UCX peer connects, and verified messages go each way (inline, eager and
    /// rendezvous-sized frames).
    pub fn assert_serves_a_new_peer(&self) {
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
pub fn verified_message(seed: u64) -> (Message, Vec<u64>) {
    let frames: Vec<Vec<u8>> =
        [100, 20_000, 4 << 20].iter().enumerate().map(|(i, &n)| pattern(n, seed + i as u64)).collect();
    let sums = frames.iter().map(|f| checksum(f)).collect();
    (Message::new(b"verified".to_vec(), frames.into_iter().map(Frame::from).collect()), sums)
}

pub fn assert_peer_gone(error: &TransportError) {
    assert!(
        matches!(error, TransportError::PeerClosed { .. } | TransportError::PeerFailed { .. }),
        "expected the peer's death, got {error}"
    );
}

/// Waits for a receive to end, at most `bound`, and returns its error.
pub fn recv_fails_within(mut req: ferrylink::transport::RecvRequest, bound: Duration) -> TransportError {
    match req.wait_timeout(bound) {
        Some(Err(e)) => e.error,
        Some(Ok(m)) => panic!("a receive from a dead peer delivered a message (header {:?})", m.header),
        None => panic!("a receive from a dead peer still pending after {bound:?}"),
    }
}
